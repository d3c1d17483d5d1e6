//! Weights packed at load: on the AVX-512 VNNI path a packed weight's
//! outputs are bit-identical to the same weight read in place (the 32-value
//! types), elsewhere (Q4_K and Q6_K, and the AVX2 path's packed kernels)
//! equal to them up to f32 summation order, for every token count and thread count with rows left
//! over; a token's outputs do not depend on the batch it runs in (every
//! packed type); the portable path, which has no packed kernels, ignores the
//! packed copy; bad packed buffers are refused; a model packed at open on several
//! threads holds the same bytes as on one.

mod common;

use offgraph_kv_engine::model::OpenOptions;
use offgraph_kv_engine::quant::{
    active_isa, matmul, matmul_with_isa, pack, packed_len, QMatrix, QuantIsa, LANES,
};
use offgraph_kv_engine::{EngineError, GgmlType, Model};

const Q32: [GgmlType; 4] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q8_0,
];

use common::Rng;

/// An f16 in [2^-7, 2^-6): finite, modest, random mantissa.
fn small_f16(r: &mut Rng) -> [u8; 2] {
    (((15 - 7) << 10) | (r.next() as u16 & 0x3ff)).to_le_bytes()
}

/// Random blocks of `ty` whose f16 scales are finite.
fn weight(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let mut r = Rng(seed);
    let rb = ty.row_bytes(cols as u64).unwrap() as usize;
    let mut data: Vec<u8> = (0..rows * rb).map(|_| r.next() as u8).collect();
    let bb = ty.block_bytes();
    // Where each block's f16 scales sit.
    let at: &[usize] = match ty {
        GgmlType::Q4_1 | GgmlType::Q4_K => &[0, 2],
        GgmlType::Q6_K => &[208],
        _ => &[0],
    };
    for blk in data.chunks_exact_mut(bb) {
        for &o in at {
            blk[o..o + 2].copy_from_slice(&small_f16(&mut r));
        }
    }
    data
}

fn input(n: usize, cols: usize, seed: u64) -> Vec<f32> {
    let mut r = Rng(seed);
    (0..n * cols).map(|_| r.unit()).collect()
}

fn packed_of(w: &QMatrix) -> Vec<u8> {
    let len = packed_len(w.ty, w.rows, w.cols).expect("a packed layout on this path");
    let mut out = vec![0u8; len];
    pack(w, &mut out).unwrap();
    out
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|v| v.to_bits()).collect()
}

fn vnni() -> bool {
    active_isa() == QuantIsa::Avx512Vnni
}

/// Whether the active path packs the 32-value types (AVX2 or VNNI).
fn packs_q32() -> bool {
    Q32.iter().all(|&ty| packed_len(ty, 64, 256).is_some())
}

#[test]
fn packed_types_match_the_rows_in_place() {
    if !packs_q32() {
        // No packed kernels on this path: nothing is packed.
        assert!(Q32.iter().all(|&ty| packed_len(ty, 64, 256).is_none()));
        return;
    }
    // Three groups and five rows left over; 8 blocks (2 super-blocks) a row.
    let (rows, n) = (3 * LANES + 5, 20);
    let k_types = [GgmlType::Q4_K, GgmlType::Q6_K];
    for (i, ty) in Q32.into_iter().chain(k_types).enumerate() {
        let cols = if k_types.contains(&ty) { 512 } else { 256 };
        let x = input(n, cols, 7);
        let data = weight(ty, rows, cols, 100 + i as u64);
        let w = QMatrix::new(ty, rows, cols, &data).unwrap();
        let p = packed_of(&w);
        let wp = w.with_packed(&p).unwrap();
        for t in 1..=n {
            for threads in [1, 2] {
                let mut a = vec![0f32; t * rows];
                let mut b = vec![f32::NAN; t * rows];
                matmul(&w, &x, t, &mut a, threads).unwrap();
                matmul(&wp, &x, t, &mut b, threads).unwrap();
                if vnni() && Q32.contains(&ty) {
                    // The same arithmetic from another layout.
                    assert_eq!(bits(&a), bits(&b), "{ty:?} T={t} threads={threads}");
                    continue;
                }
                // Other kernels: the same integer dots, the blocks' scaled
                // sums added in another order.
                let scale = a.iter().fold(0f32, |m, v| m.max(v.abs()));
                for (j, (u, v)) in a.iter().zip(&b).enumerate() {
                    assert!(
                        (u - v).abs() <= 1e-5 * scale,
                        "{ty:?} T={t} threads={threads} out {j}: {u} vs {v}"
                    );
                }
                // The rows a group leaves over run in place on both.
                for t in 0..t {
                    let rest = t * rows + 3 * LANES..(t + 1) * rows;
                    assert_eq!(bits(&a[rest.clone()]), bits(&b[rest]), "{ty:?} rest");
                }
            }
        }
    }
}

#[test]
fn a_tokens_packed_outputs_do_not_depend_on_its_batch() {
    let mut types = Q32.to_vec();
    // Q4_K and Q6_K where their packed kernels exist.
    types.extend(
        [GgmlType::Q4_K, GgmlType::Q6_K]
            .into_iter()
            .filter(|&ty| packed_len(ty, LANES, 256).is_some()),
    );
    if !packs_q32() {
        return assert!(types.iter().all(|&ty| packed_len(ty, LANES, 256).is_none()));
    }
    let (rows, cols, n) = (2 * LANES + 3, 512, 19);
    let x = input(n, cols, 11);
    for (i, ty) in types.into_iter().enumerate() {
        let data = weight(ty, rows, cols, 200 + i as u64);
        let w = QMatrix::new(ty, rows, cols, &data).unwrap();
        let p = packed_of(&w);
        let wp = w.with_packed(&p).unwrap();
        let mut batch = vec![0f32; n * rows];
        matmul(&wp, &x, n, &mut batch, 2).unwrap();
        for t in 0..n {
            let mut alone = vec![0f32; rows];
            matmul(&wp, &x[t * cols..(t + 1) * cols], 1, &mut alone, 1).unwrap();
            assert_eq!(
                bits(&alone),
                bits(&batch[t * rows..(t + 1) * rows]),
                "{ty:?} token {t}"
            );
        }
    }
}

#[test]
fn a_path_without_packed_kernels_reads_the_rows_in_place() {
    for (ty, cols) in [(GgmlType::Q8_0, 64), (GgmlType::Q4_K, 256)] {
        let (rows, n) = (LANES + 1, 5);
        if packed_len(ty, rows, cols).is_none() {
            continue;
        }
        let x = input(n, cols, 3);
        let data = weight(ty, rows, cols, 5);
        let w = QMatrix::new(ty, rows, cols, &data).unwrap();
        // A packed copy of other weights: the portable path must not read it.
        let other = weight(ty, rows, cols, 6);
        let p = packed_of(&QMatrix::new(ty, rows, cols, &other).unwrap());
        let wp = w.with_packed(&p).unwrap();
        let (mut a, mut b) = (vec![0f32; n * rows], vec![0f32; n * rows]);
        matmul_with_isa(QuantIsa::Portable, &w, &x, n, &mut a, 1).unwrap();
        matmul_with_isa(QuantIsa::Portable, &wp, &x, n, &mut b, 1).unwrap();
        assert_eq!(bits(&a), bits(&b), "{ty:?}");
    }
}

fn kind<T>(r: Result<T, EngineError>) -> Option<&'static str> {
    match r {
        Err(EngineError::InvalidArgument(_)) => Some("InvalidArgument"),
        Err(_) => Some("other"),
        Ok(_) => None,
    }
}

#[test]
fn bad_packed_buffers_are_refused() {
    let (rows, cols) = (2 * LANES, 64);
    let data = weight(GgmlType::Q4_0, rows, cols, 9);
    let w = QMatrix::new(GgmlType::Q4_0, rows, cols, &data).unwrap();
    let len = 2 * LANES * GgmlType::Q4_0.row_bytes(cols as u64).unwrap() as usize;
    let mut out = vec![7u8; len - 1];
    assert_eq!(kind(pack(&w, &mut out)), Some("InvalidArgument"));
    assert!(out.iter().all(|&b| b == 7), "a refused pack writes nothing");
    assert_eq!(kind(w.with_packed(&out)), Some("InvalidArgument"));
    // The super-block types' output length is checked at the same boundary.
    for ty in [GgmlType::Q4_K, GgmlType::Q6_K] {
        let data = weight(ty, rows, 256, 10);
        let wk = QMatrix::new(ty, rows, 256, &data).unwrap();
        let mut out = vec![7u8; packed_len(ty, rows, 256).unwrap_or(64) + 1];
        assert_eq!(kind(pack(&wk, &mut out)), Some("InvalidArgument"));
        assert!(out.iter().all(|&b| b == 7), "a refused {ty:?} pack writes");
    }
    // A type without a packed layout.
    let f = vec![0u8; rows * cols * 4];
    let wf = QMatrix::new(GgmlType::F32, rows, cols, &f).unwrap();
    assert!(packed_len(GgmlType::F32, rows, cols).is_none());
    assert_eq!(kind(pack(&wf, &mut [])), Some("InvalidArgument"));
    assert_eq!(kind(wf.with_packed(&[])), Some("InvalidArgument"));
    // A struct literal with a wrong packed length: the matmul refuses it
    // and leaves the output as it was.
    let short = vec![0u8; len - 64];
    let bad = QMatrix {
        packed: Some(&short),
        ..w
    };
    let x = input(1, cols, 1);
    let mut o = vec![1f32; rows];
    assert_eq!(
        kind(matmul(&bad, &x, 1, &mut o, 1)),
        Some("InvalidArgument")
    );
    assert!(o.iter().all(|&v| v == 1.0));
    // Fewer rows than a group: nothing to pack.
    assert!(packed_len(GgmlType::Q4_0, LANES - 1, cols).is_none());
}

#[test]
fn packing_at_open_on_many_threads_gives_the_one_thread_bytes() {
    let path = common::smollm2_gguf();
    let opts = OpenOptions { repack: true };
    let open = |threads| {
        Model::open_with_threads(&path, opts, threads)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    let one = open(1);
    // More workers than cores and than the largest jobs: every way of
    // sharing the tensors out must write the same ranges.
    let many = open(3);
    assert_eq!(many.threads(), 3);
    let (a, b) = (one.packed_weights(), many.packed_weights());
    // SmolLM2-135M is Q4_1 (and a Q8_0 output): packed wherever the AVX2
    // or VNNI kernels run.
    assert_eq!(a.is_empty(), !packs_q32());
    assert_eq!(a.len(), b.len());
    for ((na, pa), (nb, pb)) in a.iter().zip(&b) {
        assert_eq!(na, nb);
        assert!(pa == pb, "tensor {na:?}: packed bytes differ");
    }
    assert_eq!(one.packed_bytes(), many.packed_bytes());
}
