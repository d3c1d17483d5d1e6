//! Sequence ids are unique in the process: two caches never hand out one id,
//! and an id from one cache is refused (`UnknownSequence`) by every other,
//! changing nothing.

use std::collections::HashSet;

use offgraph_kv::{CacheConfig, CacheError, CellCache, KvCellCache, LayerConfig, LayerPolicy};

fn cfg() -> CacheConfig {
    let layers = vec![
        LayerConfig::new(LayerPolicy::Flat, 1, 4),
        LayerConfig::new(LayerPolicy::Ring { window: 3 }, 1, 4),
    ];
    let mut c = CacheConfig::new(32, 2, layers);
    c.max_step = 4;
    c
}

fn unknown<T: std::fmt::Debug>(r: Result<T, CacheError>) {
    assert!(
        matches!(r, Err(CacheError::UnknownSequence(_))),
        "expected UnknownSequence, got {r:?}"
    );
}

#[test]
fn two_caches_never_hand_out_one_id() {
    let mut a = CellCache::new(cfg(), 8, 4).unwrap();
    let mut b = CellCache::new(cfg(), 8, 4).unwrap();
    let x = a.seq_new().unwrap();
    let y = b.seq_new().unwrap();
    assert_ne!(x, y, "two caches handed out the same first id");
    let mut seen = HashSet::from([x, y]);
    for _ in 0..100 {
        for c in [&mut a, &mut b] {
            let s = c.seq_new().unwrap();
            assert!(seen.insert(s), "id {s} handed out twice");
            let t = c.seq_clone(s, None).unwrap();
            assert!(seen.insert(t), "id {t} handed out twice");
            c.seq_free(s).unwrap();
            c.seq_free(t).unwrap();
        }
        a.clear();
    }
    assert!(seen.iter().all(|&s| s <= i64::MAX as u64));
}

#[test]
fn another_caches_id_is_refused_by_every_verb_and_changes_nothing() {
    let mut a = CellCache::new(cfg(), 8, 2).unwrap();
    let mut b = CellCache::new(cfg(), 8, 2).unwrap();
    let x = a.seq_new().unwrap();
    let y = b.seq_new().unwrap();
    b.begin_step(&[y], &[0]).unwrap();
    let before = b.clone();
    unknown(b.seq_len(x));
    unknown(b.next_pos(x));
    unknown(b.held_ranges(x, usize::MAX));
    assert!(!b.is_live(x));
    assert_eq!(b, before);
    unknown(b.begin_step(&[x], &[0]));
    assert_eq!(b, before);
    unknown(b.begin_step(&[y, x], &[1, 0]));
    assert_eq!(b, before);
    unknown(b.seq_clone(x, None));
    assert_eq!(b, before);
    unknown(b.seq_rm(x, 0, None));
    assert_eq!(b, before);
    unknown(b.seq_free(x));
    assert_eq!(b, before);
    // And the other way round: a knows nothing of y.
    unknown(a.seq_free(y));
    assert!(a.is_live(x) && b.is_live(y));
}

#[test]
fn byte_layer_caches_and_loaded_sequences_too() {
    let mut a = KvCellCache::new(cfg(), 8, 2).unwrap();
    let mut b = KvCellCache::new(cfg(), 8, 2).unwrap();
    let x = a.cells_mut().seq_new().unwrap();
    a.begin_step(&[x], &[0]).unwrap();
    for l in 0..2 {
        a.update(l, &[0.5; 4], &[0.25; 4]).unwrap();
    }
    let blob = a.save_seq(x, None).unwrap();
    let y = b.load_seq(&blob).unwrap();
    assert_ne!(x, y);
    let before = format!("{:?}", b.cells());
    unknown(b.save_seq(x, None));
    unknown(b.cells_mut().seq_free(x));
    assert_eq!(format!("{:?}", b.cells()), before);
    unknown(a.save_seq(y, None));
}

#[test]
fn ids_are_unique_across_threads() {
    let handles: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(|| {
                let mut c = CellCache::new(cfg(), 8, 4).unwrap();
                (0..500)
                    .map(|_| {
                        let s = c.seq_new().unwrap();
                        c.seq_free(s).unwrap();
                        s
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut seen = HashSet::new();
    for h in handles {
        for s in h.join().unwrap() {
            assert!(seen.insert(s), "id {s} handed out twice");
        }
    }
}
