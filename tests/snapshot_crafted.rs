//! Crafted snapshots with valid checksums: every header and state field
//! patched, ring ranges wider than a layer's depth, unknown kinds and flags,
//! positions past the documented bound. Each is `CacheError::Snapshot` and the
//! loading cache is unchanged, its pools' sizes and bytes included.

use offgraph_kv::kv::snapshot::{crc32, MAX_POSITION};
use offgraph_kv::kv::Pool;
use offgraph_kv::{
    snapshot_info, CacheConfig, CacheError, KvCellCache, KvDtype, KvSequenceCache, LayerConfig,
    LayerPolicy,
};

const H: usize = 2;
const D: usize = 32;
/// magic, version, kind, flags, n_layers.
const HEADER: usize = 16;
const LAYER_PRINT: usize = 27;

fn cfg(policies: &[LayerPolicy], capacity: usize, max_step: usize, dtype: KvDtype) -> CacheConfig {
    let layers = policies
        .iter()
        .map(|p| LayerConfig::new(*p, H, D))
        .collect();
    let mut c = CacheConfig::new(capacity, policies.len(), layers).with_dtype(dtype);
    c.max_step = max_step;
    c.initial_capacity = 4;
    c
}

fn rows(layer: usize, p0: usize, n: usize, v: bool) -> Vec<f32> {
    let mut out = Vec::with_capacity(H * n * D);
    for h in 0..H {
        for t in 0..n {
            for d in 0..D {
                let x = (layer * 1009 + (p0 + t) * 31 + h * 7 + d) as f32 * 0.173;
                out.push(if v { x.cos() } else { x.sin() });
            }
        }
    }
    out
}

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

/// Bookkeeping (as `Debug`), bytes held, every pool's size and bytes.
type State = (String, usize, Vec<usize>, Vec<Vec<u8>>);

fn pools_state(book: String, nbytes: usize, pools: &[&Pool]) -> State {
    (
        book,
        nbytes,
        pools.iter().map(|p| p.slots()).collect(),
        pools
            .iter()
            .flat_map(|p| [p.k().bytes.to_vec(), p.v().bytes.to_vec()])
            .collect(),
    )
}

fn state(c: &KvSequenceCache) -> State {
    let pools: Vec<_> = (0..c.config().n_layers)
        .map(|l| c.pool(l).unwrap())
        .collect();
    pools_state(format!("{:?}", c.sequence()), c.nbytes_total(), &pools)
}

fn cell_state(c: &KvCellCache) -> State {
    let pools: Vec<_> = (0..c.config().n_layers)
        .map(|l| c.pool(l).unwrap())
        .collect();
    pools_state(format!("{:?}", c.cells()), c.nbytes_total(), &pools)
}

fn with_crc(mut body: Vec<u8>) -> Vec<u8> {
    let c = crc32(&body);
    body.extend_from_slice(&c.to_le_bytes());
    body
}

/// `data` with `patch` at `at` and a valid checksum.
fn forged(data: &[u8], at: usize, patch: &[u8]) -> Vec<u8> {
    let mut d = data[..data.len() - 4].to_vec();
    d[at..at + patch.len()].copy_from_slice(patch);
    with_crc(d)
}

fn refused_seq(c: &mut KvSequenceCache, data: &[u8], needle: &str) {
    let before = state(c);
    match c.load_state(data) {
        Err(CacheError::Snapshot(m)) => assert!(m.contains(needle), "{m:?} lacks {needle:?}"),
        other => panic!("expected a Snapshot error containing {needle:?}, got {other:?}"),
    }
    assert!(state(c) == before, "a refused load changed the cache");
}

/// A sequence snapshot whose `layer` carries `[from, end)` with rows of zeros
/// (the other layers as saved). Layout: header, prints, start, end, froms, rows.
fn with_ring_range(snap: &[u8], prints: &[(usize, usize)], layer: usize, from: usize) -> Vec<u8> {
    let n_layers = prints.len();
    let state_at = HEADER + n_layers * LAYER_PRINT;
    let u64_at = |at: usize| u64::from_le_bytes(snap[at..at + 8].try_into().unwrap()) as usize;
    let end = u64_at(state_at + 8);
    let froms: Vec<usize> = (0..n_layers)
        .map(|l| u64_at(state_at + 16 + 8 * l))
        .collect();
    let mut out = snap[..state_at + 16].to_vec();
    for (l, f) in froms.iter().enumerate() {
        let f = if l == layer { from } else { *f };
        out.extend_from_slice(&(f as u64).to_le_bytes());
    }
    let mut at = state_at + 16 + 8 * n_layers;
    for (l, (&(kb, vb), f)) in prints.iter().zip(&froms).enumerate() {
        let len = H * (end - f) * (kb + vb);
        if l == layer && from != *f {
            out.extend(std::iter::repeat_n(0u8, H * (end - from) * (kb + vb)));
        } else {
            out.extend_from_slice(&snap[at..at + len]);
        }
        at += len;
    }
    assert_eq!(at, snap.len() - 4, "the layout walked is the snapshot's");
    with_crc(out)
}

#[test]
fn a_ring_range_wider_than_the_depth_is_a_snapshot_error() {
    // The two cases: [Ring(4), Flat] float32 (ring depth 7) and
    // [Flat, Ring(5)] q8_0 (the flat pool used to grow before the ring refused).
    let f32_row = D * 4;
    let q8_row = D / 32 * 34;
    let cases = [
        (
            vec![LayerPolicy::Ring { window: 4 }, LayerPolicy::Flat],
            KvDtype::Float32,
            f32_row,
            0,
        ),
        (
            vec![LayerPolicy::Flat, LayerPolicy::Ring { window: 5 }],
            KvDtype::Q8_0,
            q8_row,
            1,
        ),
    ];
    for (pols, dtype, row, ring) in cases {
        let c = cfg(&pols, 48, 4, dtype);
        let mut a = KvSequenceCache::new(c.clone()).unwrap();
        feed(&mut a, 30, 4);
        let snap = a.save_state(None).unwrap();
        let prints = vec![(row, row); pols.len()];
        // Unchanged it loads; its ring layer carries window - 1 positions.
        let same = with_ring_range(
            &snap,
            &prints,
            ring,
            30 - (pols[ring].window().unwrap() - 1),
        );
        assert_eq!(same, snap);
        KvSequenceCache::new(c.clone())
            .unwrap()
            .load_state(&snap)
            .unwrap();
        let depth = c.depth(pols[ring]);
        for from in [0, 10, 30 - depth - 1] {
            let bad = with_ring_range(&snap, &prints, ring, from);
            let mut b = KvSequenceCache::new(c.clone()).unwrap();
            refused_seq(&mut b, &bad, "slots");
            // A cache holding rows already: also unchanged.
            let mut full = KvSequenceCache::new(c.clone()).unwrap();
            feed(&mut full, 3, 3);
            refused_seq(&mut full, &bad, "");
        }
        // Exactly the depth is a ring's whole pool: it loads.
        let mut b = KvSequenceCache::new(c.clone()).unwrap();
        b.load_state(&with_ring_range(&snap, &prints, ring, 30 - depth))
            .unwrap();
        assert_eq!(b.length(), 30);
    }
}

#[test]
fn unknown_kinds_and_flags_are_refused_by_snapshot_info_and_loads() {
    let pols = [LayerPolicy::Ring { window: 4 }, LayerPolicy::Flat];
    let mut a = KvSequenceCache::new(cfg(&pols, 48, 4, KvDtype::Float32)).unwrap();
    feed(&mut a, 9, 4);
    let snap = a.save_state(None).unwrap();
    let mut b = KvSequenceCache::new(cfg(&pols, 48, 4, KvDtype::Float32)).unwrap();
    let mut kc = KvCellCache::new(cfg(&pols, 48, 4, KvDtype::Float32), 32, 4).unwrap();
    // Kind 2 (a cell chunk) is known: refused by both loads as another kind.
    let d = forged(&snap, 10, &[2]);
    refused_seq(&mut b, &d, "expected");
    let before = cell_state(&kc);
    assert!(matches!(kc.load_seq(&d), Err(CacheError::Snapshot(_))));
    assert!(matches!(
        kc.load_seq_chunks(&[&d]),
        Err(CacheError::Snapshot(_))
    ));
    assert!(cell_state(&kc) == before);
    for kind in 3..=255u8 {
        let d = forged(&snap, 10, &[kind]);
        let e = snapshot_info(&d).unwrap_err();
        assert!(
            matches!(&e, CacheError::Snapshot(m) if m.contains("unknown kind")),
            "{e:?}"
        );
        refused_seq(&mut b, &d, "unknown kind");
        let before = cell_state(&kc);
        assert!(matches!(kc.load_seq(&d), Err(CacheError::Snapshot(_))));
        assert!(cell_state(&kc) == before);
    }
    for flags in 1..=255u8 {
        let d = forged(&snap, 11, &[flags]);
        let e = snapshot_info(&d).unwrap_err();
        assert!(
            matches!(&e, CacheError::Snapshot(m) if m.contains("flags")),
            "{e:?}"
        );
        refused_seq(&mut b, &d, "flags");
    }
    b.load_state(&snap).unwrap();
}

#[test]
fn positions_past_the_bound_are_refused() {
    // A ring-only cell cache keeps no row per held position: only the bound
    // stops a held range that Python's int64 positions could never continue.
    let pols = [LayerPolicy::Ring { window: 4 }];
    let c = cfg(&pols, 48, 4, KvDtype::Float32);
    let mut kc = KvCellCache::new(c.clone(), 32, 4).unwrap();
    let s = kc.cells_mut().seq_new().unwrap();
    kc.begin_step(&[s], &[0]).unwrap();
    kc.update(0, &rows(0, 0, 1, false), &rows(0, 0, 1, true))
        .unwrap();
    let blob = kc.save_seq(s, None).unwrap();
    // State: n_ranges u32, (start, end), n_ring u32, ring positions.
    let at = HEADER + LAYER_PRINT;
    let (start, end, ring) = (at + 4, at + 12, at + 24);
    let mut to = KvCellCache::new(c.clone(), 32, 4).unwrap();
    let check = |to: &mut KvCellCache, d: &[u8], ok: bool| {
        let before = cell_state(to);
        match to.load_seq(d) {
            Ok(id) if ok => {
                to.cells_mut().seq_free(id).unwrap();
            }
            Err(CacheError::Snapshot(m)) if !ok => {
                assert!(cell_state(to) == before, "{m}");
            }
            other => panic!("ok {ok}: {other:?}"),
        }
    };
    let big = MAX_POSITION as u64;
    // The last position a snapshot may hold is MAX_POSITION - 1 (its end is MAX_POSITION).
    let mut d = forged(&blob, start, &(big - 1).to_le_bytes());
    d = forged(&d, end, &big.to_le_bytes());
    d = forged(&d, ring, &(big - 1).to_le_bytes());
    check(&mut to, &d, true);
    for (s0, e0) in [
        (big, big + 1),
        (0, big + 1),
        (1 << 63, u64::MAX - 1),
        (0, u64::MAX - 1),
    ] {
        let mut d = forged(&blob, start, &s0.to_le_bytes());
        d = forged(&d, end, &e0.to_le_bytes());
        d = forged(&d, ring, &(e0 - 1).to_le_bytes());
        check(&mut to, &d, false);
        assert!(snapshot_info(&d).is_err());
    }
    // A sequence snapshot's end and froms alike.
    let mut a = KvSequenceCache::new(c.clone()).unwrap();
    feed(&mut a, 5, 4);
    let snap = a.save_state(None).unwrap();
    let st = HEADER + LAYER_PRINT;
    let mut b = KvSequenceCache::new(c).unwrap();
    for field in [st, st + 8, st + 16] {
        for v in [1u64 << 63, u64::MAX] {
            let d = forged(&snap, field, &v.to_le_bytes());
            assert!(snapshot_info(&d).is_err());
            refused_seq(&mut b, &d, "");
        }
    }
}

/// Values to write over one byte: the edges and neighbours of the original.
fn byte_values(orig: u8) -> Vec<u8> {
    let mut v = vec![0, 1, 2, 3, 0x7f, 0x80, 0xfe, 0xff];
    v.extend([orig ^ 1, orig.wrapping_add(1), orig.wrapping_sub(1)]);
    v.retain(|x| *x != orig);
    v.sort_unstable();
    v.dedup();
    v
}

/// Values to write over a u64 field: edges, the cache's sizes, neighbours.
fn word_values(orig: u64, sizes: &[u64]) -> Vec<u64> {
    let mut v = vec![0, 1, MAX_POSITION as u64, 1 << 63, u64::MAX - 1, u64::MAX];
    for &s in sizes.iter().chain([&orig]) {
        v.extend([s.saturating_sub(1), s, s.saturating_add(1)]);
    }
    v.retain(|x| *x != orig);
    v.sort_unstable();
    v.dedup();
    v
}

#[test]
fn every_header_and_state_field_crafted_is_refused_unchanged() {
    let pols = [
        LayerPolicy::Flat,
        LayerPolicy::Ring { window: 5 },
        LayerPolicy::Ring { window: 3 },
    ];
    let c = cfg(&pols, 48, 4, KvDtype::Float16);
    let sizes = [3u64, 5, 7, 8, 10, 20, 48];
    // Sequence snapshots: every byte before the rows, and every u64 field whole.
    let mut a = KvSequenceCache::new(c.clone()).unwrap();
    feed(&mut a, 20, 4);
    let snap = a.save_state(None).unwrap();
    let state_at = HEADER + pols.len() * LAYER_PRINT;
    let rows_at = state_at + 16 + 8 * pols.len();
    let mut words: Vec<usize> = (0..pols.len())
        .map(|l| HEADER + l * LAYER_PRINT + 1)
        .collect();
    words.extend((state_at..rows_at).step_by(8));
    let mut b = KvSequenceCache::new(c.clone()).unwrap();
    let mut tried = 0;
    let mut try_seq = |d: &[u8]| {
        tried += 1;
        if let Ok(info) = snapshot_info(d) {
            assert!(info.kind <= 2 && info.end <= MAX_POSITION, "{info:?}");
        }
        refused_seq(&mut b, d, "");
    };
    for at in 8..rows_at {
        for v in byte_values(snap[at]) {
            try_seq(&forged(&snap, at, &[v]));
        }
    }
    for &at in &words {
        let orig = u64::from_le_bytes(snap[at..at + 8].try_into().unwrap());
        for v in word_values(orig, &sizes) {
            try_seq(&forged(&snap, at, &v.to_le_bytes()));
        }
    }
    assert!(tried > 1000, "{tried}");
    b.load_state(&snap).unwrap();

    // Cell sequence snapshots: the same over header, ranges and ring positions.
    let mut src = KvCellCache::new(c.clone(), 40, 4).unwrap();
    let s = src.cells_mut().seq_new().unwrap();
    for p in (0..20).step_by(4) {
        let pos: Vec<usize> = (p..p + 4).collect();
        src.begin_step(&[s; 4], &pos).unwrap();
        for l in 0..pols.len() {
            src.update(l, &rows(l, p, 4, false), &rows(l, p, 4, true))
                .unwrap();
        }
    }
    src.cells_mut().seq_rm(s, 2, Some(4)).unwrap(); // two held ranges
    let blob = src.save_seq(s, None).unwrap();
    let n_ranges = u32::from_le_bytes(blob[state_at..state_at + 4].try_into().unwrap()) as usize;
    let ring_n_at = state_at + 4 + 16 * n_ranges;
    let n_ring = u32::from_le_bytes(blob[ring_n_at..ring_n_at + 4].try_into().unwrap()) as usize;
    let cell_rows_at = ring_n_at + 4 + 8 * n_ring;
    let mut cwords: Vec<usize> = (0..pols.len())
        .map(|l| HEADER + l * LAYER_PRINT + 1)
        .collect();
    cwords.extend((state_at + 4..ring_n_at).step_by(8));
    cwords.extend((ring_n_at + 4..cell_rows_at).step_by(8));
    let mut to = KvCellCache::new(c, 40, 4).unwrap();
    let other = to.cells_mut().seq_new().unwrap();
    to.begin_step(&[other], &[0]).unwrap();
    for l in 0..pols.len() {
        to.update(l, &rows(l, 0, 1, false), &rows(l, 0, 1, true))
            .unwrap();
    }
    let mut try_cell = |d: &[u8]| {
        tried += 1;
        if let Ok(info) = snapshot_info(d) {
            assert!(info.kind <= 2 && info.end <= MAX_POSITION, "{info:?}");
        }
        let before = cell_state(&to);
        match to.load_seq(d) {
            Err(CacheError::Snapshot(_)) => {}
            other => panic!("expected a Snapshot error, got {other:?}"),
        }
        assert!(
            cell_state(&to) == before,
            "a refused load_seq changed the cache"
        );
    };
    for at in 8..cell_rows_at {
        for v in byte_values(blob[at]) {
            try_cell(&forged(&blob, at, &[v]));
        }
    }
    for &at in &cwords {
        let orig = u64::from_le_bytes(blob[at..at + 8].try_into().unwrap());
        for v in word_values(orig, &sizes) {
            try_cell(&forged(&blob, at, &v.to_le_bytes()));
        }
    }
    for at in [state_at, ring_n_at] {
        for v in [0u32, 1, 2, 3, 7, u32::MAX] {
            let orig = u32::from_le_bytes(blob[at..at + 4].try_into().unwrap());
            if v != orig {
                try_cell(&forged(&blob, at, &v.to_le_bytes()));
            }
        }
    }
    to.load_seq(&blob).unwrap();
}

/// A cell sequence of `n` positions written in steps of 4.
fn cell_seq(c: &CacheConfig, n_cells: usize, n: usize) -> Vec<u8> {
    let mut src = KvCellCache::new(c.clone(), n_cells, 4).unwrap();
    let s = src.cells_mut().seq_new().unwrap();
    for p in (0..n).step_by(4) {
        let pos: Vec<usize> = (p..p + 4).collect();
        src.begin_step(&[s; 4], &pos).unwrap();
        for l in 0..c.n_layers {
            src.update(l, &rows(l, p, 4, false), &rows(l, p, 4, true))
                .unwrap();
        }
    }
    src.save_seq(s, None).unwrap()
}

#[test]
fn an_intact_cell_snapshot_larger_than_the_cache_is_no_room_not_damage() {
    // A prefix store keys cell values by layout, not by cell count: a value a
    // larger cache saved is intact, and a smaller cache refuses it for room
    // (the store keeps it), not as damage (the store would delete it).
    let mixed = cfg(
        &[LayerPolicy::Flat, LayerPolicy::Ring { window: 8 }],
        64,
        4,
        KvDtype::Float32,
    );
    let ring = cfg(&[LayerPolicy::Ring { window: 8 }], 64, 4, KvDtype::Float32);
    // 20 held positions into 12 cells; 7 ring rows into 5 cells.
    for (c, n, small) in [(&mixed, 20, 12), (&ring, 20, 5)] {
        let blob = cell_seq(c, 40, n);
        let mut to = KvCellCache::new(c.clone(), small, 4).unwrap();
        let before = cell_state(&to);
        match to.load_seq(&blob) {
            Err(CacheError::OutOfCapacity(_)) => {}
            other => panic!("expected OutOfCapacity, got {other:?}"),
        }
        assert!(
            cell_state(&to) == before,
            "a refused load_seq changed the cache"
        );
        KvCellCache::new(c.clone(), 40, 4)
            .unwrap()
            .load_seq(&blob)
            .unwrap();
    }
    // Ring positions shifted off the held tail are damage, whatever the room.
    let blob = cell_seq(&mixed, 40, 20);
    let state_at = HEADER + 2 * LAYER_PRINT;
    let ring_n_at = state_at + 4 + 16;
    let n_ring = u32::from_le_bytes(blob[ring_n_at..ring_n_at + 4].try_into().unwrap()) as usize;
    let mut d = blob[..blob.len() - 4].to_vec();
    for i in 0..n_ring {
        let at = ring_n_at + 4 + 8 * i;
        let p = u64::from_le_bytes(d[at..at + 8].try_into().unwrap());
        d[at..at + 8].copy_from_slice(&(p - 5).to_le_bytes());
    }
    let shifted = with_crc(d);
    for small in [5, 40] {
        let mut to = KvCellCache::new(mixed.clone(), small, 4).unwrap();
        let before = cell_state(&to);
        match to.load_seq(&shifted) {
            Err(CacheError::Snapshot(m)) => assert!(m.contains("not the held tail"), "{m}"),
            other => panic!("expected a Snapshot error, got {other:?}"),
        }
        assert!(
            cell_state(&to) == before,
            "a refused load_seq changed the cache"
        );
    }
}

/// A cell snapshot of `blob`'s layout holding `held` with ring rows at `ring`,
/// rows of zeros (2 layers: one flat, one ring, float32).
fn cell_crafted(blob: &[u8], held: &[(u64, u64)], ring: &[u64]) -> Vec<u8> {
    let mut out = blob[..HEADER + 2 * LAYER_PRINT].to_vec();
    out.extend_from_slice(&(held.len() as u32).to_le_bytes());
    for &(a, b) in held {
        out.extend_from_slice(&a.to_le_bytes());
        out.extend_from_slice(&b.to_le_bytes());
    }
    out.extend_from_slice(&(ring.len() as u32).to_le_bytes());
    for &p in ring {
        out.extend_from_slice(&p.to_le_bytes());
    }
    let n_held: u64 = held.iter().map(|&(a, b)| b - a).sum();
    let rows = (n_held as usize + ring.len()) * H * 2 * D * 4;
    out.extend(std::iter::repeat_n(0u8, rows));
    with_crc(out)
}

#[test]
fn ring_rows_other_than_the_tail_the_next_step_needs_are_damage_before_room() {
    // A shared store meets values other processes wrote: a snapshot whose ring
    // rows are not exactly the held positions the next step needs (a hole
    // across a gap, rows below the window) is refused as damage even when the
    // cache could not hold it anyway, so the store deletes it instead of
    // keeping it as a miss for a larger cache.
    let mixed = cfg(
        &[LayerPolicy::Flat, LayerPolicy::Ring { window: 8 }],
        64,
        4,
        KvDtype::Float32,
    );
    let blob = cell_seq(&mixed, 40, 20);
    let gap = [(0u64, 11u64), (13, 23)];
    let damaged = [
        // Held [0, 20), ring rows from 9: four more than the window's 7.
        cell_crafted(&blob, &[(0, 20)], &(9..20).collect::<Vec<_>>()),
        // Held with a gap, ring rows reaching across it down to 10.
        cell_crafted(&blob, &gap, &[10, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22]),
        // Held [0, 20), ring rows 13..20 with 16 missing.
        cell_crafted(&blob, &[(0, 20)], &[13, 14, 15, 17, 18, 19]),
    ];
    // Nearly full (26 cells, 20 taken) and roomy targets refuse it alike.
    for n_cells in [26, 64] {
        let mut to = KvCellCache::new(mixed.clone(), n_cells, 4).unwrap();
        if n_cells == 26 {
            to.load_seq(&blob).unwrap();
        }
        let before = cell_state(&to);
        for d in &damaged {
            match to.load_seq(d) {
                Err(CacheError::Snapshot(m)) => assert!(m.contains("not the held tail"), "{m}"),
                other => panic!("expected a Snapshot error, got {other:?}"),
            }
            assert!(
                cell_state(&to) == before,
                "a refused load_seq changed the cache"
            );
        }
    }
    // The same gapped sequence carrying exactly its tail is intact: no room
    // when nearly full, loaded when there is.
    let intact = cell_crafted(&blob, &gap, &(16..23).collect::<Vec<_>>());
    let mut full = KvCellCache::new(mixed.clone(), 26, 4).unwrap();
    full.load_seq(&blob).unwrap();
    let before = cell_state(&full);
    assert!(matches!(
        full.load_seq(&intact),
        Err(CacheError::OutOfCapacity(_))
    ));
    assert!(cell_state(&full) == before);
    let mut roomy = KvCellCache::new(mixed, 64, 4).unwrap();
    let s = roomy.load_seq(&intact).unwrap();
    assert_eq!(
        roomy.cells().held_ranges(s, usize::MAX).unwrap(),
        [(0, 11), (13, 23)]
    );
}
