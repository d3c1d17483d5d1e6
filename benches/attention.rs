//! attend() against the memory roofline (decode) and the FMA bound (prefill).
//!
//! Decode: T = 1, 8 KV heads, 32 query heads, head_dim 128, contexts 512 / 2048
//! / 8192, 1 and 2 threads; each backend and `floor`, a SIMD streaming read of
//! the same K and V bytes split over the same threads (the roofline floor,
//! `common::read_kv`), all in one run. Cold cache: every iteration's setup (not timed, `iter_batched` with
//! `PerIteration`) first reads a 96 MiB buffer, 24× this machine's 4 MiB of L2 (the VM
//! reports a 480 MiB host L3, which it does not wholly flush: the floor and
//! every backend get the same treatment).
//!
//! Prefill: a T = 128 chunk at the end of a 2048-token causal context. The FMA
//! bound is `useful FMAs / peak`, useful = visible (query, key) pairs × head_dim
//! × 2 (q·k and p·v), peak measured at start-up by an AVX-512 FMA loop with 12
//! independent accumulators (printed as `fma peak`).
//!
//! `ATTN_BENCH_QUICK=1` shortens warm-up/measurement. The ratios in the issue's
//! closing note come from the medians in target/criterion/*/*/new/estimates.json.
#![allow(clippy::indexing_slicing, clippy::unwrap_used, clippy::expect_used)]

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
use offgraph_kv::attention::{attend_into, AttendOptions, Backend};
use offgraph_kv::KvRows;
use std::hint::black_box;
use std::time::{Duration, Instant};

mod common;
use common::{causal_spec, data, read_kv, read_sum};

const N_KV: usize = 8;
const N_Q: usize = 32;
const HD: usize = 128;

fn flush(buf: &[f32]) {
    black_box(read_sum(buf));
}

/// The floor: read K and V of every head once, heads split over threads like attend.
/// Peak FMA throughput of one core, in FMAs (lanes) per second.
fn fma_peak() -> f64 {
    #[cfg(target_arch = "x86_64")]
    if offgraph_kv::cpu::features().avx512f {
        #[target_feature(enable = "avx512f")]
        unsafe fn run(iters: usize) -> f32 {
            use std::arch::x86_64::*;
            let mut a = [_mm512_set1_ps(1.0); 12];
            let m = _mm512_set1_ps(0.999_999);
            let c = _mm512_set1_ps(1e-7);
            for _ in 0..iters {
                for x in a.iter_mut() {
                    *x = _mm512_fmadd_ps(*x, m, c);
                }
            }
            let mut s = _mm512_setzero_ps();
            for x in a {
                s = _mm512_add_ps(s, x);
            }
            _mm512_reduce_add_ps(s)
        }
        let iters = 20_000_000;
        // SAFETY: avx512f detected above.
        unsafe { run(1000) };
        let t = Instant::now();
        // SAFETY: avx512f detected above.
        black_box(unsafe { run(iters) });
        return (iters * 12 * 16) as f64 / t.elapsed().as_secs_f64();
    }
    f64::NAN
}

fn config() -> Criterion {
    let quick = std::env::var_os("ATTN_BENCH_QUICK").is_some();
    Criterion::default()
        .sample_size(if quick { 10 } else { 30 })
        .warm_up_time(Duration::from_millis(if quick { 200 } else { 1000 }))
        .measurement_time(Duration::from_millis(if quick { 1500 } else { 5000 }))
}

fn backends() -> Vec<Backend> {
    [Backend::Native, Backend::Xnnpack]
        .into_iter()
        .filter(|b| b.available())
        .collect()
}

fn decode(c: &mut Criterion) {
    let flush_buf = vec![1.0f32; 24 << 20]; // 96 MiB
    for threads in [1usize, 2] {
        let mut g = c.benchmark_group(format!("decode_threads{threads}"));
        for ctx in [512usize, 2048, 8192] {
            let slots = ctx;
            let k = data(N_KV * slots * HD, 1);
            let v = data(N_KV * slots * HD, 2);
            let q = data(N_Q * HD, 3);
            let positions = [ctx - 1];
            let (kr, vr) = (KvRows::from_f32(&k), KvRows::from_f32(&v));
            let spec = causal_spec(kr, vr, (N_KV, HD), slots, &positions);
            let mut out = vec![0f32; q.len()];
            g.throughput(Throughput::Bytes((2 * k.len() * 4) as u64));
            g.bench_function(BenchmarkId::new("floor", ctx), |b| {
                b.iter_batched(
                    || flush(&flush_buf),
                    |_| black_box(read_kv(&k, &v, threads)),
                    BatchSize::PerIteration,
                )
            });
            for backend in backends() {
                let opts = AttendOptions {
                    threads: Some(threads),
                    backend,
                    ..Default::default()
                };
                g.bench_function(BenchmarkId::new(backend.name(), ctx), |b| {
                    b.iter_batched(
                        || flush(&flush_buf),
                        |_| attend_into(&q, [N_Q, 1, HD], &spec, &opts, &mut out).unwrap(),
                        BatchSize::PerIteration,
                    )
                });
            }
        }
        g.finish();
    }
}

fn prefill(c: &mut Criterion) {
    let peak = fma_peak();
    let (ctx, t) = (2048usize, 128usize);
    let useful: f64 = (0..t).map(|i| (ctx - t + i + 1) as f64).sum::<f64>() * (N_Q * HD * 2) as f64;
    eprintln!(
        "fma peak: {:.2} GFMA/s per core; prefill T={t} ctx={ctx}: {:.3e} useful FMAs, bound {:.2} ms at 1 thread, {:.2} ms at 2",
        peak / 1e9,
        useful,
        useful / peak * 1e3,
        useful / peak / 2.0 * 1e3
    );
    let k = data(N_KV * ctx * HD, 4);
    let v = data(N_KV * ctx * HD, 5);
    let q = data(N_Q * t * HD, 6);
    let positions: Vec<usize> = (ctx - t..ctx).collect();
    let (kr, vr) = (KvRows::from_f32(&k), KvRows::from_f32(&v));
    let spec = causal_spec(kr, vr, (N_KV, HD), ctx, &positions);
    let mut out = vec![0f32; q.len()];
    let mut g = c.benchmark_group("prefill128_ctx2048");
    g.throughput(Throughput::Elements(useful as u64));
    for threads in [1usize, 2] {
        for backend in backends() {
            let opts = AttendOptions {
                threads: Some(threads),
                backend,
                ..Default::default()
            };
            g.bench_function(
                BenchmarkId::new(backend.name(), format!("threads{threads}")),
                |b| b.iter(|| attend_into(&q, [N_Q, t, HD], &spec, &opts, &mut out).unwrap()),
            );
        }
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = config();
    targets = decode, prefill
}
criterion_main!(benches);
