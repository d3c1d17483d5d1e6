//! Snapshots: round trips restore exactly what the next step reads, every
//! refusal leaves the cache unchanged, and a cell sequence moves between caches.

mod common;

use common::snap::{cell_feed, cell_step, cfg, forged, rows, D, H, MIXED};
use offgraph_kv::kv::snapshot::FORMAT_VERSION;
use offgraph_kv::{
    attend, snapshot_info, AttendOptions, CacheConfig, CacheError, KvCellCache, KvSequenceCache,
    LayerPolicy,
};

/// Feeds positions `[len, to)` in steps of at most `step` tokens.
fn feed(c: &mut KvSequenceCache, to: usize, step: usize) {
    while c.length() < to {
        let n = step.min(to - c.length());
        let p = c.begin_step(n).unwrap();
        for l in 0..c.config().n_layers {
            c.update(l, &rows(l, p, n, false), &rows(l, p, n, true))
                .unwrap();
        }
    }
}

/// The outputs of one more step of `n` tokens on every layer.
fn next_step(c: &mut KvSequenceCache, n: usize) -> Vec<Vec<f32>> {
    let p = c.begin_step(n).unwrap();
    let opts = AttendOptions {
        threads: Some(1),
        ..Default::default()
    };
    (0..c.config().n_layers)
        .map(|l| {
            let spec = c
                .update(l, &rows(l, p, n, false), &rows(l, p, n, true))
                .unwrap();
            let q = rows(l + 7, p, n, false);
            attend(&q, [H, n, D], &spec, &opts).unwrap()
        })
        .collect()
}

/// Observable state: bookkeeping plus every pool's bytes.
fn state(c: &KvSequenceCache) -> String {
    let mut s = format!("{:?}", c.sequence());
    for l in 0..c.config().n_layers {
        let p = c.pool(l).unwrap();
        s.push_str(&format!("{:?}{:?}", p.k(), p.v()));
    }
    s
}

#[test]
fn round_trip_restores_the_next_step() {
    for len in [0usize, 1, 4, 7, 13, 40] {
        let mut a = KvSequenceCache::new(cfg(&MIXED, 3)).unwrap();
        feed(&mut a, len, 3);
        let snap = a.save_state(None).unwrap();
        let mut b = KvSequenceCache::new(cfg(&MIXED, 3)).unwrap();
        b.load_state(&snap).unwrap();
        assert_eq!(b.length(), len);
        let info = snapshot_info(&snap).unwrap();
        assert_eq!((info.start, info.end, info.complete), (0, len, true));
        if len > 0 {
            assert_eq!(next_step(&mut a, 3), next_step(&mut b, 3), "len {len}");
        }
    }
}

#[test]
fn ring_layers_carry_only_the_tail_the_next_step_needs() {
    let mut a = KvSequenceCache::new(cfg(&[LayerPolicy::Ring { window: 8 }], 4)).unwrap();
    feed(&mut a, 100, 4);
    let ring = a.save_state(None).unwrap();
    let mut f = KvSequenceCache::new(cfg(&[LayerPolicy::Flat], 4)).unwrap();
    feed(&mut f, 100, 4);
    let flat = f.save_state(None).unwrap();
    let row = H * D * 4 * 2;
    assert_eq!(flat.len() - ring.len(), (100 - 7) * row);
    // Loaded: a multi-token step reads the same; a rewind below the length is refused.
    let mut b = KvSequenceCache::new(cfg(&[LayerPolicy::Ring { window: 8 }], 4)).unwrap();
    b.load_state(&ring).unwrap();
    assert!(matches!(b.rewind(99), Err(CacheError::InvalidArgument(_))));
    assert_eq!(next_step(&mut a, 4), next_step(&mut b, 4));
}

#[test]
fn partial_snapshots_equal_a_cache_that_stopped_there() {
    let mut a = KvSequenceCache::new(cfg(&MIXED, 4)).unwrap();
    feed(&mut a, 21, 4);
    for upto in [18usize, 20, 21] {
        let snap = a.save_state(Some(upto)).unwrap();
        let mut b = KvSequenceCache::new(cfg(&MIXED, 4)).unwrap();
        b.load_state(&snap).unwrap();
        let mut r = KvSequenceCache::new(cfg(&MIXED, 4)).unwrap();
        feed(&mut r, upto, 4);
        assert_eq!(next_step(&mut b, 2), next_step(&mut r, 2), "upto {upto}");
    }
    // Too far back for the ring (window 8 + max_step 4 - 1 = 11 slots), or past the length.
    assert!(matches!(
        a.save_state(Some(5)),
        Err(CacheError::InvalidArgument(_))
    ));
    assert!(matches!(
        a.save_state(Some(22)),
        Err(CacheError::InvalidArgument(_))
    ));
}

#[test]
fn chains_of_ranges_load_as_one() {
    let mut a = KvSequenceCache::new(cfg(&MIXED, 4)).unwrap();
    feed(&mut a, 30, 4);
    let chunks: Vec<Vec<u8>> = (0..30)
        .step_by(6)
        .map(|s| a.save_range(s, s + 6).unwrap())
        .collect();
    // Early chunks lost their ring rows; the last ones are complete.
    assert!(!snapshot_info(&chunks[0]).unwrap().complete);
    assert!(snapshot_info(&chunks[4]).unwrap().complete);
    let refs: Vec<&[u8]> = chunks.iter().map(|c| c.as_slice()).collect();
    let mut b = KvSequenceCache::new(cfg(&MIXED, 4)).unwrap();
    // A chain ending on an incomplete member is refused, unchanged.
    let before = state(&b);
    let e = b.load_states(&refs[..1]).unwrap_err();
    assert!(matches!(e, CacheError::Snapshot(_)), "{e}");
    assert_eq!(state(&b), before);
    // Out of order is refused too.
    let e = b.load_states(&[refs[1], refs[0]]).unwrap_err();
    assert!(matches!(e, CacheError::Snapshot(_)), "{e}");
    assert_eq!(state(&b), before);
    b.load_states(&refs).unwrap();
    assert_eq!(b.length(), 30);
    assert_eq!(next_step(&mut a, 3), next_step(&mut b, 3));
    // Loading chunk by chunk into a growing cache works when each is complete.
    let mut c = KvSequenceCache::new(cfg(&[LayerPolicy::Flat], 4)).unwrap();
    let mut f = KvSequenceCache::new(cfg(&[LayerPolicy::Flat], 4)).unwrap();
    feed(&mut f, 12, 4);
    c.load_state(&f.save_range(0, 5).unwrap()).unwrap();
    c.load_state(&f.save_range(5, 12).unwrap()).unwrap();
    assert_eq!(next_step(&mut c, 2), next_step(&mut f, 2));
}

fn refused(c: &mut KvSequenceCache, data: &[u8], needle: &str) {
    let before = state(c);
    match c.load_state(data) {
        Err(CacheError::Snapshot(m)) => assert!(m.contains(needle), "{m:?} lacks {needle:?}"),
        other => panic!("expected a Snapshot error containing {needle:?}, got {other:?}"),
    }
    assert_eq!(state(c), before);
}

#[test]
fn bad_snapshots_are_refused_and_change_nothing() {
    let mut a = KvSequenceCache::new(cfg(&MIXED, 3)).unwrap();
    feed(&mut a, 10, 3);
    let snap = a.save_state(None).unwrap();
    let mut b = KvSequenceCache::new(cfg(&MIXED, 3)).unwrap();
    for cut in [0, 5, 15, 16, 40, snap.len() / 2, snap.len() - 1] {
        let e = b.load_state(&snap[..cut]);
        assert!(
            matches!(e, Err(CacheError::Snapshot(_))),
            "cut {cut}: {e:?}"
        );
    }
    refused(&mut b, &snap[..snap.len() - 1], "checksum");
    for at in [20, 100, snap.len() / 2, snap.len() - 2] {
        let mut d = snap.clone();
        d[at] ^= 0x10;
        refused(&mut b, &d, "checksum");
    }
    let mut magic = snap.clone();
    magic[0] = b'X';
    refused(&mut b, &magic, "magic");
    let newer = forged(&snap, 8, &(FORMAT_VERSION + 1).to_le_bytes());
    refused(&mut b, &newer, "newer");
    // Foreign: another head_dim, another window, another layer count.
    for other in [
        cfg(&[LayerPolicy::Flat, LayerPolicy::Ring { window: 8 }], 3),
        cfg(
            &[
                LayerPolicy::Flat,
                LayerPolicy::Ring { window: 9 },
                LayerPolicy::Ring { window: 5 },
            ],
            3,
        ),
    ] {
        let mut o = KvSequenceCache::new(other).unwrap();
        refused(&mut o, &snap, "foreign");
    }
    let mut wide = cfg(&MIXED, 3);
    wide.layers[0].head_dim = 8;
    refused(&mut KvSequenceCache::new(wide).unwrap(), &snap, "foreign");
    // A cell snapshot is another kind.
    let mut kc = KvCellCache::new(cfg(&MIXED, 3), 32, 4).unwrap();
    let s = kc.cells_mut().seq_new().unwrap();
    kc.begin_step(&[s], &[0]).unwrap();
    for l in 0..3 {
        kc.update(l, &rows(l, 0, 1, false), &rows(l, 0, 1, true))
            .unwrap();
    }
    refused(&mut b, &kc.save_seq(s, None).unwrap(), "kind");
    // A non-empty cache, and a cache that cannot hold the end.
    let mut full = KvSequenceCache::new(cfg(&MIXED, 3)).unwrap();
    feed(&mut full, 2, 3);
    refused(&mut full, &snap, "length");
    // Crafted sizes with a valid checksum: an end far past the capacity, a
    // from that claims more rows than the data holds.
    let header = 16 + 3 * 27;
    let huge = forged(&snap, header + 8, &(1u64 << 40).to_le_bytes());
    refused(&mut b, &huge, "");
    let from = forged(&snap, header + 24, &0u64.to_le_bytes());
    let mut b2 = KvSequenceCache::new(cfg(&MIXED, 3)).unwrap();
    let before = state(&b2);
    assert!(matches!(b2.load_state(&from), Err(CacheError::Snapshot(_))));
    assert_eq!(state(&b2), before);
    // The intact snapshot still loads after all of that.
    b.load_state(&snap).unwrap();
    assert_eq!(next_step(&mut a, 2), next_step(&mut b, 2));
}

fn cell_cfg() -> CacheConfig {
    cfg(&MIXED, 3)
}

#[test]
fn a_cell_sequence_moves_between_caches() {
    let mut a = KvCellCache::new(cell_cfg(), 64, 8).unwrap();
    let s = a.cells_mut().seq_new().unwrap();
    cell_feed(&mut a, s, 0, 20, 3);
    let t = a.cells_mut().seq_clone(s, Some(18)).unwrap();
    cell_feed(&mut a, t, 18, 23, 3);
    a.cells_mut().seq_rm(s, 3, Some(5)).unwrap(); // a gap in the full table
    let blob_s = a.save_seq(s, None).unwrap();
    let blob_t = a.save_seq(t, None).unwrap();
    // The target holds another sequence, so cells differ.
    let mut b = KvCellCache::new(cell_cfg(), 64, 8).unwrap();
    let o = b.cells_mut().seq_new().unwrap();
    cell_feed(&mut b, o, 0, 7, 3);
    let s2 = b.load_seq(&blob_s).unwrap();
    let t2 = b.load_seq(&blob_t).unwrap();
    b.cells().audit().unwrap();
    for (x, y) in [(s, s2), (t, t2)] {
        assert_eq!(
            a.cells().next_pos(x).unwrap(),
            b.cells().next_pos(y).unwrap()
        );
        assert_eq!(a.cells().seq_len(x).unwrap(), b.cells().seq_len(y).unwrap());
        assert_eq!(
            a.cells().held_ranges(x, usize::MAX).unwrap(),
            b.cells().held_ranges(y, usize::MAX).unwrap()
        );
        let p = a.cells().next_pos(x).unwrap();
        let (oa, ob) = (cell_step(&mut a, x, p), cell_step(&mut b, y, p));
        for (ra, rb) in oa.iter().zip(&ob) {
            for (u, v) in ra.iter().zip(rb) {
                assert!((u - v).abs() <= 1e-6, "{u} vs {v}");
            }
        }
    }
    // Partial: s below 18 (a gap at 3..5), into an empty cache; too early a
    // cut needs ring rows the table dropped.
    let part = a.save_seq(s, Some(18)).unwrap();
    let mut c = KvCellCache::new(cell_cfg(), 64, 8).unwrap();
    let s3 = c.load_seq(&part).unwrap();
    assert_eq!(c.cells().next_pos(s3).unwrap(), 18);
    assert_eq!(c.cells().seq_len(s3).unwrap(), 16);
    assert!(matches!(
        a.save_seq(s, Some(9)),
        Err(CacheError::InvalidArgument(_))
    ));
}

#[test]
fn bad_cell_snapshots_are_refused_and_change_nothing() {
    let mut a = KvCellCache::new(cell_cfg(), 64, 8).unwrap();
    let s = a.cells_mut().seq_new().unwrap();
    cell_feed(&mut a, s, 0, 30, 3);
    let blob = a.save_seq(s, None).unwrap();
    // The ring table dropped what an early cut needs.
    assert!(matches!(
        a.save_seq(s, Some(10)),
        Err(CacheError::InvalidArgument(_))
    ));
    let mut b = KvCellCache::new(cell_cfg(), 64, 8).unwrap();
    let o = b.cells_mut().seq_new().unwrap();
    cell_feed(&mut b, o, 0, 4, 3);
    let check = |b: &mut KvCellCache, d: &[u8], snapshot_err: bool| {
        let before = b.cells().clone();
        let e = b.load_seq(d).unwrap_err();
        if snapshot_err {
            assert!(matches!(e, CacheError::Snapshot(_)), "{e}");
        }
        assert_eq!(b.cells(), &before);
    };
    for cut in [0, 10, blob.len() / 2, blob.len() - 1] {
        check(&mut b, &blob[..cut], true);
    }
    let mut d = blob.clone();
    d[blob.len() / 3] ^= 1;
    check(&mut b, &d, true);
    let header = 16 + 3 * 27;
    // A range claim past the data, with a valid checksum.
    check(
        &mut b,
        &forged(&blob, header, &u32::MAX.to_le_bytes()),
        true,
    );
    let mut other = KvCellCache::new(cfg(&[LayerPolicy::Flat; 3], 3), 64, 8).unwrap();
    let before = other.cells().clone();
    assert!(matches!(
        other.load_seq(&blob),
        Err(CacheError::Snapshot(_))
    ));
    assert_eq!(other.cells(), &before);
    // Not enough cells: refused with OutOfCapacity, unchanged.
    let mut small = KvCellCache::new(cell_cfg(), 20, 8).unwrap();
    check(&mut small, &blob, false);
    b.load_seq(&blob).unwrap();
}
