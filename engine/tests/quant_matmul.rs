//! Quantized matmuls against a float64 reference over the dequantized
//! weights, for every weight type, batch sizes 1/3/17/64, 1 and 2 threads,
//! the portable and AVX2 kernels; matmul_many against separate calls; and
//! refused arguments leaving the output untouched.
//!
//! The bound: the integer dot is exact for the quantized activations, so the
//! only approximation is activation rounding, |x̂ − x| ≤ d/2 per value with
//! d = max|x| / 127 of its block (32 values, or 256 for the K types). Hence
//! |y − y_ref| ≤ Σ_c |W[r,c]| · d(c) / 2 (+ float summation slack, taken as
//! 1e-5 · Σ|W||x|). Float weights only have the slack.

mod common;

use offgraph_kv_engine::quant::{
    dequantize_row, matmul, matmul_many, matmul_many_with_isa, matmul_with_isa, QMatrix, QuantIsa,
};
use offgraph_kv_engine::{EngineError, GgmlType};

const ALL: [GgmlType; 16] = [
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
    GgmlType::Q8_K,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
];

use common::Rng;

fn f16_bits(v: f32) -> [u8; 2] {
    // Round-to-nearest is not needed: any finite f16 near v will do.
    let b = v.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let e = ((b >> 23) & 0xff) as i32 - 127 + 15;
    let h = if v == 0.0 || e <= 0 {
        sign
    } else {
        sign | ((e as u16) << 10) | ((b >> 13) & 0x3ff) as u16
    };
    h.to_le_bytes()
}

/// Random blocks of `ty` with finite, modest scales.
pub fn weight(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let mut r = Rng(seed);
    let rb = ty.row_bytes(cols as u64).unwrap() as usize;
    let mut data: Vec<u8> = (0..rows * rb).map(|_| r.next() as u8).collect();
    let bb = ty.block_bytes();
    for blk in data.chunks_exact_mut(bb) {
        let mut put = |off: usize, v: f32| blk[off..off + 2].copy_from_slice(&f16_bits(v));
        match ty {
            GgmlType::F32 => blk.copy_from_slice(&r.unit().to_le_bytes()),
            GgmlType::F16 => put(0, r.unit()),
            GgmlType::BF16 => {
                blk.copy_from_slice(&((r.unit().to_bits() >> 16) as u16).to_le_bytes())
            }
            GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::IQ4_NL => {
                put(0, 0.01 + 0.02 * r.unit().abs())
            }
            GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => {
                put(0, 0.01 + 0.02 * r.unit().abs());
                put(2, 0.02 * r.unit());
            }
            GgmlType::Q6_K => put(208, 0.001 + 0.002 * r.unit().abs()),
            GgmlType::Q2_K => {
                put(80, 0.01 + 0.02 * r.unit().abs());
                put(82, 0.02 * r.unit());
            }
            GgmlType::Q3_K => put(108, 0.001 + 0.002 * r.unit().abs()),
            GgmlType::IQ4_XS => put(0, 0.0001 + 0.0002 * r.unit().abs()),
            GgmlType::Q8_K => {
                blk[..4].copy_from_slice(&(0.001f32 + 0.002 * r.unit().abs()).to_le_bytes())
            }
        }
    }
    data
}

fn input(n: usize, cols: usize, seed: u64) -> Vec<f32> {
    let mut r = Rng(seed);
    // Mostly small values with a few large ones per row, as activations have.
    (0..n * cols)
        .map(|i| {
            if i % 97 == 5 {
                8.0 * r.unit()
            } else {
                r.unit()
            }
        })
        .collect()
}

fn dense(w: &QMatrix) -> Vec<f32> {
    let rb = w.ty.row_bytes(w.cols as u64).unwrap() as usize;
    let mut out = vec![0f32; w.rows * w.cols];
    for r in 0..w.rows {
        dequantize_row(
            w.ty,
            &w.data[r * rb..(r + 1) * rb],
            &mut out[r * w.cols..(r + 1) * w.cols],
        )
        .unwrap();
    }
    out
}

/// The reference and the error bound for every (token, row).
fn reference(
    ty: GgmlType,
    wd: &[f32],
    rows: usize,
    cols: usize,
    x: &[f32],
    n: usize,
) -> (Vec<f64>, Vec<f64>) {
    let blk = match ty {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 0,
        GgmlType::Q2_K
        | GgmlType::Q3_K
        | GgmlType::Q4_K
        | GgmlType::Q5_K
        | GgmlType::Q6_K
        | GgmlType::Q8_K
        | GgmlType::IQ4_XS => 256,
        _ => 32,
    };
    let (mut y, mut bound) = (vec![0f64; n * rows], vec![0f64; n * rows]);
    for t in 0..n {
        let xt = &x[t * cols..(t + 1) * cols];
        let half_d: Vec<f64> = (0..cols)
            .map(|c| {
                if blk == 0 {
                    return 0.0;
                }
                let b = c / blk * blk;
                xt[b..b + blk]
                    .iter()
                    .fold(0f64, |m, v| m.max(v.abs() as f64))
                    / 127.0
                    / 2.0
            })
            .collect();
        for r in 0..rows {
            let wr = &wd[r * cols..(r + 1) * cols];
            let (mut s, mut q, mut mag) = (0f64, 0f64, 0f64);
            for c in 0..cols {
                s += wr[c] as f64 * xt[c] as f64;
                q += (wr[c] as f64).abs() * half_d[c];
                mag += (wr[c] as f64 * xt[c] as f64).abs();
            }
            y[t * rows + r] = s;
            bound[t * rows + r] = q * 1.001 + 1e-5 * mag + 1e-6;
        }
    }
    (y, bound)
}

fn isas() -> Vec<QuantIsa> {
    let mut v = vec![QuantIsa::Portable, QuantIsa::Auto];
    if cpu_has_avx2() {
        v.push(QuantIsa::Avx2);
    }
    if cpu_has_vnni() {
        v.push(QuantIsa::Avx512Vnni);
    }
    v
}

/// The CPU has what the VNNI kernels are compiled for (the engine's own check).
fn cpu_has_vnni() -> bool {
    offgraph_kv::cpu::features().avx512_vnni()
}

/// The VNNI kernels compute the same integer dots as AVX2 with the same
/// scales; only the f32 summation order differs (rows taken two at a time,
/// offsets folded into the int32 start, blocks two a register, and batched
/// calls of the 32-value types 16 rows a register: `vnni_lanes`).
#[test]
fn vnni_and_avx2_agree_closely() {
    if !cpu_has_vnni() {
        let e = matmul_with_isa(
            QuantIsa::Avx512Vnni,
            &QMatrix::new(GgmlType::F32, 1, 8, &[0; 32]).unwrap(),
            &[0.0; 8],
            1,
            &mut [0.0],
            1,
        );
        assert!(matches!(e, Err(EngineError::Unsupported(_))));
        return;
    }
    let mut checked = 0usize;
    // 37 rows: two groups of 16 for the lanes kernels and a tail of 5 for
    // the per-row ones (pairs and a single); n 1 takes the matvec pass; 2,
    // 3, 5 and 29 tokens the lanes kernels' chunks of 16, 8, 4, 3, 2 and 1.
    for (rows, cols) in [(37usize, 768usize), (9, 256)] {
        for (i, ty) in ALL.into_iter().enumerate() {
            let data = weight(ty, rows, cols, 900 + i as u64);
            let w = QMatrix::new(ty, rows, cols, &data).unwrap();
            for n in [1usize, 2, 3, 5, 29] {
                let x = input(n, cols, 13);
                let (mut v, mut a) = (vec![0f32; n * rows], vec![0f32; n * rows]);
                matmul_with_isa(QuantIsa::Avx512Vnni, &w, &x, n, &mut v, 1).unwrap();
                matmul_with_isa(QuantIsa::Avx2, &w, &x, n, &mut a, 1).unwrap();
                let scale = a.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-3);
                for (k, (v, a)) in v.iter().zip(&a).enumerate() {
                    assert!(
                        (v - a).abs() <= 2e-5 * scale,
                        "{ty:?} {rows}x{cols} n={n} [{k}]: vnni {v} avx2 {a}"
                    );
                    checked += 1;
                }
            }
        }
    }
    // The 32-value types' batched pass takes blocks two at a time: an odd
    // block count (800 = 25 blocks) leaves a last single block; 9 tokens are
    // two chunks of four and a tail of one, 37 rows pairs and a tail.
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q8_0,
    ] {
        let (rows, cols, n) = (37usize, 800usize, 9usize);
        let data = weight(ty, rows, cols, 77);
        let w = QMatrix::new(ty, rows, cols, &data).unwrap();
        let x = input(n, cols, 21);
        let (mut v, mut a) = (vec![0f32; n * rows], vec![0f32; n * rows]);
        matmul_with_isa(QuantIsa::Avx512Vnni, &w, &x, n, &mut v, 1).unwrap();
        matmul_with_isa(QuantIsa::Avx2, &w, &x, n, &mut a, 1).unwrap();
        let scale = a.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-3);
        for (k, (v, a)) in v.iter().zip(&a).enumerate() {
            assert!(
                (v - a).abs() <= 2e-5 * scale,
                "{ty:?} {rows}x{cols} n={n} [{k}]: vnni {v} avx2 {a}"
            );
            checked += 1;
        }
    }
    println!("{checked} vnni outputs agree with avx2");
}

/// The CPU has what the AVX2 kernels are compiled for.
fn cpu_has_avx2() -> bool {
    offgraph_kv::cpu::features().avx2_fma_f16c()
}

#[test]
fn every_type_matches_the_reference_within_the_activation_bound() {
    let (rows, cols) = (150, 512);
    let mut checked = 0usize;
    let mut worst = 0f64;
    for (i, ty) in ALL.into_iter().enumerate() {
        let data = weight(ty, rows, cols, 11 + i as u64);
        let w = QMatrix::new(ty, rows, cols, &data).unwrap();
        let wd = dense(&w);
        let x = input(64, cols, 99);
        let (yref, bound) = reference(ty, &wd, rows, cols, &x, 64);
        for n in [1usize, 3, 17, 64] {
            for threads in [1usize, 2] {
                for isa in isas() {
                    let mut out = vec![f32::NAN; n * rows + 5];
                    matmul_with_isa(isa, &w, &x, n, &mut out, threads).unwrap();
                    for t in 0..n {
                        for r in 0..rows {
                            let (g, e, b) = (
                                out[t * rows + r] as f64,
                                yref[t * rows + r],
                                bound[t * rows + r],
                            );
                            assert!(
                                (g - e).abs() <= b,
                                "{ty:?} {isa:?} n={n} threads={threads} t={t} r={r}: {g} vs {e}, bound {b}"
                            );
                            worst = worst.max((g - e).abs() / b);
                            checked += 1;
                        }
                    }
                    assert!(
                        out[n * rows..].iter().all(|v| v.is_nan()),
                        "{ty:?}: wrote past n*rows"
                    );
                }
            }
        }
    }
    println!("{checked} outputs within the bound; worst error/bound {worst:.3}");
}

#[test]
fn avx2_and_portable_agree_closely() {
    if !cpu_has_avx2() {
        let e = matmul_with_isa(
            QuantIsa::Avx2,
            &QMatrix::new(GgmlType::F32, 1, 8, &[0; 32]).unwrap(),
            &[0.0; 8],
            1,
            &mut [0.0],
            1,
        );
        assert!(matches!(e, Err(EngineError::Unsupported(_))));
        return;
    }
    let (rows, cols) = (33, 768);
    for (i, ty) in ALL.into_iter().enumerate() {
        let data = weight(ty, rows, cols, 500 + i as u64);
        let w = QMatrix::new(ty, rows, cols, &data).unwrap();
        let x = input(5, cols, 7);
        let (mut a, mut p) = (vec![0f32; 5 * rows], vec![0f32; 5 * rows]);
        matmul_with_isa(QuantIsa::Avx2, &w, &x, 5, &mut a, 1).unwrap();
        matmul_with_isa(QuantIsa::Portable, &w, &x, 5, &mut p, 1).unwrap();
        let scale = p.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-3);
        for (k, (a, p)) in a.iter().zip(&p).enumerate() {
            assert!(
                (a - p).abs() <= 2e-5 * scale,
                "{ty:?} [{k}]: avx2 {a} portable {p}"
            );
        }
    }
}

#[test]
fn float_rows_need_not_be_a_multiple_of_eight() {
    let (rows, cols) = (4, 13);
    for ty in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
        let data = weight(ty, rows, cols, 3);
        let w = QMatrix::new(ty, rows, cols, &data).unwrap();
        let wd = dense(&w);
        let x = input(3, cols, 4);
        let (yref, bound) = reference(ty, &wd, rows, cols, &x, 3);
        for isa in isas() {
            let mut out = vec![0f32; 3 * rows];
            matmul_with_isa(isa, &w, &x, 3, &mut out, 1).unwrap();
            for k in 0..out.len() {
                assert!(
                    (out[k] as f64 - yref[k]).abs() <= bound[k],
                    "{ty:?} {isa:?} [{k}]"
                );
            }
        }
    }
}

#[test]
fn matmul_many_equals_separate_matmuls() {
    // Gemma's attention input: q and k Q5_0, v Q8_0 or Q6_K; one Q4_K too.
    let cols = 512;
    let shapes = [
        (GgmlType::Q5_0, 64),
        (GgmlType::Q5_0, 16),
        (GgmlType::Q8_0, 16),
        (GgmlType::Q6_K, 16),
        (GgmlType::Q4_K, 40),
        (GgmlType::F32, 3),
    ];
    let datas: Vec<Vec<u8>> = shapes
        .iter()
        .enumerate()
        .map(|(i, &(t, r))| weight(t, r, cols, 70 + i as u64))
        .collect();
    let ws: Vec<QMatrix> = shapes
        .iter()
        .zip(&datas)
        .map(|(&(t, r), d)| QMatrix::new(t, r, cols, d).unwrap())
        .collect();
    let wr: Vec<&QMatrix> = ws.iter().collect();
    for n in [1usize, 17] {
        let x = input(n, cols, 5 + n as u64);
        for threads in [1usize, 2] {
            for isa in isas() {
                let mut many: Vec<Vec<f32>> = ws.iter().map(|w| vec![0f32; n * w.rows]).collect();
                let mut outs: Vec<&mut [f32]> = many.iter_mut().map(|v| v.as_mut_slice()).collect();
                matmul_many_with_isa(isa, &wr, &x, n, &mut outs, threads).unwrap();
                for (w, got) in ws.iter().zip(&many) {
                    let mut one = vec![0f32; n * w.rows];
                    matmul_with_isa(isa, w, &x, n, &mut one, threads).unwrap();
                    assert_eq!(got, &one, "{:?} n={n} threads={threads} {isa:?}", w.ty);
                }
            }
        }
    }
}

#[test]
fn refused_arguments_leave_out_untouched() {
    let (rows, cols) = (8, 64);
    let data = weight(GgmlType::Q8_0, rows, cols, 1);
    let w = QMatrix::new(GgmlType::Q8_0, rows, cols, &data).unwrap();
    let x = input(2, cols, 2);
    let kind = |r: offgraph_kv_engine::Result<()>| r.map_err(|e| e.kind()).err();
    let mut out = vec![7f32; 2 * rows];

    // The weight's bytes: too few, too many; cols not a block multiple.
    assert!(matches!(
        QMatrix::new(GgmlType::Q8_0, rows, cols, &data[1..]),
        Err(EngineError::InvalidArgument(_))
    ));
    assert!(matches!(
        QMatrix::new(GgmlType::Q8_0, rows - 1, cols, &data),
        Err(EngineError::InvalidArgument(_))
    ));
    assert!(matches!(
        QMatrix::new(GgmlType::Q8_0, rows, 48, &data),
        Err(EngineError::Format(_))
    ));
    let short = QMatrix {
        data: &data[..data.len() - 1],
        ..w
    };
    assert_eq!(
        kind(matmul(&short, &x, 2, &mut out, 1)),
        Some("InvalidArgument")
    );
    let odd = QMatrix { cols: 40, ..w };
    assert_eq!(kind(matmul(&odd, &x, 2, &mut out, 1)), Some("Format"));
    // x and out too short.
    assert_eq!(
        kind(matmul(&w, &x[..2 * cols - 1], 2, &mut out, 2)),
        Some("InvalidArgument")
    );
    assert_eq!(
        kind(matmul(&w, &x, 2, &mut out[..2 * rows - 1], 2)),
        Some("InvalidArgument")
    );
    assert_eq!(
        kind(matmul(&w, &x, usize::MAX, &mut out, 2)),
        Some("InvalidArgument")
    );
    // matmul_many: mismatched cols, counts, one short output.
    let data2 = weight(GgmlType::Q8_0, rows, 2 * cols, 3);
    let w2 = QMatrix::new(GgmlType::Q8_0, rows, 2 * cols, &data2).unwrap();
    let mut o2 = vec![7f32; 4 * rows];
    assert_eq!(
        kind(matmul_many(&[&w, &w2], &x, 2, &mut [&mut out, &mut o2], 1)),
        Some("InvalidArgument")
    );
    assert_eq!(
        kind(matmul_many(&[&w, &w], &x, 2, &mut [&mut out], 1)),
        Some("InvalidArgument")
    );
    let mut o3 = vec![7f32; 2 * rows - 1];
    assert_eq!(
        kind(matmul_many(&[&w, &w], &x, 2, &mut [&mut out, &mut o3], 1)),
        Some("InvalidArgument")
    );
    assert!(
        out.iter().chain(&o2).chain(&o3).all(|v| *v == 7.0),
        "a refused call wrote"
    );
    // Row access.
    assert!(w.row(rows - 1).is_ok());
    assert!(matches!(w.row(rows), Err(EngineError::InvalidArgument(_))));
    // Zero tokens is a no-op.
    matmul(&w, &x, 0, &mut out, 2).unwrap();
    assert!(out.iter().all(|v| *v == 7.0));
}

#[test]
fn real_model_rows_match_the_gguf_decoding_times_x() {
    // The fixtures' rows of both models, with the gguf package's own decoded
    // values as the reference weights (independent of dequantize_row).
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/quant");
    let mut n_files = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let b = std::fs::read(e.unwrap().path()).unwrap();
        let u = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap()) as usize;
        let ty = GgmlType::from_id(u(8) as u32).unwrap();
        let (rows, cols) = (u(12), u(16));
        let rb = ty.row_bytes(cols as u64).unwrap() as usize;
        let raw = &b[20..20 + rows * rb];
        let wd: Vec<f32> = b[20 + rows * rb..]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let w = QMatrix::new(ty, rows, cols, raw).unwrap();
        let x = input(3, cols, 42);
        let (yref, bound) = reference(ty, &wd, rows, cols, &x, 3);
        for isa in isas() {
            let mut out = vec![0f32; 3 * rows];
            matmul_with_isa(isa, &w, &x, 3, &mut out, 2).unwrap();
            for k in 0..out.len() {
                assert!(
                    (out[k] as f64 - yref[k]).abs() <= bound[k],
                    "{ty:?} {isa:?} [{k}]: {} vs {}",
                    out[k],
                    yref[k]
                );
            }
        }
        n_files += 1;
    }
    assert!(n_files >= 18, "{n_files} fixtures");
}
