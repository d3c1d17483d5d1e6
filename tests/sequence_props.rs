//! Property test of `SequenceCache`: random configs and operation sequences,
//! checked against a naive model that learns slot -> position from the write
//! runs the cache reports.

mod common;

use common::Rng;
use offgraph_kv::{CacheConfig, CacheError, LayerConfig, LayerPolicy, SeqStepPlan, SequenceCache};

/// What the model believes each policy's pool holds.
struct Model {
    /// Per distinct policy: slot -> logical position written there last.
    slots: Vec<Vec<Option<usize>>>,
    length: usize,
    high_water: usize,
}

fn random_config(rng: &mut Rng) -> CacheConfig {
    let n_layers = rng.range(1, 6);
    let capacity = rng.range(1, 96);
    let max_step = rng.range(1, 16.min(capacity));
    let per_layer = rng.chance(0.7);
    let n_entries = if per_layer { n_layers } else { 1 };
    let layers = (0..n_entries)
        .map(|_| {
            let policy = if rng.chance(0.5) {
                LayerPolicy::Flat
            } else {
                LayerPolicy::Ring {
                    window: rng.range(1, 64.min(capacity)),
                }
            };
            LayerConfig::new(policy, 1, 4)
        })
        .collect();
    let mut cfg = CacheConfig::new(capacity, n_layers, layers);
    cfg.max_step = max_step;
    cfg.initial_capacity = rng.range(1, capacity);
    cfg
}

fn expected_visible(policy: LayerPolicy, q: usize) -> Vec<usize> {
    let lo = match policy {
        LayerPolicy::Flat => 0,
        LayerPolicy::Ring { window } => (q + 1).saturating_sub(window),
    };
    (lo..=q).collect()
}

/// Checks one plan against the model, after applying its writes.
fn check_plan(cache: &SequenceCache, model: &mut Model, layer: usize, plan: &SeqStepPlan) {
    let cfg = cache.config();
    let policy = cfg.layer(layer).unwrap().policy;
    let depth = cfg.depth(policy);
    assert_eq!(plan.depth, depth);
    let pidx = cache.policy_index(layer).unwrap();
    // Writes cover exactly the step's positions, in order, inside the pool.
    let written: Vec<usize> = plan
        .write
        .as_slice()
        .iter()
        .flat_map(|r| r.start..r.end())
        .collect();
    assert_eq!(written.len(), plan.n_tokens, "write runs cover the step");
    for (k, &slot) in written.iter().enumerate() {
        assert!(slot < depth, "slot {slot} beyond depth {depth}");
        model.slots[pidx][slot] = Some(plan.position + k);
    }
    // Read runs hold consecutive positions from read_base_pos, all intact.
    let read: Vec<usize> = plan
        .read
        .as_slice()
        .iter()
        .flat_map(|r| r.start..r.end())
        .collect();
    for (r, &slot) in read.iter().enumerate() {
        assert!(slot < depth);
        assert_eq!(
            model.slots[pidx][slot],
            Some(plan.read_base_pos + r),
            "read row {r} (slot {slot}) does not hold position {} (plan {plan:?})",
            plan.read_base_pos + r
        );
    }
    // Under the declared mask each query sees exactly its visible keys.
    for i in 0..plan.n_tokens {
        let q = plan.position + i;
        let seen: Vec<usize> = (0..read.len())
            .map(|r| plan.read_base_pos + r)
            .filter(|&p| plan.mask.visible(q, p))
            .collect();
        assert_eq!(
            seen,
            expected_visible(policy, q),
            "query {q} under {:?}",
            plan.mask
        );
    }
}

fn observable(c: &SequenceCache) -> (usize, usize, bool, Option<SeqStepPlan>) {
    (c.length(), c.high_water(), c.step_open(), c.plan(0).ok())
}

#[test]
fn random_operations_match_the_naive_model() {
    let mut rng = Rng::new(0x5eed_0001);
    let mut ops = 0usize;
    let mut rewinds_ok = 0usize;
    let mut refusals = 0usize;
    while ops < 12_000 {
        let cfg = random_config(&mut rng);
        let mut cache = SequenceCache::new(cfg.clone()).unwrap();
        let mut model = Model {
            slots: cache
                .policies()
                .iter()
                .map(|p| vec![None; cfg.depth(*p)])
                .collect(),
            length: 0,
            high_water: 0,
        };
        for _ in 0..rng.range(20, 200) {
            ops += 1;
            let before = observable(&cache);
            match rng.range(0, 9) {
                0..=4 => {
                    let n = rng.range(0, cfg.max_step + 2);
                    match cache.begin_step(n) {
                        Ok(pos) => {
                            assert!(n >= 1 && n <= cfg.max_step);
                            assert!(model.length + n <= cfg.capacity);
                            assert_eq!(pos, model.length);
                            model.length += n;
                            model.high_water = model.high_water.max(model.length);
                            // Every distinct policy writes, as a backend would.
                            for layer in 0..cfg.n_layers {
                                let first = (0..layer).all(|l| {
                                    cache.policy_index(l).unwrap()
                                        != cache.policy_index(layer).unwrap()
                                });
                                if first {
                                    let plan = cache.plan(layer).unwrap();
                                    check_plan(&cache, &mut model, layer, &plan);
                                }
                            }
                        }
                        Err(e) => {
                            refusals += 1;
                            let fits = model.length + n <= cfg.capacity;
                            let size_ok = n >= 1 && n <= cfg.max_step;
                            assert!(!(fits && size_ok), "refused a valid step: {e}");
                            assert!(matches!(
                                e,
                                CacheError::InvalidArgument(_) | CacheError::OutOfCapacity(_)
                            ));
                            assert_eq!(before, observable(&cache), "refusal changed state");
                        }
                    }
                }
                5 => {
                    // plan is pure: any layer, any number of times.
                    let layer = rng.range(0, cfg.n_layers);
                    match (cache.plan(layer), cache.plan(layer)) {
                        (Ok(a), Ok(b)) => assert_eq!(a, b),
                        (Err(e), Err(_)) => {
                            assert!(layer >= cfg.n_layers || !cache.step_open(), "{e}");
                        }
                        _ => panic!("plan is not pure"),
                    }
                }
                6 | 7 => {
                    // Rewinds within max_step of the high water always succeed.
                    let hw = model.high_water;
                    let target = if rng.chance(0.7) {
                        rng.range(hw.saturating_sub(cfg.max_step), hw)
                            .min(model.length)
                    } else {
                        rng.range(0, model.length + 2)
                    };
                    let within = target + cfg.max_step >= hw && target <= model.length;
                    match cache.rewind(target) {
                        Ok(()) => {
                            rewinds_ok += 1;
                            model.length = target;
                            assert!(!cache.step_open());
                        }
                        Err(e) => {
                            refusals += 1;
                            assert!(!within, "rewind to {target} (hw {hw}) refused: {e}");
                            assert!(matches!(e, CacheError::InvalidArgument(_)));
                            assert_eq!(before, observable(&cache));
                        }
                    }
                }
                8 => {
                    cache.clear();
                    model.length = 0;
                    model.high_water = 0;
                    assert!(cache.plan(0).is_err());
                }
                _ => {
                    let n = rng.range(0, cfg.capacity + 1);
                    assert_eq!(cache.can_extend(n), model.length + n <= cfg.capacity);
                }
            }
            assert_eq!(cache.length(), model.length);
        }
    }
    assert!(
        rewinds_ok > 500 && refusals > 500,
        "{rewinds_ok} {refusals}"
    );
    println!("{ops} operations, {rewinds_ok} rewinds, {refusals} refusals");
}
