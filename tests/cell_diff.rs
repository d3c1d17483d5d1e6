//! Differential test: `CellCache` against a naive model (per sequence its held
//! positions, per cell its position and owners), over random configs and
//! random operations, refusals included.

use std::collections::{BTreeMap, BTreeSet};

use offgraph_kv::cell::{CellCache, SeqId};
use offgraph_kv::{CacheConfig, CacheError, LayerConfig, LayerPolicy, Run};

/// splitmix64: tiny, seeded, deterministic.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo + 1)
    }
    fn pct(&mut self, p: usize) -> bool {
        self.below(100) < p
    }
}

type Cell = Option<(usize, BTreeSet<SeqId>)>;
type Expect = Result<(), &'static str>;
/// The open step: its (seq, position) tokens and each table's cells.
type OpenStep = (Vec<(SeqId, usize)>, Vec<Vec<u32>>);

#[derive(Clone)]
struct Model {
    n_cells: usize,
    n_seq_max: usize,
    max_step: usize,
    layer_pol: Vec<LayerPolicy>,
    full: Option<usize>,
    ring: Option<usize>,
    w: usize,
    keep: usize,
    cells: Vec<Vec<Cell>>,
    seqs: BTreeMap<SeqId, BTreeSet<usize>>,
    /// The open step's (seq, pos) tokens and per-table cells.
    step: Option<OpenStep>,
}

impl Model {
    fn new(
        layer_pol: Vec<LayerPolicy>,
        n_cells: usize,
        n_seq_max: usize,
        max_step: usize,
    ) -> Model {
        let has_flat = layer_pol.contains(&LayerPolicy::Flat);
        let w = layer_pol
            .iter()
            .filter_map(|p| p.window())
            .max()
            .unwrap_or(0);
        let full = has_flat.then_some(0);
        let ring = (w > 0).then_some(usize::from(has_flat));
        let n_tables = usize::from(has_flat) + usize::from(w > 0);
        Model {
            n_cells,
            n_seq_max,
            max_step,
            layer_pol,
            full,
            ring,
            w,
            keep: w + max_step - 1,
            cells: vec![vec![None; n_cells]; n_tables],
            seqs: BTreeMap::new(),
            step: None,
        }
    }

    fn table_of(&self, layer: usize) -> usize {
        match self.layer_pol[layer] {
            LayerPolicy::Flat => self.full.unwrap(),
            LayerPolicy::Ring { .. } => self.ring.unwrap(),
        }
    }

    fn held(&self, t: usize, seq: SeqId) -> BTreeMap<usize, usize> {
        let mut out = BTreeMap::new();
        for (c, cell) in self.cells[t].iter().enumerate() {
            if let Some((p, o)) = cell {
                if o.contains(&seq) {
                    assert!(
                        out.insert(*p, c).is_none(),
                        "seq {seq} owns two cells for position {p} in table {t}"
                    );
                }
            }
        }
        out
    }

    /// Every sequence's (position -> cell) in table `t`, in one pass; panics
    /// if a sequence owns two cells for one position.
    fn held_all(&self, t: usize) -> BTreeMap<SeqId, BTreeMap<usize, usize>> {
        let mut out: BTreeMap<SeqId, BTreeMap<usize, usize>> = BTreeMap::new();
        for (c, cell) in self.cells[t].iter().enumerate() {
            if let Some((p, o)) = cell {
                for id in o {
                    assert!(
                        out.entry(*id).or_default().insert(*p, c).is_none(),
                        "seq {id} owns two cells for position {p} in table {t}"
                    );
                }
            }
        }
        out
    }

    fn next_pos(&self, seq: SeqId) -> usize {
        self.seqs[&seq].iter().next_back().map_or(0, |p| p + 1)
    }

    fn free(&self, t: usize) -> usize {
        self.cells[t].iter().filter(|c| c.is_none()).count()
    }

    fn remove_bit(&mut self, t: usize, c: usize, seq: SeqId) {
        let cell = &mut self.cells[t][c];
        if let Some((_, o)) = cell {
            o.remove(&seq);
            if o.is_empty() {
                *cell = None;
            }
        }
    }

    /// Would this logical set and ring-held set leave a dropped position the
    /// next step's window needs?
    fn hole(&self, logical: &BTreeSet<usize>, ring_held: &BTreeSet<usize>) -> bool {
        if self.ring.is_none() {
            return false;
        }
        let next = logical.iter().next_back().map_or(0, |p| p + 1);
        logical
            .iter()
            .any(|p| !ring_held.contains(p) && p + self.w > next)
    }

    fn ring_positions(&self, seq: SeqId) -> BTreeSet<usize> {
        match self.ring {
            Some(r) => self.held(r, seq).keys().copied().collect(),
            None => BTreeSet::new(),
        }
    }

    fn expect_rm(&self, seq: SeqId, p0: usize, p1: Option<usize>) -> Expect {
        let Some(l) = self.seqs.get(&seq) else {
            return Err("UnknownSequence");
        };
        if p1.is_some_and(|p1| p1 < p0) {
            return Err("InvalidArgument");
        }
        let p1 = p1.unwrap_or(usize::MAX);
        let inside = |p: &usize| *p >= p0 && *p < p1;
        let l2: BTreeSet<usize> = l.iter().copied().filter(|p| !inside(p)).collect();
        let h2: BTreeSet<usize> = self
            .ring_positions(seq)
            .into_iter()
            .filter(|p| !inside(p))
            .collect();
        if self.hole(&l2, &h2) {
            return Err("InvalidArgument");
        }
        Ok(())
    }

    fn apply_rm(&mut self, seq: SeqId, p0: usize, p1: Option<usize>) {
        let p1 = p1.unwrap_or(usize::MAX);
        for t in 0..self.cells.len() {
            for (p, c) in self.held(t, seq) {
                if p >= p0 && p < p1 {
                    self.remove_bit(t, c, seq);
                }
            }
        }
        self.seqs
            .get_mut(&seq)
            .unwrap()
            .retain(|p| *p < p0 || *p >= p1);
        self.step = None;
    }

    fn expect_clone(&self, src: SeqId, upto: Option<usize>) -> Expect {
        let Some(l) = self.seqs.get(&src) else {
            return Err("UnknownSequence");
        };
        if self.seqs.len() >= self.n_seq_max {
            return Err("OutOfCapacity");
        }
        let up = upto.unwrap_or(usize::MAX);
        let l2: BTreeSet<usize> = l.iter().copied().filter(|p| *p < up).collect();
        let h2: BTreeSet<usize> = self
            .ring_positions(src)
            .into_iter()
            .filter(|p| *p < up)
            .collect();
        if self.hole(&l2, &h2) {
            return Err("InvalidArgument");
        }
        Ok(())
    }

    fn apply_clone(&mut self, src: SeqId, upto: Option<usize>, new: SeqId) {
        let up = upto.unwrap_or(usize::MAX);
        assert!(!self.seqs.contains_key(&new), "clone id {new} already live");
        for t in 0..self.cells.len() {
            for (p, c) in self.held(t, src) {
                if p < up {
                    self.cells[t][c].as_mut().unwrap().1.insert(new);
                }
            }
        }
        let l: BTreeSet<usize> = self.seqs[&src]
            .iter()
            .copied()
            .filter(|p| *p < up)
            .collect();
        self.seqs.insert(new, l);
        self.step = None;
    }

    fn apply_free(&mut self, seq: SeqId) {
        for t in 0..self.cells.len() {
            for (_, c) in self.held(t, seq) {
                self.remove_bit(t, c, seq);
            }
        }
        self.seqs.remove(&seq);
        self.step = None;
    }

    /// Per step sequence: the ring cells it drops before placement.
    fn ring_drops(&self, ids: &[SeqId]) -> Vec<(SeqId, usize)> {
        let Some(r) = self.ring else {
            return Vec::new();
        };
        let mut count: BTreeMap<SeqId, usize> = BTreeMap::new();
        for id in ids {
            *count.entry(*id).or_default() += 1;
        }
        let mut out = Vec::new();
        for (id, cnt) in count {
            let held = self.held(r, id);
            let d = (held.len() + cnt).saturating_sub(self.keep).min(held.len());
            out.extend(held.values().take(d).map(|c| (id, *c)));
        }
        out
    }

    fn expect_step(&self, ids: &[SeqId], pos: &[usize]) -> Expect {
        let n = ids.len();
        if n != pos.len() || n == 0 || n > self.max_step {
            return Err("InvalidArgument");
        }
        let mut last: BTreeMap<SeqId, usize> = BTreeMap::new();
        for (&id, &p) in ids.iter().zip(pos) {
            if !self.seqs.contains_key(&id) {
                return Err("UnknownSequence");
            }
            match last.get(&id) {
                Some(&l) if p <= l => return Err("InvalidArgument"),
                Some(_) => {}
                None if p < self.next_pos(id) => return Err("StepProtocol"),
                None => {}
            }
            last.insert(id, p);
        }
        if let Some(f) = self.full {
            if self.free(f) < n {
                return Err("OutOfCapacity");
            }
        }
        if let Some(r) = self.ring {
            // Cells the step's own drops free: every owner drops them.
            let drops = self.ring_drops(ids);
            let mut droppers: BTreeMap<usize, BTreeSet<SeqId>> = BTreeMap::new();
            for (id, c) in drops {
                droppers.entry(c).or_default().insert(id);
            }
            let freed = droppers
                .iter()
                .filter(|(c, d)| self.cells[r][**c].as_ref().is_some_and(|(_, o)| o == *d))
                .count();
            if self.free(r) + freed < n {
                return Err("OutOfCapacity");
            }
        }
        Ok(())
    }

    /// Applies a successful step, checking the cache's placement (lowest free
    /// cell of each table, token by token, after the ring drops).
    fn apply_step(&mut self, ids: &[SeqId], pos: &[usize], cells: &[Vec<u32>]) {
        if let Some(r) = self.ring {
            for (id, c) in self.ring_drops(ids) {
                self.remove_bit(r, c, id);
            }
        }
        for (i, (&id, &p)) in ids.iter().zip(pos).enumerate() {
            for (t, tc) in cells.iter().enumerate() {
                let c = tc[i] as usize;
                let lowest = self.cells[t].iter().position(|x| x.is_none()).unwrap();
                assert_eq!(
                    c, lowest,
                    "token {i} of the step took cell {c} of table {t}, lowest free is {lowest}"
                );
                self.cells[t][c] = Some((p, BTreeSet::from([id])));
            }
            self.seqs.get_mut(&id).unwrap().insert(p);
        }
        self.step = Some((
            ids.iter().copied().zip(pos.iter().copied()).collect(),
            cells.to_vec(),
        ));
    }

    fn naive_visible(&self, layer: usize, seq: SeqId, p: usize) -> Vec<usize> {
        let t = self.table_of(layer);
        let w = self.layer_pol[layer].window();
        self.cells[t]
            .iter()
            .enumerate()
            .filter_map(|(c, cell)| {
                let (q, o) = cell.as_ref()?;
                let ok = o.contains(&seq) && *q <= p && w.is_none_or(|w| q + w > p);
                ok.then_some(c)
            })
            .collect()
    }
}

fn kind(r: &Result<impl Sized, CacheError>) -> Result<(), &'static str> {
    match r {
        Ok(_) => Ok(()),
        Err(e) => Err(e.kind()),
    }
}

fn expand(runs: &[Run]) -> Vec<usize> {
    let mut out = Vec::new();
    for (k, r) in runs.iter().enumerate() {
        assert!(r.len > 0, "empty run {r:?}");
        if k > 0 {
            let prev = runs[k - 1];
            assert!(
                prev.end() < r.start,
                "runs not sorted, disjoint and maximal: {runs:?}"
            );
        }
        out.extend(r.start..r.end());
    }
    out
}

/// Everything observable agrees with the model.
fn compare(c: &CellCache, m: &Model, ctx: &str) {
    c.audit().unwrap_or_else(|e| panic!("{ctx}: audit: {e}"));
    assert_eq!(c.step_open(), m.step.is_some(), "{ctx}: step_open");
    if m.step.is_none() {
        assert_eq!(
            kind(&c.plan(0)),
            Err("StepProtocol"),
            "{ctx}: plan with no step"
        );
    }
    let mut live = c.live_seqs();
    live.sort_unstable();
    assert_eq!(
        live,
        m.seqs.keys().copied().collect::<Vec<_>>(),
        "{ctx}: live ids"
    );
    let per_table: Vec<BTreeMap<SeqId, BTreeMap<usize, usize>>> =
        (0..m.cells.len()).map(|t| m.held_all(t)).collect();
    let empty = BTreeMap::new();
    for (&id, l) in &m.seqs {
        assert_eq!(
            c.next_pos(id).unwrap(),
            m.next_pos(id),
            "{ctx}: next_pos({id})"
        );
        assert_eq!(c.seq_len(id).unwrap(), l.len(), "{ctx}: seq_len({id})");
        if let Some(f) = m.full {
            let held: BTreeSet<usize> = per_table[f]
                .get(&id)
                .unwrap_or(&empty)
                .keys()
                .copied()
                .collect();
            assert_eq!(&held, l, "{ctx}: full table of {id} vs its positions");
        }
        if let Some(r) = m.ring {
            let n = per_table[r].get(&id).map_or(0, |h| h.len());
            assert!(
                n <= m.keep,
                "{ctx}: ring table holds {n} > {} cells of {id}",
                m.keep
            );
        }
    }
    let mut min_free = usize::MAX;
    for (t, cells) in m.cells.iter().enumerate() {
        let free = m.free(t);
        min_free = min_free.min(free);
        assert_eq!(
            c.free_cells_in(t).unwrap(),
            free,
            "{ctx}: free cells of table {t}"
        );
        for (j, cell) in cells.iter().enumerate() {
            let pos = c.cell_pos(t, j).unwrap();
            match cell {
                None => assert!(pos.is_none(), "{ctx}: table {t} cell {j} should be free"),
                Some((p, o)) => {
                    assert_eq!(pos, Some(*p), "{ctx}: table {t} cell {j} position");
                    let owners = c.cell_owners(t, j).unwrap();
                    let same = owners.len() == o.len() && owners.iter().all(|x| o.contains(x));
                    assert!(same, "{ctx}: table {t} cell {j} owners {owners:?} vs {o:?}");
                }
            }
        }
    }
    assert_eq!(c.free_cells(), min_free, "{ctx}: free_cells");
    if m.ring.is_none() {
        let owned = m.cells[0].iter().filter(|x| x.is_some()).count();
        assert_eq!(
            c.free_cells(),
            m.n_cells - owned,
            "{ctx}: flat free == n_cells - owned"
        );
    }
}

/// After a step: every layer's plan, visible(i) and dense mask against the model.
fn check_step(c: &mut CellCache, m: &Model, ctx: &str) {
    let (toks, cells) = m.step.clone().unwrap();
    let n_layers = m.layer_pol.len();
    let mut scratch: Vec<Run> = Vec::with_capacity(64);
    let mut naive: Vec<Vec<Vec<usize>>> = Vec::with_capacity(n_layers);
    for layer in 0..n_layers {
        let mut rows = Vec::with_capacity(toks.len());
        let t = m.table_of(layer);
        assert_eq!(c.table_of(layer).unwrap(), t);
        let used_end = m.cells[t]
            .iter()
            .rposition(|x| x.is_some())
            .map_or(0, |j| j + 1);
        let pl = c.plan(layer).unwrap();
        assert_eq!(pl.n_tokens(), toks.len());
        assert_eq!(pl.table(), t);
        assert_eq!(pl.policy(), m.layer_pol[layer]);
        assert_eq!(
            pl.cells(),
            cells[t].as_slice(),
            "{ctx}: layer {layer} cells"
        );
        assert_eq!(pl.read_len(), used_end, "{ctx}: layer {layer} read_len");
        for (i, &(id, p)) in toks.iter().enumerate() {
            assert_eq!(pl.seq_ids()[i], id);
            assert_eq!(pl.positions()[i], p);
            let want = m.naive_visible(layer, id, p);
            let runs = pl.visible(i).unwrap();
            assert_eq!(
                expand(&runs),
                want,
                "{ctx}: layer {layer} token {i} visible"
            );
            rows.push(want);
            // visible_into appends after what is there.
            scratch.clear();
            scratch.push(Run::new(usize::MAX - 1, 1));
            pl.visible_into(i, &mut scratch).unwrap();
            assert_eq!(scratch[0], Run::new(usize::MAX - 1, 1));
            assert_eq!(&scratch[1..], runs.as_slice());
        }
        assert_eq!(kind(&pl.visible(toks.len())), Err("InvalidArgument"));
        naive.push(rows);
    }
    for (layer, naive_rows) in naive.iter().enumerate() {
        let t = m.table_of(layer);
        let read_len = m.cells[t]
            .iter()
            .rposition(|x| x.is_some())
            .map_or(0, |j| j + 1);
        let mask = c.dense_mask(layer).unwrap();
        assert_eq!(mask.len(), toks.len() * read_len, "{ctx}: mask size");
        let mut want = vec![0u8; read_len];
        for (i, row) in mask.chunks(read_len.max(1)).enumerate() {
            want.fill(0);
            for &j in &naive_rows[i] {
                want[j] = 1;
            }
            assert_eq!(
                row,
                want.as_slice(),
                "{ctx}: layer {layer} token {i} dense mask"
            );
        }
    }
    assert_eq!(kind(&c.plan(n_layers)), Err("InvalidArgument"));
}

fn random_config(rng: &mut Rng) -> (Vec<LayerPolicy>, CacheConfig, usize, usize) {
    let n_layers = rng.range(1, 4);
    let mode = rng.below(10); // 0-2 flat only, 3-7 mixed, 8-9 ring only
    let mut pols: Vec<LayerPolicy> = (0..n_layers)
        .map(|_| {
            let ring = match mode {
                0..=2 => false,
                8..=9 => true,
                _ => rng.pct(50),
            };
            if ring {
                let hi = if rng.pct(50) { 6 } else { 32 };
                LayerPolicy::Ring {
                    window: rng.range(1, hi),
                }
            } else {
                LayerPolicy::Flat
            }
        })
        .collect();
    if (3..=7).contains(&mode) {
        // Mixed: at least one of each.
        pols[0] = LayerPolicy::Flat;
        if n_layers == 1 {
            pols.push(LayerPolicy::Ring {
                window: rng.range(1, 32),
            });
        } else if !pols.iter().any(|p| p.window().is_some()) {
            pols[n_layers - 1] = LayerPolicy::Ring {
                window: rng.range(1, 32),
            };
        }
    }
    let layers: Vec<LayerConfig> = pols.iter().map(|p| LayerConfig::new(*p, 1, 4)).collect();
    let mut cfg = CacheConfig::new(1 << 20, pols.len(), layers);
    cfg.max_step = rng.range(1, 8);
    let n_cells = rng.range(8, 64);
    let n_seq_max = if rng.pct(20) {
        rng.range(65, 300)
    } else {
        rng.range(1, 8)
    };
    (pols, cfg, n_cells, n_seq_max)
}

struct Stats {
    ops: usize,
    refused: BTreeMap<&'static str, usize>,
    by_op: BTreeMap<String, usize>,
    steps: usize,
}

fn pick_live(rng: &mut Rng, m: &Model) -> Option<SeqId> {
    if m.seqs.is_empty() {
        return None;
    }
    let k = rng.below(m.seqs.len());
    m.seqs.keys().nth(k).copied()
}

fn bogus_id(rng: &mut Rng, m: &Model, dead: &[SeqId]) -> SeqId {
    loop {
        let id = match rng.below(3) {
            0 if !dead.is_empty() => dead[rng.below(dead.len())],
            1 => (m.n_seq_max + rng.below(1000)) as SeqId,
            _ => rng.next() as SeqId,
        };
        if !m.seqs.contains_key(&id) {
            return id;
        }
    }
}

fn gen_step(rng: &mut Rng, m: &Model, dead: &[SeqId]) -> (Vec<SeqId>, Vec<usize>) {
    let n = if rng.pct(3) {
        [0, m.max_step + 1][rng.below(2)]
    } else {
        rng.range(1, m.max_step)
    };
    let n_seqs = rng.range(1, 3).min(m.seqs.len().max(1));
    let mut chosen: Vec<SeqId> = Vec::new();
    for _ in 0..n_seqs {
        if let Some(id) = pick_live(rng, m) {
            if !chosen.contains(&id) {
                chosen.push(id);
            }
        }
    }
    if chosen.is_empty() || rng.pct(2) {
        chosen.push(bogus_id(rng, m, dead));
    }
    let mut next: BTreeMap<SeqId, usize> = chosen
        .iter()
        .map(|&id| {
            let np = if m.seqs.contains_key(&id) {
                m.next_pos(id)
            } else {
                0
            };
            let gap = if rng.pct(80) { 0 } else { rng.range(1, 40) };
            (id, np + gap)
        })
        .collect();
    let mut ids = Vec::with_capacity(n);
    let mut pos = Vec::with_capacity(n);
    for _ in 0..n {
        let id = chosen[rng.below(chosen.len())];
        let p = next[&id];
        ids.push(id);
        pos.push(p);
        let gap = if rng.pct(85) { 0 } else { rng.range(1, 12) };
        next.insert(id, p + 1 + gap);
    }
    if n > 0 && rng.pct(4) {
        // A rewrite of a held position, or a repeat within the step.
        let i = rng.below(n);
        pos[i] = pos[i].saturating_sub(rng.range(1, 3));
    }
    if rng.pct(1) {
        pos.push(0);
    }
    (ids, pos)
}

fn run_config(seed: u64, n_ops: usize, stats: &mut Stats) {
    let mut rng = Rng(seed);
    let (pols, cfg, n_cells, n_seq_max) = random_config(&mut rng);
    let mut c = CellCache::new(cfg.clone(), n_cells, n_seq_max).unwrap();
    let mut m = Model::new(pols.clone(), n_cells, n_seq_max, cfg.max_step);
    assert_eq!(c.n_tables(), m.cells.len());
    assert_eq!(c.full_table(), m.full);
    assert_eq!(c.ring_table(), m.ring);
    let mut dead: Vec<SeqId> = Vec::new();
    // Printed only when an assertion below fails (the panic unwinds through it).
    struct Describe(String);
    impl Drop for Describe {
        fn drop(&mut self) {
            if std::thread::panicking() {
                eprintln!("config: {}", self.0);
            }
        }
    }
    let _describe = Describe(format!(
        "{pols:?}, {n_cells} cells, {n_seq_max} seqs, max_step {}",
        cfg.max_step
    ));
    for op in 0..n_ops {
        let ctx = format!("seed {seed:#x} op {op}");
        let tight = (0..m.cells.len()).any(|t| m.free(t) < (n_cells / 4).max(cfg.max_step));
        let roll = match (tight, rng.below(100)) {
            (true, 0..=29) => 65,
            (true, 30..=44) => 87,
            _ => rng.below(100),
        };
        // Fewer new sequences once a few are live, so some grow long.
        let roll = if (45..=56).contains(&roll) && m.seqs.len() >= 4 && rng.pct(70) {
            66
        } else {
            roll
        };
        let gen_before = c.generation();
        let open_before = m.step.is_some();
        let (expected, result, snapshot): (Expect, Expect, Option<CellCache>);
        let label: &'static str;
        match roll {
            0..=44 => {
                if m.seqs.is_empty() {
                    continue;
                }
                let (ids, pos) = gen_step(&mut rng, &m, &dead);
                expected = m.expect_step(&ids, &pos);
                label = "begin_step";
                snapshot = expected.is_err().then(|| c.clone());
                result = kind(&c.begin_step(&ids, &pos));
                if result.is_ok() && expected.is_ok() {
                    let cells: Vec<Vec<u32>> = (0..m.cells.len())
                        .map(|t| {
                            let layer = (0..pols.len()).find(|l| m.table_of(*l) == t).unwrap();
                            c.plan(layer).unwrap().cells().to_vec()
                        })
                        .collect();
                    m.apply_step(&ids, &pos, &cells);
                    assert_ne!(c.generation(), gen_before, "{ctx}: generation after a step");
                    stats.steps += 1;
                    compare(&c, &m, &ctx);
                    check_step(&mut c, &m, &ctx);
                }
            }
            45..=56 => {
                expected = if m.seqs.len() < m.n_seq_max {
                    Ok(())
                } else {
                    Err("OutOfCapacity")
                };
                label = "seq_new";
                snapshot = expected.is_err().then(|| c.clone());
                let r = c.seq_new();
                result = kind(&r);
                if let Ok(id) = r {
                    assert!(
                        !m.seqs.contains_key(&id) && !dead.contains(&id),
                        "{ctx}: seq_new gave {id} again"
                    );
                    m.seqs.insert(id, BTreeSet::new());
                }
            }
            57..=64 => {
                let src = if rng.pct(90) {
                    pick_live(&mut rng, &m)
                } else {
                    None
                }
                .unwrap_or_else(|| bogus_id(&mut rng, &m, &dead));
                let upto = if rng.pct(40) {
                    None
                } else {
                    let np = if m.seqs.contains_key(&src) {
                        m.next_pos(src)
                    } else {
                        10
                    };
                    Some(if rng.pct(50) {
                        np.saturating_sub(rng.below(m.keep + 4))
                    } else {
                        rng.below(np + 3)
                    })
                };
                expected = m.expect_clone(src, upto);
                label = if expected == Err("InvalidArgument") {
                    "seq_clone-hole"
                } else {
                    "seq_clone"
                };
                snapshot = expected.is_err().then(|| c.clone());
                let r = c.seq_clone(src, upto);
                result = kind(&r);
                if let (Ok(new), Ok(())) = (&r, &expected) {
                    assert!(!dead.contains(new));
                    m.apply_clone(src, upto, *new);
                }
            }
            65..=86 => {
                let seq = if rng.pct(95) {
                    pick_live(&mut rng, &m)
                } else {
                    None
                }
                .unwrap_or_else(|| bogus_id(&mut rng, &m, &dead));
                let np = if m.seqs.contains_key(&seq) {
                    m.next_pos(seq)
                } else {
                    10
                };
                let mode = if roll == 65 { 0 } else { rng.below(5) };
                let (p0, p1) = match mode {
                    // prefix
                    0 | 1 => (0, Some(rng.below(np + 2))),
                    // tail (a rewind)
                    2 => {
                        let back = if rng.pct(50) {
                            rng.range(0, 4)
                        } else {
                            rng.range(0, m.keep + 4)
                        };
                        (np.saturating_sub(back), None)
                    }
                    3 => {
                        let a = rng.below(np + 2);
                        (a, Some(a + rng.below(6)))
                    }
                    // p1 < p0 sometimes
                    _ => {
                        let a = rng.below(np + 2);
                        (a, Some(a.saturating_sub(rng.range(0, 2))))
                    }
                };
                expected = m.expect_rm(seq, p0, p1);
                label = match expected {
                    Err("InvalidArgument") if p1.is_none_or(|p1| p1 >= p0) => "seq_rm-hole",
                    _ => "seq_rm",
                };
                snapshot = expected.is_err().then(|| c.clone());
                result = kind(&c.seq_rm(seq, p0, p1));
                if result.is_ok() && expected.is_ok() {
                    m.apply_rm(seq, p0, p1);
                }
            }
            87..=93 => {
                let seq = if rng.pct(85) {
                    pick_live(&mut rng, &m)
                } else {
                    None
                }
                .unwrap_or_else(|| bogus_id(&mut rng, &m, &dead));
                expected = if m.seqs.contains_key(&seq) {
                    Ok(())
                } else {
                    Err("UnknownSequence")
                };
                label = "seq_free";
                snapshot = expected.is_err().then(|| c.clone());
                result = kind(&c.seq_free(seq));
                if result.is_ok() && expected.is_ok() {
                    m.apply_free(seq);
                    dead.push(seq);
                }
            }
            94..=98 => {
                // Planner calls on a maybe-closed step; bad layers.
                let layer = if rng.pct(80) {
                    rng.below(pols.len())
                } else {
                    pols.len() + rng.below(3)
                };
                let want: Expect = if layer >= pols.len() {
                    Err("InvalidArgument")
                } else if m.step.is_none() {
                    Err("StepProtocol")
                } else {
                    Ok(())
                };
                assert_eq!(kind(&c.plan(layer)), want, "{ctx}: plan({layer})");
                let before = c.clone();
                assert_eq!(
                    kind(&c.dense_mask(layer)),
                    want,
                    "{ctx}: dense_mask({layer})"
                );
                assert!(c == before, "{ctx}: dense_mask changed observable state");
                stats.ops += 1;
                continue;
            }
            _ => {
                if rng.pct(30) {
                    c.clear();
                    dead.extend(m.seqs.keys().copied());
                    let fresh = Model::new(pols.clone(), n_cells, n_seq_max, cfg.max_step);
                    m = fresh;
                    assert!(!(open_before && c.generation() == gen_before));
                    compare(&c, &m, &ctx);
                }
                stats.ops += 1;
                continue;
            }
        }
        stats.ops += 1;
        assert_eq!(result, expected, "{ctx}: roll {roll}");
        if let (Err(k), Some(snap)) = (&expected, snapshot) {
            *stats.refused.entry(k).or_default() += 1;
            *stats.by_op.entry(format!("{label}:{k}")).or_default() += 1;
            assert!(c == snap, "{ctx}: a refused call ({k}) changed the cache");
            assert_eq!(c.generation(), gen_before);
        } else if open_before && m.step.is_none() {
            assert_ne!(
                c.generation(),
                gen_before,
                "{ctx}: closing a step changes the generation"
            );
        }
        if roll > 44 || expected.is_err() {
            compare(&c, &m, &ctx);
        }
        // Keep dead small; prune ids that could be handed out again much later.
        if dead.len() > 512 {
            dead.drain(..256);
        }
    }
}

#[test]
fn cell_cache_matches_naive_model() {
    let mut stats = Stats {
        ops: 0,
        refused: BTreeMap::new(),
        by_op: BTreeMap::new(),
        steps: 0,
    };
    let configs = 50;
    let per = 2_100;
    for k in 0..configs {
        run_config(0xC0FF_EE00 + k as u64 * 7919, per, &mut stats);
    }
    eprintln!(
        "ops {} steps {} refused {:?}",
        stats.ops, stats.steps, stats.by_op
    );
    assert!(stats.ops >= 100_000, "only {} operations ran", stats.ops);
    for k in [
        "UnknownSequence",
        "InvalidArgument",
        "StepProtocol",
        "OutOfCapacity",
    ] {
        assert!(
            stats.refused.get(k).copied().unwrap_or(0) > 100,
            "too few {k} refusals: {:?}",
            stats.refused
        );
    }
    for k in [
        "seq_rm-hole:InvalidArgument",
        "seq_clone-hole:InvalidArgument",
        "begin_step:OutOfCapacity",
        "seq_clone:OutOfCapacity",
    ] {
        assert!(
            stats.by_op.get(k).copied().unwrap_or(0) > 20,
            "too few {k}: {:?}",
            stats.by_op
        );
    }
}
