//! Byte layer: per layer-step cost of writing one decode token's K/V and
//! fetching the spec, Llama-3-8B layer shapes (8 KV heads x 128 dims, f32),
//! at contexts 512, 2048 and 8192. Each iteration is one decode step over 32
//! layers (begin_step, 32 updates, rewind back), reported per layer-step.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use offgraph_kv::{CacheConfig, KvSequenceCache, LayerConfig, LayerPolicy};
use std::hint::black_box;

const HEADS: usize = 8;
const DIM: usize = 128;
const LAYERS: usize = 32;

fn cache_at(context: usize) -> KvSequenceCache {
    let mut cfg = CacheConfig::new(
        context + 16,
        LAYERS,
        vec![LayerConfig::new(LayerPolicy::Flat, HEADS, DIM)],
    );
    cfg.max_step = 512;
    cfg.initial_capacity = 64;
    let mut c = KvSequenceCache::new(cfg).unwrap();
    let rows = vec![0.5f32; HEADS * 512 * DIM];
    let mut done = 0;
    while done < context {
        let t = 512.min(context - done);
        c.begin_step(t).unwrap();
        for l in 0..LAYERS {
            c.update(l, &rows[..HEADS * t * DIM], &rows[..HEADS * t * DIM])
                .unwrap();
        }
        done += t;
    }
    c
}

fn decode_update(c: &mut Criterion) {
    let mut g = c.benchmark_group("kv_update_decode");
    g.throughput(Throughput::Elements(LAYERS as u64));
    let k = vec![1.0f32; HEADS * DIM];
    let v = vec![2.0f32; HEADS * DIM];
    for context in [512usize, 2048, 8192] {
        let mut cache = cache_at(context);
        g.bench_with_input(BenchmarkId::from_parameter(context), &context, |b, &ctx| {
            b.iter(|| {
                cache.begin_step(1).unwrap();
                for l in 0..LAYERS {
                    let spec = cache.update(l, &k, &v).unwrap();
                    black_box(spec.slots);
                }
                cache.rewind(ctx).unwrap();
            })
        });
    }
    g.finish();
}

criterion_group!(benches, decode_update);
criterion_main!(benches);
