//! Every refusal of the config and the sequence cache: a typed error whose
//! message names the bad value, and no change to the observable state.

use offgraph_kv::{CacheConfig, CacheError, LayerConfig, LayerPolicy, SequenceCache};

fn gemma_like() -> CacheConfig {
    let ring = LayerConfig::new(LayerPolicy::Ring { window: 8 }, 2, 16);
    let flat = LayerConfig::new(LayerPolicy::Flat, 2, 16);
    let mut cfg = CacheConfig::new(64, 3, vec![ring, ring, flat]);
    cfg.max_step = 4;
    cfg
}

fn state(c: &SequenceCache) -> String {
    format!(
        "{} {} {} {:?} {:?}",
        c.length(),
        c.high_water(),
        c.generation(),
        c.plan(0),
        c.plan(2)
    )
}

fn assert_config_refused(mutate: impl Fn(&mut CacheConfig), field: &str, value: &str) {
    let mut cfg = gemma_like();
    mutate(&mut cfg);
    for err in [
        cfg.validate().unwrap_err(),
        SequenceCache::new(cfg.clone()).unwrap_err(),
    ] {
        match &err {
            CacheError::InvalidConfig(m) => {
                assert!(m.contains(field), "{m:?} should name {field}");
                assert!(m.contains(value), "{m:?} should name {value}");
            }
            other => panic!("expected InvalidConfig, got {other:?}"),
        }
    }
}

#[test]
fn bad_config_fields_are_refused_by_name() {
    assert_config_refused(|c| c.capacity = 0, "capacity", "0");
    assert_config_refused(|c| c.n_layers = 0, "n_layers", "0");
    assert_config_refused(|c| c.n_layers = 5, "layers", "3");
    assert_config_refused(|c| c.layers.clear(), "layers", "0");
    assert_config_refused(|c| c.max_step = 0, "max_step", "0");
    assert_config_refused(|c| c.max_step = 65, "max_step", "65");
    assert_config_refused(|c| c.initial_capacity = 0, "initial_capacity", "0");
    assert_config_refused(|c| c.layers[1].n_kv_heads = 0, "layers[1].n_kv_heads", "0");
    assert_config_refused(|c| c.layers[2].head_dim = 0, "layers[2].head_dim", "0");
    assert_config_refused(
        |c| c.layers[0].policy = LayerPolicy::Ring { window: 0 },
        "layers[0].policy.window",
        "0",
    );
}

fn refused(
    c: &mut SequenceCache,
    f: impl FnOnce(&mut SequenceCache) -> Result<(), CacheError>,
) -> CacheError {
    let before = state(c);
    let err = f(c).unwrap_err();
    assert_eq!(before, state(c), "a refusal changed the state ({err})");
    err
}

#[test]
fn step_and_rewind_refusals_change_nothing() {
    let mut c = SequenceCache::new(gemma_like()).unwrap();
    // plan with no open step: fresh.
    let e = refused(&mut c, |c| c.plan(0).map(|_| ()));
    assert!(matches!(e, CacheError::StepProtocol(_)), "{e:?}");
    let e = refused(&mut c, |c| c.begin_step(0).map(|_| ()));
    assert!(
        matches!(&e, CacheError::InvalidArgument(m) if m.contains("got 0")),
        "{e:?}"
    );
    let e = refused(&mut c, |c| c.begin_step(5).map(|_| ()));
    assert!(
        matches!(&e, CacheError::InvalidArgument(m) if m.contains("got 5")),
        "{e:?}"
    );
    c.begin_step(4).unwrap();
    // A layer out of range.
    let e = refused(&mut c, |c| c.plan(3).map(|_| ()));
    assert!(
        matches!(&e, CacheError::InvalidArgument(m) if m.contains("layer 3")),
        "{e:?}"
    );
    // Fill to capacity, then overflow; the refused step leaves the previous one open.
    while c.length() + 4 <= 64 {
        c.begin_step(4).unwrap();
    }
    let open = c.plan(0).unwrap();
    let e = refused(&mut c, |c| c.begin_step(1).map(|_| ()));
    assert!(
        matches!(&e, CacheError::OutOfCapacity(m) if m.contains("64")),
        "{e:?}"
    );
    assert_eq!(c.plan(0).unwrap(), open);
    // Rewind above the length, and below the ring bound (high water 64 - max_step 4 = 60).
    let e = refused(&mut c, |c| c.rewind(65));
    assert!(
        matches!(&e, CacheError::InvalidArgument(m) if m.contains("65")),
        "{e:?}"
    );
    assert_eq!(c.min_rewind(), 60);
    let e = refused(&mut c, |c| c.rewind(59));
    assert!(
        matches!(&e, CacheError::InvalidArgument(m) if m.contains("59")),
        "{e:?}"
    );
    c.rewind(60).unwrap();
    // After rewind, plan errors.
    let e = refused(&mut c, |c| c.plan(0).map(|_| ()));
    assert!(matches!(e, CacheError::StepProtocol(_)));
    c.begin_step(2).unwrap();
    c.clear();
    let e = refused(&mut c, |c| c.plan(2).map(|_| ()));
    assert!(matches!(e, CacheError::StepProtocol(_)));
    // After a clear the ring bound resets.
    assert_eq!(c.min_rewind(), 0);
}

#[test]
fn ring_step_that_wraps_is_two_write_runs() {
    let mut cfg = gemma_like();
    cfg.capacity = 40;
    let mut c = SequenceCache::new(cfg).unwrap(); // ring depth 8 + 4 - 1 = 11
    for _ in 0..2 {
        c.begin_step(4).unwrap();
    }
    c.begin_step(4).unwrap(); // positions 8..12 -> slots 8,9,10,0
    let p = c.plan(0).unwrap();
    assert_eq!(p.depth, 11);
    assert_eq!(p.write.len(), 2);
    assert_eq!(p.write.as_slice()[0].start, 8);
    assert_eq!(p.write.as_slice()[1].len, 1);
    assert_eq!(p.read_base_pos, 1);
    assert_eq!(p.window(), Some(8));
    assert_eq!(p.mask, offgraph_kv::MaskKind::Window(8));
    let flat = c.plan(2).unwrap();
    assert_eq!(flat.read_base_pos, 0);
    assert_eq!(flat.read.total(), 12);
    assert_eq!(flat.mask, offgraph_kv::MaskKind::Causal);
}
