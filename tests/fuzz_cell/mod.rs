//! The cell-cache fuzz harness, shared by the `cargo fuzz`
//! target `fuzz/fuzz_targets/cell_ops.rs` and the stable replay test
//! `tests/fuzz_replay.rs`.
//!
//! [`run`] decodes arbitrary bytes into a config and a sequence of operations
//! on a `KvCellCache` (and so on its `CellCache`): `seq_new`, `seq_clone(upto)`,
//! `seq_rm(p0, p1)`, `seq_free`, `clear`, `begin_step`, `update`, `plan` +
//! `visible`, `dense_mask`, and calls with ids the cache never handed out. It
//! keeps a naive model (per sequence: position -> the rows last written for it,
//! per layer) and after every operation checks the invariants of
//! `../shared/DESIGN.md`:
//! * `CellCache::audit()` passes (owner bits, free bitmap, lists, ring bound);
//! * a refused call changes nothing: the `CellCache` (by `PartialEq`) and every
//!   K/V pool are identical before and after;
//! * no sequence owns two cells for one position in a table, and each
//!   sequence's positions, `next_pos` and `seq_len` match the model;
//! * each token's visible cells are exactly the model's positions `p` with
//!   `p <= pos` (and `p > pos - window` for ring layers), the plan's
//!   `visible(i)`, the spec's runs and the dense mask agree, and the pool rows
//!   over visible cells equal what was written for those positions.
//!
//! Any violation panics (that is how libFuzzer and the test see it).

#![allow(dead_code, clippy::needless_range_loop)]

use std::collections::BTreeMap;

use offgraph_kv::{
    CacheConfig, CacheError, CellCache, KeyLayout, KvCellCache, LayerConfig, LayerPolicy, SeqId,
};

/// Reads bytes; yields 0 once they run out (the op loop stops first).
struct Bytes<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Bytes<'a> {
    fn u8(&mut self) -> u8 {
        let b = self.data.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        b
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            self.u8() as usize % n
        }
    }
    fn done(&self) -> bool {
        self.at >= self.data.len()
    }
}

/// Per sequence: position -> per layer, the K row last written (None before
/// the layer's `update`). V rows are `2k + 1`.
type Model = BTreeMap<SeqId, BTreeMap<usize, Vec<Option<Vec<f32>>>>>;

struct Harness {
    c: KvCellCache,
    model: Model,
    policies: Vec<LayerPolicy>,
    heads: usize,
    dim: usize,
    /// The open step (ids, positions), as the model sees it.
    step: Option<(Vec<SeqId>, Vec<usize>)>,
    /// Ids handed out and freed since: must stay refused.
    dead: Vec<SeqId>,
    counter: f32,
    pub ops: usize,
    pub refused: usize,
}

/// Maximum operations decoded from one input (keeps each run short).
pub const MAX_OPS: usize = 256;

fn decode_config(b: &mut Bytes) -> Option<(CacheConfig, usize, usize, Vec<LayerPolicy>)> {
    let shape = b.u8();
    let n_layers = 1 + (shape as usize % 3);
    let mut policies = Vec::new();
    for _ in 0..n_layers {
        let p = b.u8();
        policies.push(if p.is_multiple_of(2) {
            LayerPolicy::Flat
        } else {
            LayerPolicy::Ring {
                window: 1 + (p as usize >> 1) % 8,
            }
        });
    }
    let heads = 1 + (shape as usize >> 2) % 2;
    let dim = 1 + (shape as usize >> 3) % 3;
    let layers: Vec<LayerConfig> = policies
        .iter()
        .map(|p| LayerConfig::new(*p, heads, dim))
        .collect();
    let mut cfg = CacheConfig::new(1 << 20, n_layers, layers);
    cfg.max_step = 1 + b.below(6);
    cfg.initial_capacity = 1 + b.below(4);
    let n_cells = 1 + b.below(40);
    let n_seq_max = 1 + b.below(6);
    Some((cfg, n_cells, n_seq_max, policies))
}

/// Runs one input; returns (operations run, refused calls).
pub fn run(data: &[u8]) -> (usize, usize) {
    let mut b = Bytes { data, at: 0 };
    let Some((cfg, n_cells, n_seq_max, policies)) = decode_config(&mut b) else {
        return (0, 0);
    };
    let (heads, dim) = (cfg.layers[0].n_kv_heads, cfg.layers[0].head_dim);
    let c = match KvCellCache::new(cfg, n_cells, n_seq_max) {
        Ok(c) => c,
        Err(e) => panic!("a valid config was refused: {e}"),
    };
    let mut h = Harness {
        c,
        model: Model::new(),
        policies,
        heads,
        dim,
        step: None,
        dead: Vec::new(),
        counter: 0.0,
        ops: 0,
        refused: 0,
    };
    while !b.done() && h.ops < MAX_OPS {
        h.op(&mut b);
        h.ops += 1;
        h.check();
    }
    (h.ops, h.refused)
}

/// Everything observable, to compare before and after a refused call.
#[derive(PartialEq, Debug)]
struct Snapshot {
    cells: CellCache,
    pools: Vec<(usize, Vec<u8>, Vec<u8>)>,
}

impl Harness {
    fn snapshot(&self) -> Snapshot {
        Snapshot {
            cells: self.c.cells().clone(),
            pools: (0..self.policies.len())
                .map(|l| {
                    let p = self.c.pool(l).unwrap();
                    (p.slots(), p.k().bytes.to_vec(), p.v().bytes.to_vec())
                })
                .collect(),
        }
    }

    fn live(&self) -> Vec<SeqId> {
        self.model.keys().copied().collect()
    }

    /// A live id most of the time; sometimes a dead or never-issued one.
    fn pick(&self, b: &mut Bytes) -> SeqId {
        let live = self.live();
        let k = b.u8();
        match k % 8 {
            6 if !self.dead.is_empty() => self.dead[k as usize % self.dead.len()],
            7 => 1000 + k as SeqId,
            _ if !live.is_empty() => live[k as usize % live.len()],
            _ => k as SeqId,
        }
    }

    fn pos_arg(&self, b: &mut Bytes) -> usize {
        match b.u8() {
            255 => usize::MAX,
            254 => usize::MAX - 1,
            253 => usize::MAX / 2,
            x => x as usize % 48,
        }
    }

    /// Runs `f`; on refusal checks that nothing changed and returns None.
    fn guarded<T>(
        &mut self,
        f: impl FnOnce(&mut KvCellCache) -> Result<T, CacheError>,
    ) -> Option<T> {
        let before = self.snapshot();
        match f(&mut self.c) {
            Ok(v) => Some(v),
            Err(e) => {
                assert!(!e.message().is_empty());
                let after = self.snapshot();
                assert!(before == after, "a refused call ({e}) changed the cache");
                self.refused += 1;
                None
            }
        }
    }

    fn op(&mut self, b: &mut Bytes) {
        match b.u8() % 16 {
            0 | 1 => {
                let r = self.guarded(|c| c.cells_mut().seq_new());
                let full = self.model.len() >= self.c.cells().n_seq_max();
                match r {
                    Some(s) => {
                        assert!(!full, "seq_new beyond n_seq_max");
                        assert!(
                            self.model.insert(s, BTreeMap::new()).is_none(),
                            "id {s} reused while live"
                        );
                        self.dead.retain(|d| *d != s);
                    }
                    None => assert!(full, "seq_new refused with room"),
                }
            }
            2 => {
                let src = self.pick(b);
                let upto = match b.u8() % 3 {
                    0 => None,
                    _ => Some(self.pos_arg(b)),
                };
                if let Some(t) = self.guarded(|c| c.cells_mut().seq_clone(src, upto)) {
                    let rows = self.model[&src]
                        .iter()
                        .filter(|(p, _)| upto.is_none_or(|u| **p < u))
                        .map(|(p, r)| (*p, r.clone()))
                        .collect();
                    assert!(self.model.insert(t, rows).is_none());
                    self.dead.retain(|d| *d != t);
                    self.step = None;
                } else {
                    self.check_refusal_reason_clone(src);
                }
            }
            3 | 4 => {
                let s = self.pick(b);
                let p0 = self.pos_arg(b);
                let p1 = match b.u8() % 3 {
                    0 => None,
                    _ => Some(self.pos_arg(b)),
                };
                if self.guarded(|c| c.cells_mut().seq_rm(s, p0, p1)).is_some() {
                    let p1 = p1.unwrap_or(usize::MAX);
                    self.model
                        .get_mut(&s)
                        .expect("seq_rm accepted an id the model does not hold")
                        .retain(|p, _| *p < p0 || *p >= p1);
                    self.step = None;
                } else if self.model.contains_key(&s) && p1.is_none_or(|p1| p1 >= p0) {
                    // Only the ring-hole rule may refuse a well-formed removal.
                    assert!(
                        self.c.cells().ring_table().is_some(),
                        "seq_rm({s}, {p0}, {p1:?}) refused without ring layers"
                    );
                }
            }
            5 => {
                let s = self.pick(b);
                if self.guarded(|c| c.cells_mut().seq_free(s)).is_some() {
                    assert!(self.model.remove(&s).is_some());
                    self.dead.push(s);
                    self.step = None;
                } else {
                    assert!(!self.model.contains_key(&s), "seq_free refused a live id");
                }
            }
            6 => {
                if b.u8().is_multiple_of(4) {
                    self.c.cells_mut().clear();
                    self.dead.extend(self.model.keys().copied());
                    self.model.clear();
                    self.step = None;
                }
            }
            7..=9 => self.begin_step(b),
            10..=12 => self.update(b),
            13 | 14 => {
                let layer = b.below(self.policies.len() + 1);
                self.check_visible(layer);
            }
            _ => {
                let layer = b.below(self.policies.len() + 1);
                self.check_dense_mask(layer);
            }
        }
    }

    fn check_refusal_reason_clone(&self, src: SeqId) {
        if self.model.contains_key(&src) && self.model.len() < self.c.cells().n_seq_max() {
            assert!(
                self.c.cells().ring_table().is_some(),
                "seq_clone({src}) refused without ring layers and with a free id"
            );
        }
    }

    fn begin_step(&mut self, b: &mut Bytes) {
        let n = 1 + b.below(self.c.config().max_step + 1);
        let mut ids = Vec::new();
        let mut pos = Vec::new();
        let mut next: BTreeMap<SeqId, usize> = BTreeMap::new();
        for _ in 0..n {
            let s = self.pick(b);
            let base = *next
                .entry(s)
                .or_insert_with(|| self.c.cells().next_pos(s).unwrap_or(0));
            let p = match b.u8() % 8 {
                0 => base.saturating_sub(1),
                1 => base.saturating_add(1),
                2 => usize::MAX - 1,
                3 => usize::MAX,
                _ => base,
            };
            ids.push(s);
            pos.push(p);
            next.insert(s, p.saturating_add(1));
        }
        if self.guarded(|c| c.begin_step(&ids, &pos)).is_some() {
            for (&s, &p) in ids.iter().zip(&pos) {
                let m = self
                    .model
                    .get_mut(&s)
                    .expect("begin_step accepted an unknown id");
                assert!(
                    m.keys().next_back().is_none_or(|&q| q < p),
                    "begin_step rewrote position {p} of {s}"
                );
                m.insert(p, vec![None; self.policies.len()]);
            }
            self.step = Some((ids, pos));
        }
    }

    fn update(&mut self, b: &mut Bytes) {
        let layer = b.below(self.policies.len() + 1);
        let t = self.step.as_ref().map_or(1, |s| s.0.len());
        let mut n = self.heads * t * self.dim;
        if b.u8().is_multiple_of(8) {
            n += 1; // a wrong shape
        }
        let k: Vec<f32> = (0..n)
            .map(|_| {
                self.counter += 1.0;
                self.counter
            })
            .collect();
        let v: Vec<f32> = k.iter().map(|x| 2.0 * x + 1.0).collect();
        let (heads, dim) = (self.heads, self.dim);
        if self
            .guarded(|c| c.update(layer, &k, &v).map(|_| ()))
            .is_some()
        {
            let (ids, pos) = self
                .step
                .clone()
                .expect("update accepted with no open step");
            for i in 0..t {
                let mut row = Vec::with_capacity(heads * dim);
                for hh in 0..heads {
                    let at = (hh * t + i) * dim;
                    row.extend_from_slice(&k[at..at + dim]);
                }
                self.model
                    .get_mut(&ids[i])
                    .unwrap()
                    .get_mut(&pos[i])
                    .unwrap()[layer] = Some(row);
            }
            self.check_visible(layer);
        } else {
            assert!(
                self.step.is_none() || layer >= self.policies.len() || n != heads * t * dim,
                "update refused a well-formed call"
            );
        }
    }

    /// Visible cells of every token of the open step, against the model and the pools.
    fn check_visible(&mut self, layer: usize) {
        let Some((ids, pos)) = self.step.clone() else {
            assert!(self.c.plan(0).is_err(), "plan served with no open step");
            return;
        };
        if layer >= self.policies.len() {
            assert!(self.c.plan(layer).is_err());
            return;
        }
        let cells = self.c.cells().clone();
        let table = cells.table_of(layer).unwrap();
        let window = self.policies[layer].window();
        let plan = self.c.plan(layer).expect("plan refused with an open step");
        assert_eq!(plan.positions(), pos.as_slice());
        assert_eq!(plan.seq_ids(), ids.as_slice());
        let plan_vis: Vec<_> = (0..ids.len()).map(|i| plan.visible(i).unwrap()).collect();
        assert!(plan.visible(ids.len()).is_err());
        let step_cells = plan.cells().to_vec();
        let read_len = plan.read_len();
        let (heads, dim) = (self.heads, self.dim);
        // `spec` may refuse a layer not updated this step whose pool is
        // shorter than the read extent; then only the plan is checked.
        let spec = match self.c.spec(layer) {
            Ok(spec) => Some(spec),
            Err(CacheError::StepProtocol(_)) => None,
            Err(e) => panic!("spec: unexpected {e}"),
        };
        for i in 0..ids.len() {
            let (s, q) = (ids[i], pos[i]);
            assert_eq!(
                cells.cell_pos(table, step_cells[i] as usize).unwrap(),
                Some(q),
                "token {i}'s cell does not hold its position"
            );
            if let Some(spec) = &spec {
                let KeyLayout::Cells {
                    offsets,
                    runs,
                    read_len: spec_read_len,
                } = spec.keys
                else {
                    panic!("a cell spec without a cell layout")
                };
                assert_eq!(spec_read_len, read_len);
                assert!(read_len <= spec.slots);
                // The spec hands attention the same cells as `plan.visible`
                // (sorted runs), in position order (batch invariance).
                let token_runs = &runs[offsets[i]..offsets[i + 1]];
                let spec_cells: Vec<usize> =
                    token_runs.iter().flat_map(|r| r.start..r.end()).collect();
                let mut sorted = spec_cells.clone();
                sorted.sort_unstable();
                let plan_cells: Vec<usize> =
                    plan_vis[i].iter().flat_map(|r| r.start..r.end()).collect();
                assert_eq!(sorted, plan_cells, "spec runs' cells != plan.visible's");
                let spec_pos: Vec<_> = spec_cells
                    .iter()
                    .map(|&c| cells.cell_pos(table, c).unwrap())
                    .collect();
                assert!(
                    spec_pos.windows(2).all(|w| w[0] < w[1]),
                    "spec runs not in position order: {spec_pos:?}"
                );
            }
            let want: Vec<usize> = self.model[&s]
                .keys()
                .copied()
                .filter(|&p| p <= q && window.is_none_or(|w| (p as u128) + (w as u128) > q as u128))
                .collect();
            let mut seen = Vec::new();
            for r in &plan_vis[i] {
                for j in r.start..r.end() {
                    assert!(j < read_len, "visible cell {j} beyond read_len {read_len}");
                    let p = cells
                        .cell_pos(table, j)
                        .unwrap()
                        .expect("a visible cell is free");
                    assert!(cells.cell_owners(table, j).unwrap().contains(&s));
                    seen.push(p);
                    let Some(spec) = &spec else { continue };
                    if let Some(row) = self.model[&s].get(&p).and_then(|r| r[layer].as_ref()) {
                        for hh in 0..heads {
                            let at = (hh * spec.slots + j) * dim;
                            assert_eq!(
                                &spec.k.f32().unwrap()[at..at + dim],
                                &row[hh * dim..(hh + 1) * dim],
                                "K row of seq {s} pos {p} (cell {j}, layer {layer})"
                            );
                            let wv: Vec<f32> = row[hh * dim..(hh + 1) * dim]
                                .iter()
                                .map(|x| 2.0 * x + 1.0)
                                .collect();
                            assert_eq!(&spec.v.f32().unwrap()[at..at + dim], wv.as_slice());
                        }
                    }
                }
            }
            seen.sort_unstable();
            assert_eq!(
                seen, want,
                "token {i} (seq {s}, pos {q}) layer {layer}: visible positions"
            );
        }
    }

    fn check_dense_mask(&mut self, layer: usize) {
        let open = self.step.is_some() && layer < self.policies.len();
        let vis: Option<(usize, Vec<Vec<offgraph_kv::Run>>)> = if open {
            let plan = self.c.plan(layer).unwrap();
            Some((
                plan.read_len(),
                (0..plan.n_tokens())
                    .map(|i| plan.visible(i).unwrap())
                    .collect(),
            ))
        } else {
            None
        };
        let before = self.c.cells().clone();
        let got = self.c.dense_mask(layer).map(|m| m.to_vec());
        match (got, vis) {
            (Ok(mask), Some((read_len, vis))) => {
                assert_eq!(mask.len(), vis.len() * read_len);
                for (i, runs) in vis.iter().enumerate() {
                    let mut row = vec![0u8; read_len];
                    for r in runs {
                        for j in r.start..r.end() {
                            row[j] = 1;
                        }
                    }
                    assert_eq!(&mask[i * read_len..(i + 1) * read_len], row.as_slice());
                }
            }
            (Err(_), None) => assert!(before == *self.c.cells()),
            (r, v) => panic!(
                "dense_mask: {:?} with open step/layer {}",
                r.map(|m| m.len()),
                v.is_some()
            ),
        }
    }

    /// Invariants after every operation.
    fn check(&self) {
        let cells = self.c.cells();
        if let Err(e) = cells.audit() {
            panic!("audit after op {}: {e}", self.ops);
        }
        assert_eq!(cells.step_open(), self.step.is_some(), "step open/closed");
        let live = cells.live_seqs();
        assert_eq!(live, {
            let mut l = self.live();
            // Index order: an id's index is its low 16 bits.
            l.sort_by_key(|s| *s & 0xffff);
            l
        });
        for d in &self.dead {
            assert!(!cells.is_live(*d), "freed id {d} is live again");
        }
        for (&s, m) in &self.model {
            let next = m.keys().next_back().map_or(0, |p| p.saturating_add(1));
            assert_eq!(cells.next_pos(s).unwrap(), next, "next_pos of {s}");
            assert_eq!(cells.seq_len(s).unwrap(), m.len(), "seq_len of {s}");
            for table in 0..cells.n_tables() {
                let held = cells.seq_cells(s, table).unwrap();
                // No sequence owns two cells for one position; every cell holds its position.
                for w in held.windows(2) {
                    assert!(
                        w[0].0 < w[1].0,
                        "seq {s} holds position {} twice in table {table}",
                        w[1].0
                    );
                }
                for &(p, cell) in &held {
                    assert!(
                        m.contains_key(&p),
                        "seq {s} holds position {p} the model dropped"
                    );
                    assert_eq!(cells.cell_pos(table, cell as usize).unwrap(), Some(p));
                }
                if Some(table) == cells.full_table() {
                    assert_eq!(
                        held.len(),
                        m.len(),
                        "full table of {s} differs from the model"
                    );
                }
            }
        }
    }
}
