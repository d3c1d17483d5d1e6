//! Dequantization against the gguf package's decoding of real model rows and
//! random blocks (fixtures/quant, written by fixtures/make_quant_fixture.py):
//! bit-for-bit in f32, every type either model stores and the other block types.

use offgraph_kv_engine::quant::dequantize_row;
use offgraph_kv_engine::{EngineError, GgmlType};
use std::path::Path;

struct Fixture {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    raw: Vec<u8>,
    want: Vec<f32>,
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes(b[i..i + 4].try_into().unwrap())
}

fn load(path: &Path) -> Fixture {
    let b = std::fs::read(path).unwrap();
    assert_eq!(&b[..4], b"OKVQ", "{}", path.display());
    assert_eq!(u32_at(&b, 4), 1);
    let ty = GgmlType::from_id(u32_at(&b, 8)).unwrap();
    let (rows, cols) = (u32_at(&b, 12) as usize, u32_at(&b, 16) as usize);
    let rb = ty.row_bytes(cols as u64).unwrap() as usize;
    let raw = b[20..20 + rows * rb].to_vec();
    let vals = &b[20 + rows * rb..];
    assert_eq!(vals.len(), rows * cols * 4, "{}", path.display());
    let want = vals
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    Fixture {
        ty,
        rows,
        cols,
        raw,
        want,
    }
}

#[test]
fn dequantize_matches_gguf_bit_for_bit() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/quant");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let mut types = std::collections::HashSet::new();
    let mut values = 0usize;
    for p in &files {
        let f = load(p);
        let rb = f.ty.row_bytes(f.cols as u64).unwrap() as usize;
        for r in 0..f.rows {
            let mut out = vec![f32::NAN; f.cols];
            dequantize_row(f.ty, &f.raw[r * rb..(r + 1) * rb], &mut out).unwrap();
            for (c, (g, w)) in out
                .iter()
                .zip(&f.want[r * f.cols..(r + 1) * f.cols])
                .enumerate()
            {
                assert_eq!(
                    g.to_bits(),
                    w.to_bits(),
                    "{} row {r} col {c}: {g} vs {w}",
                    p.display()
                );
            }
            values += f.cols;
        }
        types.insert(f.ty);
    }
    println!(
        "{} fixtures, {} types, {values} values bit-identical",
        files.len(),
        types.len()
    );
    for t in [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::IQ4_NL,
        GgmlType::IQ4_XS,
    ] {
        assert!(types.contains(&t), "no fixture for {t:?}");
    }
}

#[test]
fn q8_k_rows_decode_as_d_times_q() {
    // The gguf package has no Q8_K decoder: {f32 d, 256 i8, 16 i16 sums}.
    let mut b = vec![0u8; 292];
    b[..4].copy_from_slice(&0.5f32.to_le_bytes());
    for i in 0..256 {
        b[4 + i] = (i as i8).wrapping_sub(100) as u8;
    }
    let mut out = vec![0f32; 256];
    dequantize_row(GgmlType::Q8_K, &b, &mut out).unwrap();
    for (i, v) in out.iter().enumerate() {
        assert_eq!(*v, 0.5 * f32::from((i as i8).wrapping_sub(100)));
    }
}

#[test]
fn bad_rows_are_refused_and_out_untouched() {
    let mut out = vec![7f32; 64];
    let e = dequantize_row(GgmlType::Q8_0, &[0u8; 67], &mut out).unwrap_err();
    assert!(matches!(e, EngineError::InvalidArgument(_)), "{e}");
    let mut odd = vec![7f32; 40];
    let e = dequantize_row(GgmlType::Q4_0, &[0u8; 18], &mut odd).unwrap_err();
    assert!(matches!(e, EngineError::Format(_)), "{e}");
    assert!(out.iter().chain(&odd).all(|v| *v == 7.0));
}
