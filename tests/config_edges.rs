//! The config edges the upstream design accepts: a ring window at or above the
//! capacity behaves as a full layer, and `initial_capacity` above a layer's
//! depth is clamped.

use offgraph_kv::{
    attend, AttendOptions, CacheConfig, CellCache, KvCellCache, KvSequenceCache, LayerConfig,
    LayerPolicy, MaskKind, SequenceCache,
};

fn one_layer(policy: LayerPolicy, capacity: usize, max_step: usize, initial: usize) -> CacheConfig {
    let mut c = CacheConfig::new(capacity, 1, vec![LayerConfig::new(policy, 2, 8)]);
    c.max_step = max_step;
    c.initial_capacity = initial;
    c
}

fn rows(n: usize, seed: usize) -> Vec<f32> {
    (0..2 * n * 8)
        .map(|i| (((i + 31 * seed) * 2_654_435_761) % 1000) as f32 / 500.0 - 1.0)
        .collect()
}

#[test]
fn upstream_ring_64_in_a_32_token_cache_with_initial_capacity_512() {
    let cfg = one_layer(LayerPolicy::Ring { window: 64 }, 32, 4, 512);
    cfg.validate().unwrap();
    // Depth is bounded by the capacity; the pool starts clamped to it.
    assert_eq!(cfg.depth(LayerPolicy::Ring { window: 64 }), 32);
    let mut kv = KvSequenceCache::new(cfg).unwrap();
    assert_eq!(kv.pool(0).unwrap().slots(), 32);
    assert_eq!(kv.pool(0).unwrap().depth(), 32);
    let mut step = 0;
    while kv.can_extend(4) {
        let pos = kv.begin_step(4).unwrap();
        let p = kv.plan(0).unwrap();
        // A full layer: every held position is visible, the read starts at 0,
        // and the mask is never a window.
        assert_eq!(p.read_base_pos, 0);
        assert_eq!(p.valid_len(), pos + 4);
        assert_eq!(p.mask, MaskKind::Causal);
        kv.update(0, &rows(4, step), &rows(4, step + 100)).unwrap();
        step += 1;
    }
    assert_eq!(kv.length(), 32);
    // It never wraps, so it never bounds a rewind.
    assert_eq!(kv.sequence().min_rewind(), 0);
    kv.rewind(0).unwrap();
}

#[test]
fn a_window_at_or_above_capacity_attends_exactly_as_a_flat_layer() {
    for window in [32, 33, 1 << 40] {
        let mut ring =
            KvSequenceCache::new(one_layer(LayerPolicy::Ring { window }, 32, 8, 4)).unwrap();
        let mut flat = KvSequenceCache::new(one_layer(LayerPolicy::Flat, 32, 8, 4)).unwrap();
        let q: Vec<f32> = rows(8, 7);
        let opts = AttendOptions::default();
        for (i, n) in [8, 8, 3, 8, 1, 1, 3].into_iter().enumerate() {
            ring.begin_step(n).unwrap();
            flat.begin_step(n).unwrap();
            let (k, v) = (rows(n, i), rows(n, i + 50));
            let qn = &q[..2 * n * 8].to_vec();
            let a = {
                let spec = ring.update(0, &k, &v).unwrap();
                attend(qn, [2, n, 8], &spec, &opts).unwrap()
            };
            let b = {
                let spec = flat.update(0, &k, &v).unwrap();
                attend(qn, [2, n, 8], &spec, &opts).unwrap()
            };
            assert_eq!(a, b, "window {window}, step {i}");
        }
    }
}

#[test]
fn initial_capacity_above_every_depth_is_clamped_not_refused() {
    let ring = LayerConfig::new(LayerPolicy::Ring { window: 4 }, 1, 4);
    let flat = LayerConfig::new(LayerPolicy::Flat, 1, 4);
    let mut cfg = CacheConfig::new(64, 2, vec![ring, flat]);
    cfg.max_step = 2;
    cfg.initial_capacity = 10_000;
    let kv = KvSequenceCache::new(cfg.clone()).unwrap();
    assert_eq!(kv.pool(0).unwrap().slots(), 5); // window + max_step - 1
    assert_eq!(kv.pool(1).unwrap().slots(), 64);
    let kc = KvCellCache::new(cfg, 16, 4).unwrap();
    assert_eq!(kc.pool(0).unwrap().slots(), 16);
}

#[test]
fn cell_cache_with_a_huge_window_keeps_every_position_visible() {
    let cfg = one_layer(LayerPolicy::Ring { window: usize::MAX }, 32, 4, 512);
    let mut c = CellCache::new(cfg.clone(), 64, 4).unwrap();
    let s = c.seq_new().unwrap();
    for p in (0..40).step_by(4) {
        c.begin_step(&[s; 4], &[p, p + 1, p + 2, p + 3]).unwrap();
    }
    let plan = c.plan(0).unwrap();
    let mut seen = Vec::new();
    plan.visible_into(3, &mut seen).unwrap();
    let n: usize = seen.iter().map(|r| r.len).sum();
    assert_eq!(n, 40, "the last token sees all 40 positions");
    assert_eq!(c.seq_len(s).unwrap(), 40);
    // The plain sequence cache agrees with the flat semantics too.
    let mut sc = SequenceCache::new(cfg).unwrap();
    sc.begin_step(4).unwrap();
    assert_eq!(sc.plan(0).unwrap().read_base_pos, 0);
}
