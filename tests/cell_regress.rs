//! Named regression tests for `CellCache`: the traps of the upstream cell-layout
//! review, the step protocol, refusals, and bounded ring tables.

use offgraph_kv::cell::{CellCache, SeqId};
use offgraph_kv::{CacheConfig, CacheError, LayerConfig, LayerPolicy, Run};

const FLAT: LayerPolicy = LayerPolicy::Flat;

fn ring(window: usize) -> LayerPolicy {
    LayerPolicy::Ring { window }
}

fn cfg(pols: &[LayerPolicy], max_step: usize) -> CacheConfig {
    let layers = pols.iter().map(|p| LayerConfig::new(*p, 1, 4)).collect();
    let mut c = CacheConfig::new(1 << 20, pols.len(), layers);
    c.max_step = max_step;
    c
}

fn cache(pols: &[LayerPolicy], max_step: usize, n_cells: usize, n_seq_max: usize) -> CellCache {
    CellCache::new(cfg(pols, max_step), n_cells, n_seq_max).unwrap()
}

fn kind<T>(r: Result<T, CacheError>) -> &'static str {
    match r {
        Ok(_) => "Ok",
        Err(e) => e.kind(),
    }
}

fn cells(runs: &[Run]) -> Vec<usize> {
    runs.iter().flat_map(|r| r.start..r.end()).collect()
}

/// Positions token `i` of `layer` sees, via the cells it sees.
fn visible_positions(c: &CellCache, layer: usize, i: usize) -> Vec<usize> {
    let pl = c.plan(layer).unwrap();
    let t = pl.table();
    let mut out: Vec<usize> = cells(&pl.visible(i).unwrap())
        .into_iter()
        .map(|j| c.cell_pos(t, j).unwrap().unwrap())
        .collect();
    out.sort_unstable();
    out
}

/// Positions token `i` sees according to the dense mask.
fn mask_positions(c: &mut CellCache, layer: usize, i: usize) -> Vec<usize> {
    let (t, read_len) = {
        let pl = c.plan(layer).unwrap();
        (pl.table(), pl.read_len())
    };
    let row: Vec<u8> = c.dense_mask(layer).unwrap()[i * read_len..(i + 1) * read_len].to_vec();
    let mut out: Vec<usize> = row
        .iter()
        .enumerate()
        .filter(|(_, b)| **b == 1)
        .map(|(j, _)| c.cell_pos(t, j).unwrap().unwrap())
        .collect();
    out.sort_unstable();
    out
}

fn decode(c: &mut CellCache, id: SeqId, n: usize) {
    for _ in 0..n {
        let p = c.next_pos(id).unwrap();
        c.begin_step(&[id], &[p]).unwrap();
    }
}

/// A refused call returns this kind and leaves the cache equal to before.
fn refused<T: std::fmt::Debug>(
    c: &mut CellCache,
    want: &str,
    f: impl FnOnce(&mut CellCache) -> Result<T, CacheError>,
) {
    let before = c.clone();
    let r = f(c);
    assert_eq!(kind(r), want);
    assert!(*c == before, "a refused call changed the cache");
    c.audit().unwrap();
}

#[test]
fn gap_under_ring_window_is_masked_by_position_not_cell_count() {
    // Two cells held, window 2: a mask from cell counts would let position 5 see
    // position 0. In position space it sees only itself.
    let mut c = cache(&[ring(2)], 1, 16, 4);
    let s = c.seq_new().unwrap();
    c.begin_step(&[s], &[0]).unwrap();
    c.begin_step(&[s], &[5]).unwrap();
    assert_eq!(visible_positions(&c, 0, 0), vec![5]);
    assert_eq!(mask_positions(&mut c, 0, 0), vec![5]);
    // Position 6 (right after 5) sees 5 and 6, still not 0.
    c.begin_step(&[s], &[6]).unwrap();
    assert_eq!(visible_positions(&c, 0, 0), vec![5, 6]);
    assert_eq!(mask_positions(&mut c, 0, 0), vec![5, 6]);
    // Window equal to, below and above the cell count, with a gap.
    for (w, want) in [(3, vec![5, 6, 7]), (2, vec![6, 7]), (9, vec![0, 5, 6, 7])] {
        let mut c = cache(&[FLAT, ring(w)], 1, 16, 4);
        let s = c.seq_new().unwrap();
        for p in [0, 5, 6, 7] {
            c.begin_step(&[s], &[p]).unwrap();
        }
        assert_eq!(visible_positions(&c, 1, 0), want, "window {w}");
        assert_eq!(mask_positions(&mut c, 1, 0), want, "window {w}");
        // The flat layer sees everything.
        assert_eq!(visible_positions(&c, 0, 0), vec![0, 5, 6, 7]);
    }
}

#[test]
fn seq_clone_with_upto_shares_the_prefix_cells() {
    let mut c = cache(&[FLAT], 4, 32, 4);
    let a = c.seq_new().unwrap();
    c.begin_step(&[a, a, a, a], &[0, 1, 2, 3]).unwrap();
    c.begin_step(&[a, a, a, a], &[4, 5, 6, 7]).unwrap();
    let free = c.free_cells();
    let b = c.seq_clone(a, Some(5)).unwrap();
    assert_ne!(a, b);
    assert_eq!(c.free_cells(), free, "a clone copies no cells");
    assert_eq!(c.seq_len(b).unwrap(), 5);
    assert_eq!(c.next_pos(b).unwrap(), 5);
    let ca = c.seq_cells(a, 0).unwrap();
    let cb = c.seq_cells(b, 0).unwrap();
    assert_eq!(cb, ca[..5].to_vec(), "the clone owns a's cells below upto");
    for (_, cell) in &cb {
        let mut o = c.cell_owners(0, *cell as usize).unwrap();
        o.sort_unstable();
        assert_eq!(o, vec![a.min(b), a.max(b)]);
    }
    // The clone continues at 5 in a new cell; a is untouched.
    c.begin_step(&[b], &[5]).unwrap();
    let new_cell = c.plan(0).unwrap().cells()[0] as usize;
    assert!(!ca.iter().any(|(_, x)| *x as usize == new_cell));
    assert_eq!(visible_positions(&c, 0, 0), vec![0, 1, 2, 3, 4, 5]);
    assert_eq!(c.seq_len(a).unwrap(), 8);
    // Freeing a leaves the shared cells to b; a's own tail cells free.
    c.seq_free(a).unwrap();
    assert_eq!(c.free_cells(), 32 - 6);
    assert_eq!(c.seq_cells(b, 0).unwrap().len(), 6);
    // upto beyond the end clones everything; upto 0 clones nothing.
    let d = c.seq_clone(b, Some(100)).unwrap();
    assert_eq!(c.seq_len(d).unwrap(), 6);
    let e = c.seq_clone(b, Some(0)).unwrap();
    assert_eq!((c.seq_len(e).unwrap(), c.next_pos(e).unwrap()), (0, 0));
    c.audit().unwrap();
}

#[test]
fn windowed_and_multi_sequence_in_one_step() {
    // Flat layer 0, ring window 3 on layer 1; two sequences sharing a prefix.
    let mut c = cache(&[FLAT, ring(3)], 4, 64, 4);
    let a = c.seq_new().unwrap();
    c.begin_step(&[a, a, a, a], &[0, 1, 2, 3]).unwrap();
    let b = c.seq_clone(a, Some(2)).unwrap();
    // One step: a at 4, 5 and b at 2, 3, interleaved.
    c.begin_step(&[a, b, a, b], &[4, 2, 5, 3]).unwrap();
    let pl = c.plan(1).unwrap();
    assert_eq!(pl.n_tokens(), 4);
    assert_eq!(pl.window(), Some(3));
    assert_eq!(pl.seq_ids(), &[a, b, a, b]);
    // Ring: token at p sees positions (p-3, p] of its own sequence, including
    // what this step placed for its earlier tokens.
    assert_eq!(visible_positions(&c, 1, 0), vec![2, 3, 4]);
    assert_eq!(visible_positions(&c, 1, 1), vec![0, 1, 2]);
    assert_eq!(visible_positions(&c, 1, 2), vec![3, 4, 5]);
    assert_eq!(visible_positions(&c, 1, 3), vec![1, 2, 3]);
    // Flat: everything of its own sequence up to p.
    assert_eq!(visible_positions(&c, 0, 2), vec![0, 1, 2, 3, 4, 5]);
    assert_eq!(visible_positions(&c, 0, 3), vec![0, 1, 2, 3]);
    for layer in 0..2 {
        for i in 0..4 {
            assert_eq!(
                mask_positions(&mut c, layer, i),
                visible_positions(&c, layer, i)
            );
        }
    }
    // b's positions 2 and 3 live in cells a does not own.
    let b_cells = c.seq_cells(b, 0).unwrap();
    let a_cells = c.seq_cells(a, 0).unwrap();
    for (p, cell) in &b_cells {
        let shared = a_cells.iter().any(|(_, x)| x == cell);
        assert_eq!(shared, *p < 2, "position {p}");
    }
}

#[test]
fn a_verb_closes_the_step() {
    let mut c = cache(&[FLAT, ring(4)], 2, 32, 4);
    let a = c.seq_new().unwrap();
    type Verb = Box<dyn Fn(&mut CellCache, SeqId)>;
    let verbs: Vec<(&str, Verb)> = vec![
        ("seq_rm", Box::new(|c, s| c.seq_rm(s, 0, Some(0)).unwrap())),
        (
            "seq_clone",
            Box::new(|c, s| {
                c.seq_clone(s, None).unwrap();
            }),
        ),
        (
            "seq_free",
            Box::new(|c, _| {
                let t = c.seq_new().unwrap();
                c.seq_free(t).unwrap();
            }),
        ),
        ("clear", Box::new(|c, _| c.clear())),
    ];
    for (name, verb) in verbs {
        let a = if c.is_live(a) {
            a
        } else {
            c.seq_new().unwrap()
        };
        let p = c.next_pos(a).unwrap();
        c.begin_step(&[a], &[p]).unwrap();
        assert!(c.step_open());
        // seq_new does not close it.
        let g = c.generation();
        let extra = c.seq_new().unwrap();
        assert!(c.step_open() && c.generation() == g);
        c.plan(0).unwrap();
        c.seq_free(extra).unwrap(); // closes
        assert_eq!(kind(c.plan(0)), "StepProtocol");
        c.begin_step(&[a], &[p + 1]).unwrap();
        let g = c.generation();
        verb(&mut c, a);
        assert!(!c.step_open(), "{name} left the step open");
        assert_ne!(c.generation(), g, "{name} did not change the generation");
        assert_eq!(kind(c.plan(0)), "StepProtocol", "{name}");
        assert_eq!(kind(c.plan(1)), "StepProtocol", "{name}");
        assert_eq!(kind(c.dense_mask(1)), "StepProtocol", "{name}");
    }
    // A refused verb leaves the step open and unchanged.
    let a = c.seq_new().unwrap();
    c.begin_step(&[a], &[0]).unwrap();
    refused(&mut c, "InvalidArgument", |c| c.seq_rm(a, 3, Some(2)));
    refused(&mut c, "UnknownSequence", |c| c.seq_clone(a + 1000, None));
    assert!(c.step_open());
    assert_eq!(c.plan(0).unwrap().positions(), &[0]);
}

#[test]
fn rewrite_of_a_held_position_is_refused_then_retryable() {
    let mut c = cache(&[FLAT, ring(4)], 4, 32, 4);
    let a = c.seq_new().unwrap();
    let b = c.seq_new().unwrap();
    c.begin_step(&[a, a, a], &[0, 1, 2]).unwrap();
    let g = c.generation();
    // Rewrite of 2 (held), even alongside a valid token of another sequence.
    refused(&mut c, "StepProtocol", |c| c.begin_step(&[b, a], &[0, 2]));
    refused(&mut c, "StepProtocol", |c| c.begin_step(&[a], &[1]));
    // Not strictly increasing within the step.
    refused(&mut c, "InvalidArgument", |c| {
        c.begin_step(&[a, a], &[4, 4])
    });
    refused(&mut c, "InvalidArgument", |c| {
        c.begin_step(&[a, a], &[5, 4])
    });
    assert_eq!(c.generation(), g);
    assert_eq!(
        c.plan(0).unwrap().positions(),
        &[0, 1, 2],
        "the previous step stays open"
    );
    // Retry with correct positions (a gap is allowed).
    c.begin_step(&[b, a], &[0, 4]).unwrap();
    assert_eq!(c.next_pos(a).unwrap(), 5);
    assert_eq!(c.seq_len(a).unwrap(), 4);
    assert_eq!(visible_positions(&c, 0, 1), vec![0, 1, 2, 4]);
    assert_eq!(visible_positions(&c, 1, 1), vec![1, 2, 4]);
}

#[test]
fn bad_ids_are_refused_on_every_verb() {
    let mut c = cache(&[FLAT, ring(4)], 2, 16, 3);
    let a = c.seq_new().unwrap();
    let freed = c.seq_new().unwrap();
    c.begin_step(&[a, freed], &[0, 0]).unwrap();
    c.seq_free(freed).unwrap();
    // The slot is reused, but the stale id stays refused.
    let reuse = c.seq_new().unwrap();
    assert_ne!(reuse, freed);
    c.begin_step(&[a], &[1]).unwrap();
    for bad in [freed, 3, 7, 1000, u64::MAX] {
        assert!(!c.is_live(bad), "{bad}");
        refused(&mut c, "UnknownSequence", |c| c.seq_clone(bad, None));
        refused(&mut c, "UnknownSequence", |c| c.seq_clone(bad, Some(1)));
        refused(&mut c, "UnknownSequence", |c| c.seq_rm(bad, 0, None));
        refused(&mut c, "UnknownSequence", |c| c.seq_free(bad));
        refused(&mut c, "UnknownSequence", |c| c.next_pos(bad));
        refused(&mut c, "UnknownSequence", |c| c.seq_len(bad));
        refused(&mut c, "UnknownSequence", |c| c.seq_cells(bad, 0));
        refused(&mut c, "UnknownSequence", |c| c.begin_step(&[bad], &[0]));
        refused(&mut c, "UnknownSequence", |c| {
            c.begin_step(&[a, bad], &[2, 0])
        });
        assert!(c.step_open());
    }
    // The message names the id.
    let e = c.seq_free(1000).unwrap_err();
    assert!(e.message().contains("1000"), "{e}");
    // Ids from before a clear are refused after it.
    c.clear();
    refused(&mut c, "UnknownSequence", |c| c.next_pos(a));
    refused(&mut c, "UnknownSequence", |c| c.begin_step(&[reuse], &[0]));
}

#[test]
fn clear_frees_every_cell_and_id() {
    let mut c = cache(&[FLAT, ring(2)], 4, 16, 4);
    let a = c.seq_new().unwrap();
    let b = c.seq_clone(a, None).unwrap();
    c.begin_step(&[a, b], &[0, 0]).unwrap();
    c.begin_step(&[a, a], &[1, 2]).unwrap();
    assert!(c.free_cells() < 16);
    c.clear();
    assert_eq!(c.free_cells(), 16);
    assert_eq!(c.free_cells_in(0).unwrap(), 16);
    assert_eq!(c.free_cells_in(1).unwrap(), 16);
    assert!(c.live_seqs().is_empty());
    assert!(!c.step_open());
    assert_eq!(kind(c.plan(0)), "StepProtocol");
    for j in 0..16 {
        assert_eq!(c.cell_pos(0, j).unwrap(), None);
        assert!(c.cell_owners(1, j).unwrap().is_empty());
    }
    assert!(!c.is_live(a) && !c.is_live(b));
    // Fresh ids work; n_seq_max ids again available.
    let ids: Vec<SeqId> = (0..4).map(|_| c.seq_new().unwrap()).collect();
    assert_eq!(kind(c.seq_new()), "OutOfCapacity");
    c.begin_step(&ids, &[0, 0, 0, 0]).unwrap();
    assert_eq!(c.plan(0).unwrap().cells(), &[0, 1, 2, 3]);
    c.audit().unwrap();
}

#[test]
fn ring_table_stays_bounded_while_flat_cells_grow() {
    let (w, ms) = (8, 3);
    let keep = w + ms - 1;
    let mut c = cache(&[FLAT, ring(w), ring(4)], ms, 4096, 4);
    assert_eq!(c.n_tables(), 2);
    assert_eq!(
        (
            c.table_of(0).unwrap(),
            c.table_of(1).unwrap(),
            c.table_of(2).unwrap()
        ),
        (0, 1, 1)
    );
    assert_eq!(c.ring_keep(), Some(keep));
    let a = c.seq_new().unwrap();
    let b = c.seq_new().unwrap();
    let mut p = 0;
    for step in 0..1000 {
        let n = 1 + step % ms; // chunks of 1, 2 and 3
        let ids = vec![a; n];
        let pos: Vec<usize> = (p..p + n).collect();
        c.begin_step(&ids, &pos).unwrap();
        decode(&mut c, b, 1);
        p += n;
        assert!(c.seq_cells(a, 1).unwrap().len() <= keep);
        assert!(c.seq_cells(b, 1).unwrap().len() <= keep);
    }
    assert_eq!(c.seq_len(a).unwrap(), p);
    assert_eq!(
        c.seq_cells(a, 0).unwrap().len(),
        p,
        "the full table keeps everything"
    );
    assert_eq!(c.free_cells_in(1).unwrap(), 4096 - 2 * keep);
    assert_eq!(c.free_cells_in(0).unwrap(), 4096 - p - 1000);
    assert_eq!(c.free_cells(), 4096 - p - 1000);
    // The last step of b sees its last w positions in the ring layers.
    let np = c.next_pos(b).unwrap();
    c.begin_step(&[b], &[np]).unwrap();
    assert_eq!(
        visible_positions(&c, 1, 0),
        (np + 1 - w..=np).collect::<Vec<_>>()
    );
    assert_eq!(
        visible_positions(&c, 2, 0),
        (np + 1 - 4..=np).collect::<Vec<_>>()
    );
    assert_eq!(
        c.plan(0).unwrap().read_len(),
        4096 - c.free_cells_in(0).unwrap()
    );
    c.audit().unwrap();

    // All-ring: one table, and a pool of exactly `keep` cells never runs out.
    let mut c = cache(&[ring(w)], ms, keep, 1);
    assert_eq!(c.n_tables(), 1);
    let a = c.seq_new().unwrap();
    let mut p = 0;
    for step in 0..3000 {
        let n = 1 + step % ms;
        c.begin_step(&vec![a; n], &(p..p + n).collect::<Vec<_>>())
            .unwrap();
        p += n;
        let last = p - 1;
        assert_eq!(
            visible_positions(&c, 0, n - 1),
            (last.saturating_sub(w - 1)..=last).collect::<Vec<_>>()
        );
        assert_eq!(
            visible_positions(&c, 0, 0),
            ((p - n).saturating_sub(w - 1)..=p - n).collect::<Vec<_>>()
        );
    }
    assert_eq!(c.seq_len(a).unwrap(), p);
    assert_eq!(c.next_pos(a).unwrap(), p);
    assert_eq!(c.seq_cells(a, 0).unwrap().len(), keep);
    c.audit().unwrap();
}

#[test]
fn shared_ring_cells_stay_while_a_clone_still_needs_them() {
    let mut c = cache(&[ring(3)], 1, 32, 4);
    let a = c.seq_new().unwrap();
    decode(&mut c, a, 3); // 0, 1, 2
    let b = c.seq_clone(a, None).unwrap();
    decode(&mut c, a, 10); // a drops its old ring cells; b still owns them
    assert_eq!(
        c.seq_cells(b, 0)
            .unwrap()
            .iter()
            .map(|e| e.0)
            .collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    c.begin_step(&[b], &[3]).unwrap();
    assert_eq!(visible_positions(&c, 0, 0), vec![1, 2, 3]);
    c.audit().unwrap();
}

#[test]
fn refused_rm_or_clone_that_would_leave_a_hole() {
    // Ring window 4, max_step 1: the ring table keeps the 4 highest positions.
    let mut c = cache(&[FLAT, ring(4)], 1, 64, 4);
    let a = c.seq_new().unwrap();
    decode(&mut c, a, 21); // 0..=20; ring keeps 17..=20
    assert_eq!(
        c.seq_cells(a, 1)
            .unwrap()
            .iter()
            .map(|e| e.0)
            .collect::<Vec<_>>(),
        vec![17, 18, 19, 20]
    );
    // Continuing from 19 needs 16..=18; 16 was dropped.
    refused(&mut c, "InvalidArgument", |c| c.seq_rm(a, 19, None));
    refused(&mut c, "InvalidArgument", |c| c.seq_clone(a, Some(19)));
    refused(&mut c, "InvalidArgument", |c| c.seq_clone(a, Some(5)));
    let e = c.seq_rm(a, 10, None).unwrap_err();
    assert!(
        e.message().contains("10") || e.message().contains("position"),
        "{e}"
    );
    // Within max_step: fine, and the next step sees a full window.
    let b = c.seq_clone(a, Some(20)).unwrap();
    assert_eq!(c.next_pos(b).unwrap(), 20);
    c.seq_rm(a, 20, None).unwrap();
    assert_eq!(c.next_pos(a).unwrap(), 20);
    c.begin_step(&[a], &[20]).unwrap();
    assert_eq!(visible_positions(&c, 1, 0), vec![17, 18, 19, 20]);
    c.begin_step(&[b], &[20]).unwrap();
    assert_eq!(visible_positions(&c, 1, 0), vec![17, 18, 19, 20]);
    // A clone of nothing, and removing the dropped prefix, are fine.
    c.seq_clone(a, Some(0)).unwrap();
    c.seq_rm(a, 0, Some(10)).unwrap();
    assert_eq!(c.seq_len(a).unwrap(), 11);
    // Removing everything is fine too (nothing is left to need a key).
    c.seq_rm(a, 0, None).unwrap();
    assert_eq!((c.seq_len(a).unwrap(), c.next_pos(a).unwrap()), (0, 0));
    c.audit().unwrap();
}

#[test]
fn rewind_within_max_step_after_a_chunked_step_succeeds() {
    let (w, ms) = (5, 4);
    let mut c = cache(&[ring(w)], ms, 64, 2);
    let a = c.seq_new().unwrap();
    let mut p = 0;
    for _ in 0..10 {
        c.begin_step(&[a; 4], &[p, p + 1, p + 2, p + 3]).unwrap();
        p += 4;
    }
    // Speculative decoding: drop the whole last step (4 = max_step tokens).
    c.seq_rm(a, p - 4, None).unwrap();
    p -= 4;
    c.begin_step(&[a; 2], &[p, p + 1]).unwrap();
    assert_eq!(
        visible_positions(&c, 0, 0),
        (p + 1 - w..=p).collect::<Vec<_>>()
    );
    assert_eq!(
        mask_positions(&mut c, 0, 1),
        (p + 2 - w..=p + 1).collect::<Vec<_>>()
    );
    // One more than max_step back is refused (the key at p+1-w-... was dropped).
    let np = c.next_pos(a).unwrap();
    refused(&mut c, "InvalidArgument", |c| {
        c.seq_rm(a, np - ms - 2, None)
    });
}

#[test]
fn owner_bitsets_span_more_than_one_word() {
    let mut c = cache(&[FLAT, ring(2)], 1, 8, 300);
    let root = c.seq_new().unwrap();
    decode(&mut c, root, 2);
    let clones: Vec<SeqId> = (0..250).map(|_| c.seq_clone(root, None).unwrap()).collect();
    assert_eq!(c.cell_owners(0, 0).unwrap().len(), 251);
    assert_eq!(c.free_cells(), 6);
    let last = *clones.last().unwrap();
    assert!(last >= 200);
    c.begin_step(&[last], &[2]).unwrap();
    assert_eq!(visible_positions(&c, 0, 0), vec![0, 1, 2]);
    assert_eq!(visible_positions(&c, 1, 0), vec![1, 2]);
    c.seq_free(root).unwrap();
    for s in &clones[..249] {
        c.seq_free(*s).unwrap();
    }
    assert_eq!(c.cell_owners(0, 0).unwrap(), vec![last]);
    c.seq_free(last).unwrap();
    assert_eq!(c.free_cells(), 8);
    c.audit().unwrap();
    assert!(CellCache::new(cfg(&[FLAT], 1), 4, 4096).is_ok());
}

#[test]
fn begin_step_admission_is_all_or_nothing() {
    let mut c = cache(&[FLAT], 4, 6, 4);
    let a = c.seq_new().unwrap();
    let b = c.seq_new().unwrap();
    refused(&mut c, "InvalidArgument", |c| c.begin_step(&[], &[]));
    refused(&mut c, "InvalidArgument", |c| {
        c.begin_step(&[a; 5], &[0, 1, 2, 3, 4])
    });
    refused(&mut c, "InvalidArgument", |c| c.begin_step(&[a, a], &[0]));
    refused(&mut c, "InvalidArgument", |c| {
        c.begin_step(&[a], &[usize::MAX])
    });
    c.begin_step(&[a, a, a, a], &[0, 1, 2, 3]).unwrap();
    // 3 tokens, 2 free cells: nothing is placed.
    refused(&mut c, "OutOfCapacity", |c| {
        c.begin_step(&[b, b, a], &[0, 1, 4])
    });
    assert!(c.can_extend(2) && !c.can_extend(3));
    c.begin_step(&[b, a], &[0, 4]).unwrap();
    assert_eq!(c.free_cells(), 0);
    // Free cells come back in the lowest holes first.
    c.seq_rm(a, 1, Some(3)).unwrap();
    c.begin_step(&[b, b], &[1, 2]).unwrap();
    assert_eq!(c.plan(0).unwrap().cells(), &[1, 2]);
    assert_eq!(c.free_cells(), 0);
}

#[test]
fn ring_admission_counts_cells_the_step_frees() {
    // Two ring cells = window 2 + max_step 1 - 1: every step of a fits only
    // because its own drop frees a cell; a cell another sequence still owns
    // does not count.
    let mut c = cache(&[ring(2)], 1, 2, 2);
    let a = c.seq_new().unwrap();
    decode(&mut c, a, 5);
    assert_eq!(c.free_cells(), 0);
    assert!(!c.can_extend(1));
    let b = c.seq_clone(a, None).unwrap(); // shares positions 3 and 4
    refused(&mut c, "OutOfCapacity", |c| c.begin_step(&[a], &[5]));
    refused(&mut c, "OutOfCapacity", |c| c.begin_step(&[b], &[5]));
    // Once b lets go of position 3, a's drop frees its cell.
    c.seq_rm(b, 3, Some(4)).unwrap();
    c.begin_step(&[a], &[5]).unwrap();
    assert_eq!(visible_positions(&c, 0, 0), vec![4, 5]);
    assert_eq!(
        c.seq_cells(b, 0)
            .unwrap()
            .iter()
            .map(|e| e.0)
            .collect::<Vec<_>>(),
        vec![4]
    );
    c.audit().unwrap();
}

#[test]
fn plan_and_dense_mask_errors_and_memo() {
    let mut c = cache(&[FLAT, ring(2), FLAT, ring(2)], 2, 16, 2);
    assert_eq!(kind(c.plan(0)), "StepProtocol");
    assert_eq!(kind(c.plan(4)), "InvalidArgument");
    assert_eq!(kind(c.table_of(4)), "InvalidArgument");
    let a = c.seq_new().unwrap();
    c.begin_step(&[a, a], &[0, 1]).unwrap();
    assert_eq!(kind(c.plan(4)), "InvalidArgument");
    assert_eq!(kind(c.dense_mask(9)), "InvalidArgument");
    assert_eq!(kind(c.plan(0).unwrap().visible(2)), "InvalidArgument");
    let p0 = c.dense_mask(0).unwrap().as_ptr();
    let m0 = c.dense_mask(0).unwrap().to_vec();
    let p2 = c.dense_mask(2).unwrap().as_ptr();
    assert_eq!(p2, p0, "layers sharing a policy share a mask");
    assert_eq!(m0, vec![1, 0, 1, 1]);
    let m1 = c.dense_mask(1).unwrap().to_vec();
    assert_eq!(c.dense_mask(3).unwrap(), m1.as_slice());
    // Planning is the same on every call.
    assert_eq!(c.plan(1).unwrap().cells(), c.plan(3).unwrap().cells());
}

#[test]
fn constructor_validates_its_arguments() {
    assert_eq!(
        kind(CellCache::new(cfg(&[FLAT], 1), 0, 4)),
        "InvalidArgument"
    );
    assert_eq!(
        kind(CellCache::new(cfg(&[FLAT], 1), 4, 0)),
        "InvalidArgument"
    );
    assert_eq!(
        kind(CellCache::new(cfg(&[FLAT], 1), 4, 1 << 20)),
        "InvalidArgument"
    );
    let mut bad = cfg(&[ring(0)], 1);
    assert_eq!(kind(CellCache::new(bad.clone(), 4, 4)), "InvalidConfig");
    bad.layers.clear();
    assert_eq!(kind(CellCache::new(bad, 4, 4)), "InvalidConfig");
    let e = CellCache::new(cfg(&[FLAT], 1), 0, 4).unwrap_err();
    assert!(e.message().contains("n_cells") && e.message().contains('0'));
    let c = cache(&[FLAT], 1, 4, 2);
    assert_eq!(
        (c.capacity(), c.n_seq_max(), c.free_cells(), c.n_tables()),
        (4, 2, 4, 1)
    );
    assert_eq!(c.ring_keep(), None);
}

#[test]
fn ids_never_repeat_across_many_new_free_cycles() {
    // The old 32-bit scheme wrapped a slot's generation after 2^32 / n_seq_max
    // ids: with n_seq_max = 65536, the 65,537th new/free cycle got id 0 back.
    let mut c = cache(&[LayerPolicy::Flat], 1, 8, 65_536);
    let first = c.seq_new().unwrap();
    c.seq_free(first).unwrap();
    let mut seen = std::collections::HashSet::from([first]);
    for _ in 0..70_000 {
        let s = c.seq_new().unwrap();
        assert!(seen.insert(s), "id {s} was handed out twice");
        c.seq_free(s).unwrap();
    }
    // A stale id from the first cycle still addresses nothing.
    assert_eq!(kind(c.seq_len(first)), "UnknownSequence");
    // clear() retires every id too: none comes back.
    let live = c.seq_new().unwrap();
    c.clear();
    assert!(!seen.contains(&c.seq_new().unwrap()));
    assert_eq!(kind(c.seq_len(live)), "UnknownSequence");
}
