//! Quantized matvecs at the two test models' real shapes, each beside a
//! memory floor measured in the same run: an AVX2 streaming read summing the
//! same weight bytes with the same thread split. Then batched steps (16 and
//! 128 tokens), whose time per token falls because each weight block is read
//! once for all tokens of a tile.
//!
//! `cargo bench -p offgraph-kv-engine --bench matmul -- --warm-up-time 1 --measurement-time 3`

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use offgraph_kv_engine::quant::{matmul, pack, packed_len, QMatrix};
use offgraph_kv_engine::GgmlType;
use std::hint::black_box;

/// Random blocks with finite scales (the values do not change the speed).
fn weight(ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let n = rows * ty.row_bytes(cols as u64).unwrap() as usize;
    let mut s = 0x2545_f491_4f6c_dd1du64;
    let mut data = Vec::with_capacity(n + 8);
    while data.len() < n {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        data.extend_from_slice(&s.to_le_bytes());
    }
    data.truncate(n);
    let (bb, offs): (usize, &[usize]) = match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::IQ4_NL | GgmlType::IQ4_XS => {
            (ty.block_bytes(), &[0])
        }
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => {
            (ty.block_bytes(), &[0, 2])
        }
        GgmlType::Q6_K => (210, &[208]),
        GgmlType::Q2_K => (84, &[80, 82]),
        GgmlType::Q3_K => (110, &[108]),
        _ => (ty.block_bytes(), &[]),
    };
    for b in data.chunks_exact_mut(bb) {
        for &o in offs {
            b[o..o + 2].copy_from_slice(&0x2000u16.to_le_bytes()); // 2^-7
        }
    }
    data
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sum_bytes_avx2(b: &[u8]) -> u64 {
    use std::arch::x86_64::*;
    let z = _mm256_setzero_si256();
    let mut acc = [z; 4];
    let chunks = b.chunks_exact(128);
    let tail: u64 = chunks.remainder().iter().map(|&v| u64::from(v)).sum();
    for c in chunks {
        for (k, a) in acc.iter_mut().enumerate() {
            // SAFETY: 32 bytes at 32k inside the 128-byte chunk.
            let v = unsafe { _mm256_loadu_si256(c.as_ptr().add(32 * k).cast()) };
            *a = _mm256_add_epi64(*a, _mm256_sad_epu8(v, z));
        }
    }
    let s = _mm256_add_epi64(
        _mm256_add_epi64(acc[0], acc[1]),
        _mm256_add_epi64(acc[2], acc[3]),
    );
    let mut l = [0u64; 4];
    // SAFETY: 32 bytes into a 4 x u64 array.
    unsafe { _mm256_storeu_si256(l.as_mut_ptr().cast(), s) };
    l.iter().sum::<u64>() + tail
}

/// The floor: every weight byte read once, split into `threads` contiguous
/// parts on the same worker pool the matmul uses.
fn floor(data: &[u8], threads: usize) -> u64 {
    let total = std::sync::atomic::AtomicU64::new(0);
    let part = |p: usize| {
        let (lo, hi) = (data.len() * p / threads, data.len() * (p + 1) / threads);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the benches run on the AVX2 machine (checked in `benches`).
        let s = unsafe { sum_bytes_avx2(&data[lo..hi]) };
        #[cfg(not(target_arch = "x86_64"))]
        let s: u64 = data[lo..hi].iter().map(|&v| u64::from(v)).sum();
        total.fetch_add(s, std::sync::atomic::Ordering::Relaxed);
    };
    offgraph_kv::workers::run(threads, &part).unwrap();
    total.into_inner()
}

fn input(n: usize, cols: usize) -> Vec<f32> {
    (0..n * cols)
        .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect()
}

fn benches(c: &mut Criterion) {
    #[cfg(target_arch = "x86_64")]
    assert!(offgraph_kv::cpu::features().avx2, "the floor needs AVX2");
    println!(
        "quantized dots run on {:?}",
        offgraph_kv_engine::quant::active_isa()
    );
    // (name, type, rows (output), cols (input)).
    let cases = [
        ("gemma_output_q8_0_262144x640", GgmlType::Q8_0, 262_144, 640),
        ("gemma_gate_q5_0_640to2048", GgmlType::Q5_0, 2048, 640),
        ("gemma_attn_out_q4_k_1024to640", GgmlType::Q4_K, 640, 1024),
        ("gemma_down_q6_k_2048to640", GgmlType::Q6_K, 640, 2048),
        ("smollm2_up_q4_1_576to1536", GgmlType::Q4_1, 1536, 576),
        // The low-bit types at the down projection's shape (no test model
        // stores them).
        ("down_q2_k_2048to640", GgmlType::Q2_K, 640, 2048),
        ("down_q3_k_2048to640", GgmlType::Q3_K, 640, 2048),
        ("down_iq4_nl_2048to640", GgmlType::IQ4_NL, 640, 2048),
        ("down_iq4_xs_2048to640", GgmlType::IQ4_XS, 640, 2048),
    ];
    let mut g = c.benchmark_group("matvec");
    g.sample_size(10);
    for (name, ty, rows, cols) in cases {
        let data = weight(ty, rows, cols);
        let w = QMatrix::new(ty, rows, cols, &data).unwrap();
        let x = input(1, cols);
        let mut out = vec![0f32; rows];
        g.throughput(Throughput::Bytes(data.len() as u64));
        for threads in [1usize, 2] {
            g.bench_function(BenchmarkId::new(format!("{name}/floor"), threads), |b| {
                b.iter(|| black_box(floor(black_box(&data), threads)))
            });
            g.bench_function(BenchmarkId::new(format!("{name}/matmul"), threads), |b| {
                b.iter(|| matmul(&w, black_box(&x), 1, &mut out, threads).unwrap())
            });
        }
    }
    g.finish();

    // The pool's own cost: one call with nothing to do, as a matvec part
    // split pays it (about 150 calls a decoded token).
    let mut g = c.benchmark_group("pool");
    g.sample_size(10);
    for threads in [1usize, 2] {
        g.bench_function(BenchmarkId::new("empty_run", threads), |b| {
            b.iter(|| {
                offgraph_kv::workers::run(threads, &|p| {
                    black_box(p);
                })
                .unwrap()
            })
        });
    }
    g.finish();

    // Batched: time per token (Throughput::Elements = tokens) falls with n.
    let mut g = c.benchmark_group("batched");
    g.sample_size(10);
    // The output projection only at 16 tokens: a decode step of 16 streams.
    for (name, ty, rows, cols, ns) in [
        (
            "gemma_gate_q5_0_640to2048",
            GgmlType::Q5_0,
            2048,
            640,
            &[1usize, 16, 128][..],
        ),
        (
            "gemma_down_q6_k_2048to640",
            GgmlType::Q6_K,
            640,
            2048,
            &[1, 16, 128],
        ),
        (
            "gemma_attn_out_q4_k_1024to640",
            GgmlType::Q4_K,
            640,
            1024,
            &[16, 128],
        ),
        (
            "smollm2_up_q4_1_576to1536",
            GgmlType::Q4_1,
            1536,
            576,
            &[1, 16, 128],
        ),
        (
            "gemma_output_q8_0_262144x640",
            GgmlType::Q8_0,
            262_144,
            640,
            &[2, 3, 4, 16],
        ),
    ] {
        let data = weight(ty, rows, cols);
        let w = QMatrix::new(ty, rows, cols, &data).unwrap();
        for &n in ns {
            let x = input(n, cols);
            let mut out = vec![0f32; n * rows];
            g.throughput(Throughput::Elements(n as u64));
            for threads in [1usize, 2] {
                g.bench_function(BenchmarkId::new(format!("{name}/n{n}"), threads), |b| {
                    b.iter(|| matmul(&w, black_box(&x), n, &mut out, threads).unwrap())
                });
            }
        }
    }
    g.finish();

    // In place against packed at load, where the path packs the type: the
    // few-token steps speculation verifies (1 + drafts), on one thread.
    let mut g = c.benchmark_group("packed");
    g.sample_size(10);
    for (name, ty, rows, cols) in [
        ("smollm2_up_q4_1_576to1536", GgmlType::Q4_1, 1536, 576),
        ("smollm2_output_q8_0_49152x576", GgmlType::Q8_0, 49_152, 576),
        ("gemma_gate_q5_0_640to2048", GgmlType::Q5_0, 2048, 640),
        ("gemma_attn_out_q4_k_1024to640", GgmlType::Q4_K, 640, 1024),
        ("gemma_down_q6_k_2048to640", GgmlType::Q6_K, 640, 2048),
    ] {
        let data = weight(ty, rows, cols);
        let w = QMatrix::new(ty, rows, cols, &data).unwrap();
        let Some(len) = packed_len(ty, rows, cols) else {
            println!("{name}: not packed on this path");
            continue;
        };
        let mut p = vec![0u8; len];
        pack(&w, &mut p).unwrap();
        let wp = w.with_packed(&p).unwrap();
        for n in [1usize, 2, 3, 5, 9] {
            let x = input(n, cols);
            let mut out = vec![0f32; n * rows];
            g.throughput(Throughput::Elements(n as u64));
            for (form, m) in [("in_place", &w), ("packed", &wp)] {
                g.bench_function(BenchmarkId::new(format!("{name}/{form}"), n), |b| {
                    b.iter(|| matmul(m, black_box(&x), n, &mut out, 1).unwrap())
                });
            }
        }
    }
    g.finish();
}

criterion_group!(matmul_benches, benches);
criterion_main!(matmul_benches);
