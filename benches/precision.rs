//! Decode attention per pool dtype against the memory floor, in one run.
//!
//! T = 1, 8 KV heads, 32 query heads, head_dim 128, contexts 2048 and 8192,
//! 1 and 2 threads, K and V of each dtype (`native`), plus `floor_<dtype>`: a
//! SIMD streaming read of that dtype's K and V bytes (AVX-512 loads, or AVX where
//! the CPU has no AVX-512, 8
//! independent accumulators, K and V side by side, prefetched into L2 like
//! the kernel) split over the same threads as the kernel splits its heads.
//! `q8_0` is the default path (VNNI integer dots where the CPU has them),
//! `q8_0_widen` the AVX-512 register widening of the same pools. Cold cache: every iteration's untimed setup reads a 96 MiB
//! buffer (24× this machine's 4 MiB of L2; the VM reports a 480 MiB host L3, which
//! it does not wholly flush: the floor and every kernel get the same treatment). It also prints bytes per token of a
//! Gemma-3-270M-shaped and a Llama-3-8B-shaped cache per dtype.
//!
//! `ATTN_BENCH_QUICK=1` shortens warm-up/measurement. Medians are in
//! target/criterion/precision_threads*/*/new/estimates.json.
#![allow(clippy::indexing_slicing, clippy::unwrap_used, clippy::expect_used)]

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
use offgraph_kv::attention::{attend_into, AttendOptions, Backend, NativeIsa};
use offgraph_kv::{KvDtype, KvRows};
use std::hint::black_box;
use std::time::Duration;

mod common;
use common::{causal_spec, data, pool, read_kv, read_sum};

const N_KV: usize = 8;
const N_Q: usize = 32;
const HD: usize = 128;

fn bytes_of(words: &[f32], n: usize) -> &[u8] {
    &KvRows::from_f32(words).bytes[..n]
}

fn config() -> Criterion {
    let quick = std::env::var_os("ATTN_BENCH_QUICK").is_some();
    Criterion::default()
        .sample_size(if quick { 10 } else { 30 })
        .warm_up_time(Duration::from_millis(if quick { 200 } else { 1000 }))
        .measurement_time(Duration::from_millis(if quick { 1500 } else { 4000 }))
}

fn bytes_per_token() {
    for (name, layers, heads, hd) in [("gemma-3-270m", 18, 1, 256), ("llama-3-8b", 32, 8, 128)] {
        let per: Vec<String> = KvDtype::ALL
            .iter()
            .map(|d| format!("{} {}", d.name(), 2 * layers * heads * d.row_bytes(hd)))
            .collect();
        eprintln!("bytes/token {name} (K+V, all layers): {}", per.join(", "));
    }
}

fn decode(c: &mut Criterion) {
    bytes_per_token();
    let flush_buf = vec![1.0f32; 24 << 20]; // 96 MiB
    for threads in [1usize, 2] {
        let mut g = c.benchmark_group(format!("precision_threads{threads}"));
        for ctx in [2048usize, 8192] {
            let kf = data(N_KV * ctx * HD, 1);
            let vf = data(N_KV * ctx * HD, 2);
            let q = data(N_Q * HD, 3);
            let positions = [ctx - 1];
            let mut out = vec![0f32; q.len()];
            for dtype in KvDtype::ALL {
                let n = dtype.row_bytes(HD) * N_KV * ctx;
                let (k, v) = (pool(dtype, &kf), pool(dtype, &vf));
                let rows = |p| KvRows {
                    dtype,
                    bytes: bytes_of(p, n),
                };
                let spec = causal_spec(rows(&k), rows(&v), (N_KV, HD), ctx, &positions);
                g.throughput(Throughput::Bytes((2 * n) as u64));
                g.bench_function(
                    BenchmarkId::new(format!("floor_{}", dtype.name()), ctx),
                    |b| {
                        b.iter_batched(
                            || black_box(read_sum(&flush_buf)),
                            |_| black_box(read_kv(&k, &v, threads)),
                            BatchSize::PerIteration,
                        )
                    },
                );
                let opts = AttendOptions {
                    threads: Some(threads),
                    backend: Backend::Native,
                    ..Default::default()
                };
                let mut variants = vec![(dtype.name().to_string(), opts)];
                // The default takes VNNI integer dots for q8_0 keys where the
                // CPU has them; the register widening beside it, same run.
                if dtype == KvDtype::Q8_0 && offgraph_kv::cpu::features().avx512vnni {
                    let widen = AttendOptions {
                        native_isa: NativeIsa::Avx512,
                        ..opts
                    };
                    variants.push(("q8_0_widen".into(), widen));
                }
                for (name, opts) in variants {
                    g.bench_function(BenchmarkId::new(name, ctx), |b| {
                        b.iter_batched(
                            || black_box(read_sum(&flush_buf)),
                            |_| attend_into(&q, [N_Q, 1, HD], &spec, &opts, &mut out).unwrap(),
                            BatchSize::PerIteration,
                        )
                    });
                }
            }
        }
        g.finish();
    }
}

criterion_group! {
    name = benches;
    config = config();
    targets = decode
}
criterion_main!(benches);
