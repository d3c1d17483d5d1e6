//! A layer the open step has not written has no spec (so nothing attends
//! it): `StepProtocol` naming the layer, never an earlier step's rows.

use offgraph_kv::{
    CacheConfig, CacheError, KvCellCache, KvSequenceCache, LayerConfig, LayerPolicy,
};

fn cfg() -> CacheConfig {
    let layers = vec![
        LayerConfig::new(LayerPolicy::Flat, 1, 4),
        LayerConfig::new(LayerPolicy::Ring { window: 3 }, 1, 4),
    ];
    let mut c = CacheConfig::new(32, 2, layers);
    c.max_step = 4;
    c
}

fn refused<T: std::fmt::Debug>(r: Result<T, CacheError>, layer: usize) {
    match r {
        Err(CacheError::StepProtocol(m)) => {
            assert!(m.contains(&format!("layer {layer}")), "{m:?}");
            assert!(m.contains("not updated"), "{m:?}");
        }
        other => panic!("expected StepProtocol for layer {layer}, got {other:?}"),
    }
}

#[test]
fn sequence_cache_refuses_a_layer_not_written_in_the_open_step() {
    let mut c = KvSequenceCache::new(cfg()).unwrap();
    let rows = [1.0f32; 4];
    c.begin_step(1).unwrap();
    refused(c.spec(0), 0);
    c.update(0, &rows, &rows).unwrap();
    assert!(c.spec(0).is_ok());
    refused(c.spec(1), 1);
    c.update(1, &rows, &rows).unwrap();
    assert!(c.spec(1).is_ok());
    // The next step: an earlier step's write does not count.
    c.begin_step(2).unwrap();
    refused(c.spec(0), 0);
    refused(c.spec(1), 1);
    // A refused update writes nothing and marks nothing.
    assert!(matches!(
        c.update(0, &rows, &rows),
        Err(CacheError::Shape(_))
    ));
    refused(c.spec(0), 0);
    c.update(0, &[2.0; 8], &[2.0; 8]).unwrap();
    assert!(c.spec(0).is_ok());
    // A refused begin_step leaves the step open, its written layers too.
    assert!(c.begin_step(99).is_err());
    assert!(c.spec(0).is_ok());
    refused(c.spec(1), 1);
    // A rewind closes the step; a new one starts unwritten.
    c.rewind(1).unwrap();
    assert!(matches!(c.spec(0), Err(CacheError::StepProtocol(_))));
    c.begin_step(1).unwrap();
    refused(c.spec(0), 0);
}

#[test]
fn cell_cache_refuses_a_layer_not_written_in_the_open_step() {
    let mut c = KvCellCache::new(cfg(), 16, 2).unwrap();
    let s = c.cells_mut().seq_new().unwrap();
    let rows = [1.0f32; 4];
    c.begin_step(&[s], &[0]).unwrap();
    refused(c.spec(0), 0);
    c.update(0, &rows, &rows).unwrap();
    c.update(1, &rows, &rows).unwrap();
    assert!(c.spec(0).is_ok() && c.spec(1).is_ok());
    // Opened through the bookkeeping, and through the byte layer.
    c.cells_mut().begin_step(&[s], &[1]).unwrap();
    refused(c.spec(0), 0);
    refused(c.spec(1), 1);
    c.update(1, &rows, &rows).unwrap();
    refused(c.spec(0), 0);
    assert!(c.spec(1).is_ok());
    c.begin_step(&[s], &[2]).unwrap();
    refused(c.spec(1), 1);
    // seq_new does not close the step: what was written stays attendable.
    c.update(1, &rows, &rows).unwrap();
    c.cells_mut().seq_new().unwrap();
    assert!(c.spec(1).is_ok());
}
