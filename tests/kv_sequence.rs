//! The byte layer's centrepiece: drive a KvSequenceCache through prefill,
//! chunked prefill and decodes across several pool doublings while a naive
//! model appends every step's rows to a per-head history; after every step the
//! pool read over the spec's runs must equal the model's visible history.

#![allow(clippy::needless_range_loop)]

mod common;

use common::Rng;
use offgraph_kv::{
    CacheConfig, CacheError, KeyLayout, KvSequenceCache, LayerConfig, LayerPolicy, PoolMemory,
};

const HEADS: usize = 2;
const DIM: usize = 3;

/// Per layer, per head: every row ever appended, by position.
struct History(Vec<Vec<Vec<[f32; DIM]>>>);

fn rows(rng: &mut Rng, t: usize) -> Vec<f32> {
    (0..HEADS * t * DIM).map(|_| rng.f32()).collect()
}

/// Drives both pool memories (the reservation and the copy-growth fallback)
/// through `steps`; returns the fallback's doublings.
fn drive(cfg: CacheConfig, steps: &[usize], seed: u64) -> usize {
    assert_eq!(drive_in(cfg.clone(), steps, seed, PoolMemory::Reserve), 0);
    drive_in(cfg, steps, seed, PoolMemory::Grow)
}

fn drive_in(cfg: CacheConfig, steps: &[usize], seed: u64, memory: PoolMemory) -> usize {
    let mut rng = Rng::new(seed);
    let mut cache = KvSequenceCache::with_memory(cfg.clone(), memory).unwrap();
    let mut hist = History(vec![vec![Vec::new(); HEADS]; cfg.n_layers]);
    let mut doublings = 0;
    let mut last_slots: Vec<usize> = (0..cfg.n_layers)
        .map(|l| cache.pool(l).unwrap().slots())
        .collect();
    for &n in steps {
        let pos = cache.begin_step(n).unwrap();
        for layer in 0..cfg.n_layers {
            let k = rows(&mut rng, n);
            let v: Vec<f32> = k.iter().map(|x| x * 2.0 + 1.0).collect();
            for h in 0..HEADS {
                for t in 0..n {
                    let mut r = [0.0; DIM];
                    r.copy_from_slice(&k[(h * n + t) * DIM..(h * n + t + 1) * DIM]);
                    let hh = &mut hist.0[layer][h];
                    hh.truncate(pos + t);
                    hh.push(r);
                }
            }
            let spec = cache.update(layer, &k, &v).unwrap();
            let KeyLayout::Runs {
                read,
                read_base_pos,
                ..
            } = spec.keys
            else {
                panic!("sequence spec has runs")
            };
            assert_eq!(
                spec.positions,
                (pos..pos + n).collect::<Vec<_>>().as_slice()
            );
            let policy = cfg.layer(layer).unwrap().policy;
            let lo = match policy {
                LayerPolicy::Flat => 0,
                LayerPolicy::Ring { window } => (pos + 1).saturating_sub(window),
            };
            assert_eq!(read_base_pos, lo);
            assert_eq!(read.total(), pos + n - lo);
            for h in 0..HEADS {
                let mut r = 0;
                for run in read.as_slice() {
                    for s in run.start..run.end() {
                        let base = (h * spec.slots + s) * DIM;
                        let want = hist.0[layer][h][lo + r];
                        assert_eq!(
                            &spec.k.f32().unwrap()[base..base + DIM],
                            &want,
                            "layer {layer} head {h} row {r}"
                        );
                        let wv: Vec<f32> = want.iter().map(|x| x * 2.0 + 1.0).collect();
                        assert_eq!(&spec.v.f32().unwrap()[base..base + DIM], wv.as_slice());
                        r += 1;
                    }
                }
            }
            let slots = cache.pool(layer).unwrap().slots();
            assert!(slots <= cfg.depth(policy), "pool beyond depth");
            if slots > last_slots[layer] {
                doublings += 1;
                last_slots[layer] = slots;
            }
            let rows = cache.pool(layer).unwrap().rows();
            assert!(rows <= slots);
            assert_eq!(cache.nbytes(layer).unwrap(), 2 * HEADS * rows * DIM * 4);
        }
    }
    doublings
}

fn cfg(policies: &[LayerPolicy], capacity: usize, max_step: usize) -> CacheConfig {
    let layers = policies
        .iter()
        .map(|p| LayerConfig::new(*p, HEADS, DIM))
        .collect();
    let mut c = CacheConfig::new(capacity, policies.len(), layers);
    c.max_step = max_step;
    c.initial_capacity = 2;
    c
}

/// Prefill 7, chunked prefill 5+5, then decodes to the end of capacity.
fn schedule(capacity: usize) -> Vec<usize> {
    let mut s = vec![7, 5, 5];
    let mut len = 17;
    while len < capacity {
        s.push(1);
        len += 1;
    }
    s
}

#[test]
fn flat_cache_matches_history_across_doublings() {
    let d = drive(cfg(&[LayerPolicy::Flat], 64, 8), &schedule(64), 1);
    assert!(d >= 4, "only {d} doublings");
}

#[test]
fn ring_cache_wraps_and_serves_chunked_prefill() {
    let ring = LayerPolicy::Ring { window: 16 };
    // Depth 16 + 8 - 1 = 23: the 5-token chunks and the decodes wrap.
    let mut steps = schedule(40);
    steps.extend([8, 3, 8, 1, 8]);
    let d = drive(cfg(&[ring], 80, 8), &steps, 2);
    assert!(d >= 3, "only {d} doublings");
}

#[test]
fn mixed_config_keeps_each_layer_right() {
    let ring = LayerPolicy::Ring { window: 6 };
    let steps: Vec<usize> = (0..60).map(|i| [1, 4, 2, 3][i % 4]).collect();
    let total: usize = steps.iter().sum();
    let d = drive(
        cfg(
            &[
                ring,
                ring,
                LayerPolicy::Flat,
                LayerPolicy::Ring { window: 3 },
            ],
            total,
            4,
        ),
        &steps,
        3,
    );
    assert!(d >= 4);
}

#[test]
fn random_step_schedules_and_windows() {
    let mut rng = Rng::new(9);
    for round in 0..30 {
        let window = rng.range(1, 12);
        let max_step = rng.range(1, 6);
        let c = cfg(
            &[LayerPolicy::Ring { window }, LayerPolicy::Flat],
            200,
            max_step,
        );
        let steps: Vec<usize> = (0..40).map(|_| rng.range(1, max_step)).collect();
        drive(c, &steps, round);
    }
}

#[test]
fn bad_rows_are_refused_and_write_nothing() {
    let mut cache = KvSequenceCache::new(cfg(&[LayerPolicy::Flat], 16, 4)).unwrap();
    cache.begin_step(2).unwrap();
    let good: Vec<f32> = vec![1.0; HEADS * 2 * DIM];
    cache.update(0, &good, &good).unwrap();
    let before: Vec<u8> = cache.pool(0).unwrap().k().bytes.to_vec();
    let short = vec![5.0; HEADS * DIM];
    let e = cache.update(0, &short, &short).unwrap_err();
    assert!(
        matches!(&e, CacheError::Shape(m) if m.contains("expected 12") && m.contains("got 6")),
        "{e}"
    );
    let e = cache.update(0, &good, &short).unwrap_err();
    assert!(matches!(e, CacheError::Shape(_)));
    assert!(matches!(
        cache.update(1, &good, &good),
        Err(CacheError::InvalidArgument(_))
    ));
    assert_eq!(cache.pool(0).unwrap().k().bytes, before.as_slice());
    cache.rewind(0).unwrap();
    assert!(matches!(
        cache.update(0, &good, &good),
        Err(CacheError::StepProtocol(_))
    ));
    assert_eq!(cache.pool(0).unwrap().k().bytes, before.as_slice());
}

#[test]
fn a_pool_the_allocator_refuses_is_an_error_not_an_abort() {
    // Valid (every field within its bound) but far beyond any machine: 2^59 floats.
    let mut cfg = CacheConfig::new(
        1 << 31,
        1,
        vec![LayerConfig::new(LayerPolicy::Flat, 4096, 65536)],
    );
    cfg.initial_capacity = 1 << 31;
    assert_eq!(cfg.validate(), Ok(()));
    let e = KvSequenceCache::new(cfg.clone()).unwrap_err();
    assert!(
        matches!(&e, CacheError::OutOfCapacity(m) if m.contains("cannot allocate")),
        "{e}"
    );
    let e = offgraph_kv::KvCellCache::new(cfg, 1 << 20, 1).unwrap_err();
    assert!(matches!(e, CacheError::OutOfCapacity(_)), "{e}");
}

#[test]
fn growth_the_allocator_refuses_leaves_the_pool_as_it_was() {
    // 2^30 slots x 4096 x 65536 floats cannot be had; the pool keeps its rows.
    let mut pool = offgraph_kv::kv::Pool::new(4096, 65536, 1, 1 << 30).unwrap();
    let before = (pool.slots(), pool.nbytes());
    let e = pool.ensure(1 << 30).unwrap_err();
    assert!(matches!(e, CacheError::OutOfCapacity(_)), "{e}");
    assert_eq!((pool.slots(), pool.nbytes()), before);
}
