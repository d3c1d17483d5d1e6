//! `held_range` / `held_runs`: what a layer holds, asked of the cache itself.
//! Random steps and rewinds (some deeper than the last step) against a model
//! history: every position the cache says it holds reads back the row last
//! written there, with or without an open step; the next step's window is
//! always held; refusals are typed and change nothing.

mod common;

use common::Rng;
use offgraph_kv::{CacheConfig, CacheError, KvSequenceCache, LayerConfig, LayerPolicy};

const HEADS: usize = 2;
const DIM: usize = 2;
const CAPACITY: usize = 200;
const MAX_STEP: usize = 4;

fn cfg() -> CacheConfig {
    let ring = LayerConfig::new(LayerPolicy::Ring { window: 8 }, HEADS, DIM);
    let flat = LayerConfig::new(LayerPolicy::Flat, HEADS, DIM);
    let mut c = CacheConfig::new(CAPACITY, 2, vec![ring, flat]);
    c.max_step = MAX_STEP;
    c.initial_capacity = 2;
    c
}

/// K of head `h` at `pos`, as the pool holds it.
fn pool_row(cache: &KvSequenceCache, layer: usize, h: usize, slot: usize) -> Vec<f32> {
    let pool = cache.pool(layer).unwrap();
    let base = (h * pool.slots() + slot) * DIM;
    let k = pool.k().f32().expect("a float32 pool");
    k[base..base + DIM].to_vec()
}

fn check_held(cache: &KvSequenceCache, hist: &[Vec<Vec<f32>>]) {
    for (layer, rows) in hist.iter().enumerate() {
        let held = cache.held_range(layer).unwrap();
        assert_eq!(held.end, cache.length());
        if layer == 1 {
            assert_eq!(held.start, 0, "a flat layer holds everything");
        } else {
            // The next step's earliest query needs the window - 1 positions below it.
            assert!(held.start <= cache.length().saturating_sub(7), "{held:?}");
            // A ring holds at most its depth, window + max_step - 1.
            let depth = 8 + MAX_STEP - 1;
            assert!(held.len() <= depth, "{held:?}");
        }
        let runs = cache.held_runs(layer, held.start, held.end).unwrap();
        assert_eq!(runs.total(), held.len());
        let mut pos = held.start;
        for run in runs.as_slice() {
            for slot in run.start..run.end() {
                for h in 0..HEADS {
                    assert_eq!(
                        pool_row(cache, layer, h, slot),
                        rows[pos][h * DIM..(h + 1) * DIM],
                        "layer {layer} position {pos}"
                    );
                }
                pos += 1;
            }
        }
        // Any sub-range is the matching slice of the whole.
        if held.len() >= 2 {
            let mid = held.start + held.len() / 2;
            let a = cache.held_runs(layer, held.start, mid).unwrap();
            let b = cache.held_runs(layer, mid, held.end).unwrap();
            assert_eq!(a.total() + b.total(), held.len());
        }
    }
}

#[test]
fn held_rows_match_history_across_steps_and_deep_rewinds() {
    let mut rng = Rng::new(11);
    let mut cache = KvSequenceCache::new(cfg()).unwrap();
    // Per layer, per position: the HEADS * DIM values last written there.
    let mut hist: Vec<Vec<Vec<f32>>> = vec![Vec::new(); 2];
    let mut deep = 0;
    for _ in 0..400 {
        if cache.length() > 0 && rng.chance(0.25) {
            let lo = cache.sequence().min_rewind();
            let target = rng.range(lo, cache.length());
            if cache.length() - target > MAX_STEP / 2 {
                deep += 1;
            }
            cache.rewind(target).unwrap();
            for h in &mut hist {
                h.truncate(target);
            }
            assert!(!cache.sequence().step_open());
            check_held(&cache, &hist);
            continue;
        }
        let n = rng.range(1, MAX_STEP);
        if !cache.can_extend(n) {
            cache.clear();
            hist.iter_mut().for_each(Vec::clear);
            assert_eq!(cache.held_range(0).unwrap(), 0..0);
            continue;
        }
        cache.begin_step(n).unwrap();
        for (layer, h) in hist.iter_mut().enumerate() {
            let k: Vec<f32> = (0..HEADS * n * DIM).map(|_| rng.f32()).collect();
            for t in 0..n {
                let mut row = Vec::with_capacity(HEADS * DIM);
                for hd in 0..HEADS {
                    let at = (hd * n + t) * DIM;
                    row.extend_from_slice(&k[at..at + DIM]);
                }
                h.push(row);
            }
            cache.update(layer, &k, &k).unwrap();
        }
        check_held(&cache, &hist);
    }
    assert!(deep > 10, "only {deep} rewinds deeper than half a step");
}

fn snapshot(c: &KvSequenceCache) -> String {
    format!(
        "{} {} {} {:?} {:?} {:?}",
        c.length(),
        c.sequence().high_water(),
        c.generation(),
        c.plan(0),
        c.held_range(0),
        c.held_range(1)
    )
}

#[test]
fn ranges_not_held_are_refused_and_change_nothing() {
    let mut cache = KvSequenceCache::new(cfg()).unwrap();
    for _ in 0..10 {
        cache.begin_step(4).unwrap();
        for layer in 0..2 {
            cache.update(layer, &[0.0; 16], &[0.0; 16]).unwrap();
        }
    }
    cache.rewind(36).unwrap(); // a deeper rewind than the last step; no step open
    assert_eq!(cache.held_range(0).unwrap(), 29..36); // 40 - depth 11
    assert_eq!(cache.held_range(1).unwrap(), 0..36);
    // The ring wraps at depth 11: positions 29..36 sit in slots 7..11 and 0..3.
    let runs = cache.held_runs(0, 29, 36).unwrap();
    assert_eq!(
        runs.as_slice()
            .iter()
            .map(|r| (r.start, r.len))
            .collect::<Vec<_>>(),
        [(7, 4), (0, 3)]
    );
    assert!(cache.held_runs(0, 30, 30).unwrap().is_empty());
    let cases: [(usize, usize, usize, &str); 5] = [
        (0, 28, 36, "[28, 36)"),
        (0, 29, 37, "[29, 37)"),
        (1, 0, 37, "[0, 37)"),
        (0, 33, 31, "[33, 31)"),
        (2, 0, 1, "layer 2"),
    ];
    for (layer, lo, hi, says) in cases {
        let before = snapshot(&cache);
        let err = cache.held_runs(layer, lo, hi).unwrap_err();
        assert!(
            matches!(&err, CacheError::InvalidArgument(m) if m.contains(says)),
            "{err:?}"
        );
        assert_eq!(before, snapshot(&cache));
    }
    let before = snapshot(&cache);
    assert!(matches!(
        cache.held_range(2),
        Err(CacheError::InvalidArgument(_))
    ));
    assert_eq!(before, snapshot(&cache));
    cache.clear();
    assert_eq!(cache.held_range(0).unwrap(), 0..0);
    assert!(cache.held_runs(0, 0, 1).is_err());
}

#[test]
fn a_ring_window_above_the_capacity_holds_every_position() {
    let ring = LayerConfig::new(LayerPolicy::Ring { window: 64 }, HEADS, DIM);
    let mut c = CacheConfig::new(16, 1, vec![ring]);
    c.max_step = 4;
    let mut cache = KvSequenceCache::new(c).unwrap();
    for _ in 0..4 {
        cache.begin_step(4).unwrap();
        cache.update(0, &[1.0; 16], &[1.0; 16]).unwrap();
    }
    assert_eq!(cache.held_range(0).unwrap(), 0..16);
    let runs = cache.held_runs(0, 0, 16).unwrap();
    assert_eq!(runs.as_slice().len(), 1);
    assert_eq!((runs.as_slice()[0].start, runs.as_slice()[0].len), (0, 16));
    cache.rewind(3).unwrap(); // a full layer rewinds anywhere
    assert_eq!(cache.held_range(0).unwrap(), 0..3);
}
