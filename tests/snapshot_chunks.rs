//! Cell chunk snapshots: chunks from 0 restore one sequence equal to one never
//! saved, ring completeness is enforced, and every refusal changes nothing.

mod common;

use common::snap::{self, cell_feed, cell_step, forged, MIXED};
use offgraph_kv::{snapshot_info, CacheConfig, CacheError, KvCellCache, LayerPolicy};

const STEP: usize = 3;

fn cfg(policies: &[LayerPolicy]) -> CacheConfig {
    snap::cfg(policies, STEP)
}

const FLAT: [LayerPolicy; 2] = [LayerPolicy::Flat, LayerPolicy::Flat];
const RING: [LayerPolicy; 2] = [
    LayerPolicy::Ring { window: 6 },
    LayerPolicy::Ring { window: 4 },
];

fn feed(c: &mut KvCellCache, seq: u64, from: usize, to: usize) {
    cell_feed(c, seq, from, to, STEP);
}

fn next_step(c: &mut KvCellCache, seq: u64) -> Vec<Vec<f32>> {
    let p = c.cells().next_pos(seq).unwrap();
    cell_step(c, seq, p)
}

/// Every pool's row count, K bytes and V bytes.
type Pools = Vec<(usize, Vec<u8>, Vec<u8>)>;

/// Bookkeeping plus every pool's row count and bytes.
fn state(c: &KvCellCache) -> (offgraph_kv::CellCache, Pools) {
    let pools = (0..c.config().n_layers)
        .map(|l| {
            let p = c.pool(l).unwrap();
            (p.rows(), p.k().bytes.to_vec(), p.v().bytes.to_vec())
        })
        .collect();
    (c.cells().clone(), pools)
}

/// Outputs equal up to summation order (the cells, hence the read order, differ).
fn close(a: &[Vec<f32>], b: &[Vec<f32>]) {
    assert_eq!(a.len(), b.len());
    for (ra, rb) in a.iter().zip(b) {
        for (u, v) in ra.iter().zip(rb) {
            assert!((u - v).abs() <= 1e-6, "{u} vs {v}");
        }
    }
}

fn chunks(c: &KvCellCache, seq: u64, bounds: &[usize]) -> Vec<Vec<u8>> {
    bounds
        .windows(2)
        .map(|w| c.save_seq_chunk(seq, w[0], w[1]).unwrap())
        .collect()
}

fn refs(v: &[Vec<u8>]) -> Vec<&[u8]> {
    v.iter().map(|b| b.as_slice()).collect()
}

#[test]
fn chunks_restore_the_sequence_a_never_saved_one_is() {
    for (pols, len, bounds) in [
        (&MIXED[..], 30usize, vec![0usize, 10, 20, 30]),
        (&MIXED[..], 30, vec![0, 4, 27, 30]),
        (&FLAT[..], 17, vec![0, 5, 10, 17]),
        (&RING[..], 25, vec![0, 20, 25]),
        (&RING[..], 25, vec![0, 12, 22, 25]),
    ] {
        let mut a = KvCellCache::new(cfg(pols), 64, 8).unwrap();
        let s = a.cells_mut().seq_new().unwrap();
        feed(&mut a, s, 0, len);
        let parts = chunks(&a, s, &bounds);
        // The target holds another sequence, so the cells differ.
        let mut b = KvCellCache::new(cfg(pols), 64, 8).unwrap();
        let o = b.cells_mut().seq_new().unwrap();
        feed(&mut b, o, 0, 7);
        let t = b.load_seq_chunks(&refs(&parts)).unwrap();
        b.cells().audit().unwrap();
        assert_eq!(b.cells().next_pos(t).unwrap(), len);
        assert_eq!(b.cells().seq_len(t).unwrap(), len);
        // What the next step reads is byte-identical: the whole-prefix
        // snapshots (flat rows, ring tail) of both are one string of bytes.
        assert_eq!(a.save_seq(s, None).unwrap(), b.save_seq(t, None).unwrap());
        let (oa, ob) = (next_step(&mut a, s), next_step(&mut b, t));
        close(&oa, &ob);
        let info = snapshot_info(&parts[0]).unwrap();
        assert_eq!((info.kind, info.start, info.end), (2, 0, bounds[1]));
    }
}

#[test]
fn ring_rows_are_the_held_tail_and_chains_need_them() {
    let mut a = KvCellCache::new(cfg(&MIXED), 64, 8).unwrap();
    let s = a.cells_mut().seq_new().unwrap();
    feed(&mut a, s, 0, 30);
    // The ring table keeps 8 + 3 - 1 = 10 positions at most: [0, 10) has none.
    let early = a.save_seq_chunk(s, 0, 10).unwrap();
    let i = snapshot_info(&early).unwrap();
    assert_eq!((i.ring_from, i.complete), (10, false));
    let late = a.save_seq_chunk(s, 10, 30).unwrap();
    let j = snapshot_info(&late).unwrap();
    assert!(
        j.ring_from >= 20 && j.ring_from <= 23 && j.complete,
        "{j:?}"
    );
    let mut b = KvCellCache::new(cfg(&MIXED), 64, 8).unwrap();
    let before = state(&b);
    // [0, 10) alone: the next step at 10 needs ring rows from 3.
    let e = b.load_seq_chunks(&[&early]).unwrap_err();
    assert!(
        matches!(&e, CacheError::Snapshot(m) if m.contains("incomplete")),
        "{e}"
    );
    assert!(state(&b) == before);
    let t = b.load_seq_chunks(&[&early, &late]).unwrap();
    assert_eq!(b.cells().next_pos(t).unwrap(), 30);
    // A chunk saved while the ring still held it is complete on its own.
    let mut c = KvCellCache::new(cfg(&MIXED), 64, 8).unwrap();
    let u = c.cells_mut().seq_new().unwrap();
    feed(&mut c, u, 0, 12);
    let whole = c.save_seq_chunk(u, 0, 12).unwrap();
    assert!(snapshot_info(&whole).unwrap().complete);
    let v = b.load_seq_chunks(&[&whole]).unwrap();
    close(&next_step(&mut b, v), &next_step(&mut c, u));
}

#[test]
fn bad_saves_are_refused() {
    let mut a = KvCellCache::new(cfg(&MIXED), 64, 8).unwrap();
    let s = a.cells_mut().seq_new().unwrap();
    feed(&mut a, s, 0, 20);
    let before = state(&a);
    for (start, end) in [(5, 5), (6, 5), (10, 21), (25, 30)] {
        let e = a.save_seq_chunk(s, start, end).unwrap_err();
        assert!(matches!(e, CacheError::InvalidArgument(_)), "{e}");
    }
    assert!(matches!(
        a.save_seq_chunk(9999, 0, 5),
        Err(CacheError::UnknownSequence(_))
    ));
    assert!(state(&a) == before);
    a.cells_mut().seq_rm(s, 3, Some(5)).unwrap(); // a gap
    assert!(matches!(
        a.save_seq_chunk(s, 0, 10),
        Err(CacheError::InvalidArgument(_))
    ));
    a.save_seq_chunk(s, 5, 10).unwrap();
}

#[test]
fn bad_chains_are_refused_and_change_nothing() {
    let mut a = KvCellCache::new(cfg(&MIXED), 64, 8).unwrap();
    let s = a.cells_mut().seq_new().unwrap();
    feed(&mut a, s, 0, 30);
    let parts = chunks(&a, s, &[0, 10, 20, 30]);
    let (p0, p1, p2) = (&parts[0][..], &parts[1][..], &parts[2][..]);
    let mut b = KvCellCache::new(cfg(&MIXED), 64, 8).unwrap();
    let o = b.cells_mut().seq_new().unwrap();
    feed(&mut b, o, 0, 4);
    let mut damaged = parts[1].clone();
    let at = damaged.len() / 2;
    damaged[at] ^= 1;
    let whole = a.save_seq(s, None).unwrap();
    let snapshot_refusals: Vec<Vec<&[u8]>> = vec![
        vec![p1, p2],            // not from 0
        vec![p0, p2],            // a gap
        vec![p0, p2, p1],        // out of order
        vec![p0, p0],            // a repeat
        vec![p0, &damaged, p2],  // a flipped bit
        vec![p0, &p1[..40], p2], // truncated
        vec![p0, &p1[..0], p2],  // empty
        vec![&whole],            // another kind
    ];
    for chain in &snapshot_refusals {
        let before = state(&b);
        let e = b.load_seq_chunks(chain).unwrap_err();
        assert!(matches!(e, CacheError::Snapshot(_)), "{e}");
        assert!(state(&b) == before);
    }
    let before = state(&b);
    assert!(matches!(
        b.load_seq_chunks(&[]),
        Err(CacheError::InvalidArgument(_))
    ));
    assert!(state(&b) == before);
    // Another layout: foreign.
    let mut flat = KvCellCache::new(cfg(&FLAT), 64, 8).unwrap();
    let before = state(&flat);
    let e = flat.load_seq_chunks(&[p0, p1, p2]).unwrap_err();
    assert!(
        matches!(&e, CacheError::Snapshot(m) if m.contains("foreign")),
        "{e}"
    );
    assert!(state(&flat) == before);
    // No room: too few cells, or every sequence id live.
    let mut small = KvCellCache::new(cfg(&MIXED), 20, 8).unwrap();
    let before = state(&small);
    let e = small.load_seq_chunks(&[p0, p1, p2]).unwrap_err();
    assert!(matches!(e, CacheError::OutOfCapacity(_)), "{e}");
    assert!(state(&small) == before);
    let mut one = KvCellCache::new(cfg(&MIXED), 64, 1).unwrap();
    one.cells_mut().seq_new().unwrap();
    let before = state(&one);
    let e = one.load_seq_chunks(&[p0, p1, p2]).unwrap_err();
    assert!(matches!(e, CacheError::OutOfCapacity(_)), "{e}");
    assert!(state(&one) == before);
    // The intact chain still loads after all of that.
    let t = b.load_seq_chunks(&[p0, p1, p2]).unwrap();
    assert_eq!(a.save_seq(s, None).unwrap(), b.save_seq(t, None).unwrap());
}

#[test]
fn crafted_ranges_with_valid_checksums_are_refused_unchanged() {
    let mut a = KvCellCache::new(cfg(&MIXED), 64, 8).unwrap();
    let s = a.cells_mut().seq_new().unwrap();
    feed(&mut a, s, 0, 12);
    let (p0, p1) = (
        a.save_seq_chunk(s, 0, 6).unwrap(),
        a.save_seq_chunk(s, 6, 12).unwrap(),
    );
    let state_at = 16 + MIXED.len() * 27;
    let mut b = KvCellCache::new(cfg(&MIXED), 64, 8).unwrap();
    let values = [
        0u64,
        1,
        5,
        6,
        7,
        11,
        12,
        13,
        64,
        1 << 40,
        i64::MAX as u64,
        u64::MAX,
    ];
    let mut tried = 0;
    for word in 0..3 {
        for v in values {
            let d = forged(&p1, state_at + 8 * word, &v.to_le_bytes());
            if d == p1 {
                continue;
            }
            tried += 1;
            let before = state(&b);
            let e = b.load_seq_chunks(&[&p0, &d]).unwrap_err();
            assert!(
                matches!(e, CacheError::Snapshot(_)),
                "word {word} = {v}: {e}"
            );
            assert!(state(&b) == before);
        }
    }
    assert!(tried >= 30, "{tried}");
    let t = b.load_seq_chunks(&[&p0, &p1]).unwrap();
    assert_eq!(b.cells().next_pos(t).unwrap(), 12);
}
