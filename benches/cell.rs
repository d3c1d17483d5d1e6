//! CellCache benchmarks: begin_step + plan per step for decode workloads, a
//! prefill step, seq_clone / seq_free of a long sequence, the sparse visible
//! path and, for contrast, the dense-mask path.
//!
//! Steady state: after every timed step the oldest position of each stepping
//! sequence is removed (untimed), so contexts stay at their target size.
//! Run: cargo bench -p offgraph-kv --bench cell -- --warm-up-time 1 --measurement-time 3

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use offgraph_kv::cell::{CellCache, SeqId};
use offgraph_kv::{CacheConfig, LayerConfig, LayerPolicy, Run};

const N_LAYERS: usize = 32;
const WINDOW: usize = 512;
const MAX_STEP: usize = 512;

/// 32 layers, flat and ring(512) alternating: two policies, two cell tables.
fn config() -> CacheConfig {
    let layers = (0..N_LAYERS)
        .map(|l| {
            let p = if l % 2 == 0 {
                LayerPolicy::Flat
            } else {
                LayerPolicy::Ring { window: WINDOW }
            };
            LayerConfig::new(p, 8, 128)
        })
        .collect();
    let mut c = CacheConfig::new(1 << 20, N_LAYERS, layers);
    c.max_step = MAX_STEP;
    c
}

/// `n_seqs` sequences of `ctx` tokens each, prefilled in chunks.
fn workload(n_cells: usize, n_seqs: usize, ctx: usize) -> (CellCache, Vec<SeqId>) {
    let mut c = CellCache::new(config(), n_cells, n_seqs.max(4)).unwrap();
    let ids: Vec<SeqId> = (0..n_seqs).map(|_| c.seq_new().unwrap()).collect();
    for &s in &ids {
        let mut p = 0;
        while p < ctx {
            let n = MAX_STEP.min(ctx - p);
            c.begin_step(&vec![s; n], &(p..p + n).collect::<Vec<_>>())
                .unwrap();
            p += n;
        }
    }
    (c, ids)
}

fn plan_all(c: &CellCache) -> usize {
    let mut acc = 0;
    for l in 0..N_LAYERS {
        let p = c.plan(l).unwrap();
        acc += p.cells().len() + p.read_len();
    }
    acc
}

/// Removes the oldest position of each sequence (keeps the context steady).
fn trim(c: &mut CellCache, ids: &[SeqId], oldest: &mut usize) {
    for &s in ids {
        c.seq_rm(s, *oldest, Some(*oldest + 1)).unwrap();
    }
    *oldest += 1;
}

/// One decode step for every sequence: begin_step + plan for all 32 layers,
/// plus `extra` on the open step; the trim is untimed.
fn decode_bench(
    c: &mut Criterion,
    name: &str,
    n_cells: usize,
    n_seqs: usize,
    ctx: usize,
    extra: impl Fn(&mut CellCache) -> usize,
) {
    let (mut cache, ids) = workload(n_cells, n_seqs, ctx);
    let mut next = ctx;
    let mut oldest = 0;
    let mut positions = vec![0usize; n_seqs];
    c.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                positions.fill(next);
                let t = Instant::now();
                cache.begin_step(&ids, &positions).unwrap();
                black_box(plan_all(&cache));
                black_box(extra(&mut cache));
                total += t.elapsed();
                next += 1;
                trim(&mut cache, &ids, &mut oldest);
            }
            total
        })
    });
}

fn benches(c: &mut Criterion) {
    // (a) One sequence at 8K context, 16K cells.
    decode_bench(
        c,
        "a_decode_1seq_8k_16Kcells_32layers",
        16 << 10,
        1,
        8 << 10,
        |_| 0,
    );
    // (b) 64 sequences x 1000 tokens (64K cells hold 65536), one token each, in 64K and 256K cells.
    decode_bench(
        c,
        "b_decode_64seq_1k_64Kcells_32layers",
        64 << 10,
        64,
        1000,
        |_| 0,
    );
    decode_bench(
        c,
        "b_decode_64seq_1k_256Kcells_32layers",
        256 << 10,
        64,
        1000,
        |_| 0,
    );
    // (b') The sparse path: visible runs of every token for both policies.
    decode_bench(
        c,
        "b_visible_runs_64seq_1k_64Kcells",
        64 << 10,
        64,
        1000,
        |cache| {
            let mut out: Vec<Run> = Vec::with_capacity(4096);
            let mut n = 0;
            for layer in 0..2 {
                let p = cache.plan(layer).unwrap();
                for i in 0..p.n_tokens() {
                    out.clear();
                    p.visible_into(i, &mut out).unwrap();
                    n += out.len();
                }
            }
            n
        },
    );
    // (d) For contrast: the dense [T, read_len] mask for both policies.
    decode_bench(
        c,
        "d_dense_mask_64seq_1k_64Kcells",
        64 << 10,
        64,
        1000,
        |cache| cache.dense_mask(0).unwrap().len() + cache.dense_mask(1).unwrap().len(),
    );
    decode_bench(
        c,
        "d_dense_mask_64seq_1k_256Kcells",
        256 << 10,
        64,
        1000,
        |cache| cache.dense_mask(0).unwrap().len() + cache.dense_mask(1).unwrap().len(),
    );

    // (c) A 512-token prefill step of a fresh sequence next to a 4K one.
    {
        let (mut cache, _) = workload(16 << 10, 1, 4 << 10);
        let s = cache.seq_new().unwrap();
        let ids = vec![s; 512];
        let pos: Vec<usize> = (0..512).collect();
        c.bench_function("c_prefill_512_16Kcells_32layers", |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let t = Instant::now();
                    cache.begin_step(&ids, &pos).unwrap();
                    black_box(plan_all(&cache));
                    total += t.elapsed();
                    cache.seq_rm(s, 0, None).unwrap();
                }
                total
            })
        });
    }
    // (c) seq_clone and seq_free of a 4K-token sequence.
    {
        let (mut cache, ids) = workload(16 << 10, 1, 4 << 10);
        let src = ids[0];
        c.bench_function("c_seq_clone_4k", |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let t = Instant::now();
                    let k = cache.seq_clone(src, None).unwrap();
                    total += t.elapsed();
                    cache.seq_free(k).unwrap();
                }
                total
            })
        });
        c.bench_function("c_seq_free_4k_clone", |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let k = cache.seq_clone(src, None).unwrap();
                    let t = Instant::now();
                    cache.seq_free(k).unwrap();
                    total += t.elapsed();
                }
                total
            })
        });
    }
}

criterion_group!(cell, benches);
criterion_main!(cell);
