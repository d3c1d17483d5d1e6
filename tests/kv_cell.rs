//! The byte layer over a CellCache: several sequences, forks sharing rows,
//! removals and freed cells reused, flat and ring layers, across pool
//! doublings. A naive model keeps every sequence's rows by position; after
//! every layer-step each token's visible cells must hold exactly the rows the
//! model says that token sees.

#![allow(clippy::needless_range_loop)]

mod common;

use std::collections::BTreeMap;

use common::Rng;
use offgraph_kv::{
    CacheConfig, CacheError, KeyLayout, KvCellCache, LayerConfig, LayerPolicy, PoolMemory,
};

const HEADS: usize = 2;
const DIM: usize = 2;

type Row = [f32; HEADS * DIM];

/// Per sequence: position -> per-layer row (k; v is derived as 3k - 1).
type Model = BTreeMap<u64, BTreeMap<usize, Vec<Row>>>;

fn run(seed: u64, policies: &[LayerPolicy], n_cells: usize, ops: usize) -> (usize, usize) {
    let mut rng = Rng::new(seed);
    let layers: Vec<LayerConfig> = policies
        .iter()
        .map(|p| LayerConfig::new(*p, HEADS, DIM))
        .collect();
    let mut cfg = CacheConfig::new(4096, layers.len(), layers);
    cfg.max_step = 6;
    cfg.initial_capacity = 1;
    // The copy-growth fallback: this test counts its doublings (the reserved
    // pools run the same traffic in tests/pool_memory.rs and the fuzz suite).
    let mut c = KvCellCache::with_memory(cfg.clone(), n_cells, 8, PoolMemory::Grow).unwrap();
    let mut model: Model = BTreeMap::new();
    let (mut steps, mut doublings) = (0, 0);
    let mut last_slots = vec![1usize; policies.len()];
    for _ in 0..ops {
        let live: Vec<u64> = model.keys().copied().collect();
        match rng.range(0, 9) {
            0 if live.len() < 8 => {
                let s = c.cells_mut().seq_new().unwrap();
                model.insert(s, BTreeMap::new());
            }
            1 if !live.is_empty() && live.len() < 8 => {
                let src = live[rng.range(0, live.len() - 1)];
                let upto = if rng.chance(0.5) {
                    Some(rng.range(0, 40))
                } else {
                    None
                };
                if let Ok(t) = c.cells_mut().seq_clone(src, upto) {
                    let rows: BTreeMap<usize, Vec<Row>> = model[&src]
                        .iter()
                        .filter(|(p, _)| upto.is_none_or(|u| **p < u))
                        .map(|(p, r)| (*p, r.clone()))
                        .collect();
                    model.insert(t, rows);
                }
            }
            2 if !live.is_empty() => {
                let s = live[rng.range(0, live.len() - 1)];
                let p0 = rng.range(0, 40);
                if c.cells_mut().seq_rm(s, p0, None).is_ok() {
                    model.get_mut(&s).unwrap().retain(|p, _| *p < p0);
                }
            }
            3 if !live.is_empty() && rng.chance(0.3) => {
                let s = live[rng.range(0, live.len() - 1)];
                c.cells_mut().seq_free(s).unwrap();
                model.remove(&s);
            }
            _ if !live.is_empty() => {
                // A step: a few tokens from a few sequences, positions beyond what they hold.
                let mut ids = Vec::new();
                let mut pos = Vec::new();
                for _ in 0..rng.range(1, 3) {
                    let s = live[rng.range(0, live.len() - 1)];
                    if ids.contains(&s) {
                        continue;
                    }
                    let mut p = c.cells().next_pos(s).unwrap() + usize::from(rng.chance(0.1));
                    for _ in 0..rng.range(1, 2) {
                        if ids.len() < cfg.max_step {
                            ids.push(s);
                            pos.push(p);
                            p += 1;
                        }
                    }
                }
                if c.begin_step(&ids, &pos).is_err() {
                    continue;
                }
                steps += 1;
                let t = ids.len();
                for layer in 0..policies.len() {
                    let k: Vec<f32> = (0..HEADS * t * DIM).map(|_| rng.f32()).collect();
                    let v: Vec<f32> = k.iter().map(|x| 3.0 * x - 1.0).collect();
                    for i in 0..t {
                        let mut row = [0.0; HEADS * DIM];
                        for h in 0..HEADS {
                            let src = (h * t + i) * DIM;
                            row[h * DIM..(h + 1) * DIM].copy_from_slice(&k[src..src + DIM]);
                        }
                        let e = model.get_mut(&ids[i]).unwrap().entry(pos[i]).or_default();
                        e.resize(policies.len(), [0.0; HEADS * DIM]);
                        e[layer] = row;
                    }
                    let table = c.cells().table_of(layer).unwrap();
                    let window = policies[layer].window();
                    let cell_pos: Vec<Option<usize>> = (0..n_cells)
                        .map(|j| c.cells().cell_pos(table, j).unwrap())
                        .collect();
                    let spec = c.update(layer, &k, &v).unwrap();
                    let KeyLayout::Cells {
                        offsets,
                        runs,
                        read_len,
                    } = spec.keys
                    else {
                        panic!("cell spec")
                    };
                    assert!(read_len <= spec.slots && spec.slots <= n_cells);
                    for i in 0..t {
                        let (s, q) = (ids[i], pos[i]);
                        let want: Vec<usize> = model[&s]
                            .keys()
                            .copied()
                            .filter(|&p| p <= q && window.is_none_or(|w| p + w > q))
                            .collect();
                        let mut seen = Vec::new();
                        for r in &runs[offsets[i]..offsets[i + 1]] {
                            for j in r.start..r.end() {
                                let p = cell_pos[j].expect("visible cell holds a position");
                                seen.push(p);
                                let want_row = model[&s][&p][layer];
                                for h in 0..HEADS {
                                    let at = (h * spec.slots + j) * DIM;
                                    assert_eq!(
                                        &spec.k.f32().unwrap()[at..at + DIM],
                                        &want_row[h * DIM..(h + 1) * DIM]
                                    );
                                    let wv: Vec<f32> = want_row[h * DIM..(h + 1) * DIM]
                                        .iter()
                                        .map(|x| 3.0 * x - 1.0)
                                        .collect();
                                    assert_eq!(&spec.v.f32().unwrap()[at..at + DIM], wv.as_slice());
                                }
                            }
                        }
                        seen.sort_unstable();
                        assert_eq!(seen, want, "token {i} (seq {s}, pos {q}) layer {layer}");
                    }
                    let slots = c.pool(layer).unwrap().slots();
                    if slots > last_slots[layer] {
                        doublings += 1;
                        last_slots[layer] = slots;
                    }
                    let rows = c.pool(layer).unwrap().rows();
                    assert!(rows <= slots);
                    assert_eq!(c.nbytes(layer).unwrap(), 2 * HEADS * rows * DIM * 4);
                    assert!(slots <= n_cells, "pool beyond its cell table");
                }
            }
            _ => {}
        }
    }
    (steps, doublings)
}

#[test]
fn flat_cells_with_forks_removals_and_reuse() {
    let (steps, doublings) = run(11, &[LayerPolicy::Flat, LayerPolicy::Flat], 64, 5000);
    assert!(
        steps > 500 && doublings >= 8,
        "{steps} steps, {doublings} doublings"
    );
}

#[test]
fn mixed_ring_and_flat_cells() {
    let ring = LayerPolicy::Ring { window: 5 };
    let (steps, doublings) = run(
        12,
        &[ring, LayerPolicy::Flat, LayerPolicy::Ring { window: 2 }],
        96,
        4000,
    );
    assert!(
        steps > 500 && doublings >= 8,
        "{steps} steps, {doublings} doublings"
    );
}

#[test]
fn bad_rows_write_nothing_and_stale_layers_are_refused() {
    let cfg = CacheConfig::new(64, 2, vec![LayerConfig::new(LayerPolicy::Flat, HEADS, DIM)]);
    let mut c = KvCellCache::new(cfg, 16, 4).unwrap();
    let s = c.cells_mut().seq_new().unwrap();
    c.begin_step(&[s], &[0]).unwrap();
    let good = vec![1.0; HEADS * DIM];
    c.update(0, &good, &good).unwrap();
    let before = c.pool(0).unwrap().k().bytes.to_vec();
    let e = c.update(0, &good[..2], &good).unwrap_err();
    assert!(matches!(&e, CacheError::Shape(m) if m.contains("expected 4") && m.contains("got 2")));
    assert_eq!(c.pool(0).unwrap().k().bytes, before.as_slice());
    // A verb between begin_step and the layers closes the step.
    c.cells_mut().seq_rm(s, 0, None).unwrap();
    assert!(matches!(
        c.update(1, &good, &good),
        Err(CacheError::StepProtocol(_))
    ));
}

#[test]
fn shared_cells_counts_cells_owned_by_forks() {
    let mut cfg = CacheConfig::new(64, 1, vec![LayerConfig::new(LayerPolicy::Flat, 1, 2)]);
    cfg.max_step = 4;
    let mut c = KvCellCache::new(cfg, 16, 4).unwrap();
    let s = c.cells_mut().seq_new().unwrap();
    c.begin_step(&[s, s, s], &[0, 1, 2]).unwrap();
    assert_eq!(c.cells().shared_cells(0).unwrap(), 0);
    let t = c.cells_mut().seq_clone(s, Some(2)).unwrap();
    assert_eq!(c.cells().shared_cells(0).unwrap(), 2);
    c.begin_step(&[t], &[2]).unwrap();
    assert_eq!(c.cells().shared_cells(0).unwrap(), 2);
    c.cells_mut().seq_free(s).unwrap();
    assert_eq!(c.cells().shared_cells(0).unwrap(), 0);
    assert!(c.cells().shared_cells(1).is_err());
}
