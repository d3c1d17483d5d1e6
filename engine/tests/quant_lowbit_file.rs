//! A GGUF holding Q2_K, Q3_K, IQ4_NL and IQ4_XS tensors (the random blocks
//! of fixtures/quant, which no test model stores) opens, and its tensors
//! decode to the gguf package's values and multiply like the dequantized
//! rows; a row that is not whole blocks of such a type is refused at open.

mod gguf_writer;

use gguf_writer::{GgufBuilder, TensorSpec};
use offgraph_kv_engine::gguf::{GgufFile, Value};
use offgraph_kv_engine::quant::{dequantize_row, matmul_with_isa, QMatrix, QuantIsa};
use offgraph_kv_engine::{EngineError, GgmlType};
use std::path::Path;

const LOWBIT: [(&str, GgmlType); 4] = [
    ("q2_k", GgmlType::Q2_K),
    ("q3_k", GgmlType::Q3_K),
    ("iq4_nl", GgmlType::IQ4_NL),
    ("iq4_xs", GgmlType::IQ4_XS),
];

fn u32_at(b: &[u8], i: usize) -> usize {
    u32::from_le_bytes(b[i..i + 4].try_into().unwrap()) as usize
}

/// (type id, rows, cols, raw blocks, gguf's values) of a fixture file.
fn fixture(name: &str) -> (u32, usize, usize, Vec<u8>, Vec<f32>) {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(format!("tests/fixtures/quant/random_{name}.bin"));
    let b = std::fs::read(&p).unwrap();
    assert_eq!(&b[..4], b"OKVQ");
    let (id, rows, cols) = (u32_at(&b, 8) as u32, u32_at(&b, 12), u32_at(&b, 16));
    let rb = GgmlType::from_id(id)
        .unwrap()
        .row_bytes(cols as u64)
        .unwrap() as usize;
    let raw = b[20..20 + rows * rb].to_vec();
    let want = b[20 + rows * rb..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    (id, rows, cols, raw, want)
}

#[test]
fn lowbit_tensors_open_decode_and_multiply() {
    let mut b = GgufBuilder::default().kv("general.architecture", Value::String("x".into()));
    let mut fx = Vec::new();
    for (name, ty) in LOWBIT {
        let (id, rows, cols, raw, want) = fixture(name);
        assert_eq!(id, ty.id());
        b = b.tensor(TensorSpec::new(
            &format!("{name}.weight"),
            &[cols as u64, rows as u64],
            id,
            raw,
        ));
        fx.push((name, ty, rows, cols, want));
    }
    let f = GgufFile::from_bytes(b.build().bytes).expect("a file of low-bit tensors opens");
    let mut isas = vec![QuantIsa::Portable];
    if offgraph_kv::cpu::features().avx2 {
        isas.push(QuantIsa::Avx2);
    }
    if offgraph_kv::cpu::features().avx512_vnni() {
        isas.push(QuantIsa::Avx512Vnni);
    }
    for (name, ty, rows, cols, want) in fx {
        let t = f.tensor(&format!("{name}.weight")).unwrap();
        assert_eq!(t.info.ty, ty);
        let w = QMatrix::new(ty, rows, cols, t.data).unwrap();
        let mut dense = vec![f32::NAN; rows * cols];
        for (r, o) in dense.chunks_exact_mut(cols).enumerate() {
            dequantize_row(ty, w.row(r).unwrap(), o).unwrap();
        }
        let same = dense
            .iter()
            .zip(&want)
            .all(|(g, w)| g.to_bits() == w.to_bits());
        assert!(same, "{name}: decoding differs from gguf's");
        // x: small exact values, so the activation rounding is the only error.
        let x: Vec<f32> = (0..cols)
            .map(|c| ((c * 7919) % 255) as f32 / 127.0 - 1.0)
            .collect();
        for &isa in &isas {
            let mut out = vec![0f32; rows];
            matmul_with_isa(isa, &w, &x, 1, &mut out, 1).unwrap();
            for (r, got) in out.iter().enumerate() {
                let wr = &dense[r * cols..(r + 1) * cols];
                let exact: f64 = wr
                    .iter()
                    .zip(&x)
                    .map(|(w, x)| f64::from(*w) * f64::from(*x))
                    .sum();
                // |x| ≤ 1 a block: d ≤ 1/127, rounding at most d/2 a value.
                let bound: f64 =
                    wr.iter().map(|w| f64::from(w.abs()) / 254.0).sum::<f64>() * 1.001 + 1e-4;
                assert!(
                    (f64::from(*got) - exact).abs() <= bound,
                    "{name} {isa:?} row {r}: {got} vs {exact} (bound {bound})"
                );
            }
        }
    }
}

#[test]
fn a_row_of_partial_lowbit_blocks_is_refused_at_open() {
    for (name, ty) in LOWBIT {
        let b = GgufBuilder::default()
            .kv("general.architecture", Value::String("x".into()))
            .tensor(TensorSpec::new(
                "bad.weight",
                &[ty.block_len() as u64 / 2, 2],
                ty.id(),
                vec![0u8; ty.block_bytes()],
            ));
        match GgufFile::from_bytes(b.build().bytes) {
            Err(EngineError::Format(m)) => assert!(m.contains(ty.name()), "{name}: {m}"),
            other => panic!(
                "{name}: expected a Format error, got {:?}",
                other.map(|_| ())
            ),
        }
    }
}
