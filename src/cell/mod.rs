//! `CellCache`: many sequences in one pool of cells (the llama.cpp model).
//!
//! A cell holds one position (or is free) and a bitset of the sequences that
//! own it. A sequence need not be contiguous; a fork (`seq_clone`) sets a second
//! bit on the cells it shares instead of copying K/V; a cell frees when its
//! owner set empties. Ids come from the cache (`seq_new`, `seq_clone`); an id it
//! did not hand out, or one already freed, is refused by every verb.
//!
//! # Step protocol
//!
//! `begin_step(seq_ids, positions)` is the admission gate and the placement,
//! all or nothing: it validates everything (ids, positions, room) before it
//! changes anything. Each token then gets the lowest free cell of each table,
//! found by a cursor over a free-cell bitmap that only moves back when a cell
//! below it frees: O(tokens + words scanned), never O(n_cells) per token, and
//! cells stay packed low so the read extent (`read_len`) stays tight. Every
//! layer of the step reuses that one placement. Any of `seq_rm`, `seq_clone`,
//! `seq_free`, `clear` closes the step; `plan` then errors. `seq_new` does not
//! (it cannot change a placement).
//!
//! `plan(layer)` is O(1): it borrows the step's cells and positions. The mask
//! lives in position space: token i sees cell j iff seq(i) owns j,
//! pos(j) <= pos(i) and, for a ring layer of window w, pos(j) > pos(i) - w.
//! [`CellStepPlan::visible`] walks seq(i)'s own (position, cell) list for that
//! table (binary search to the window, then the visible entries), so it costs
//! what that sequence holds, not `n_cells`. The dense `[T, read_len]` mask is
//! only built by [`CellCache::dense_mask`], memoized per distinct policy for the
//! step in buffers reused across steps.
//!
//! # Ring layers
//!
//! Ring layers get a second cell table that keeps a bounded number of
//! positions per sequence; the design and its refusals are in `ring.rs`.
//! Measured costs are in `docs/cell-cache.md`.
//!
//! # Ids
//!
//! 64-bit ids, at most `i64::MAX`, that never repeat in the process: an id
//! from one cache is refused by every other (see `ids.rs`).

mod audit;
mod ids;
mod placement;
mod plan;
mod queries;
mod restore;
mod ring;
mod table;
mod visibility;

pub use ids::{SeqId, MAX_SEQ_ID};
pub use plan::CellStepPlan;

use std::collections::VecDeque;

use crate::config::{CacheConfig, LayerPolicy, PolicyTable, MAX_CAPACITY};
use crate::error::{CacheError, Result};
use placement::Scratch;
use ring::{cut_ranges, list_max_below, max_outside, ranges_max_below};
use table::Table;
use visibility::Views;

/// Most sequences one cache may track at once.
pub const MAX_SEQS: usize = 65536;
/// Most cells of a table (cell indices fit a `u32`).
pub const MAX_CELLS: usize = MAX_CAPACITY;
/// Bound on `n_cells * ceil(n_seq_max / 64)` owner words per table (8 GiB).
pub const MAX_OWNER_WORDS: usize = 1 << 30;

/// One held (position, cell) pair of a sequence in one table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) pos: usize,
    pub(crate) cell: u32,
}

/// One sequence's state, at its index (an id's low 16 bits).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Seq {
    /// The id this index holds (live) or held last.
    id: SeqId,
    live: bool,
    /// Per table, the cells the sequence owns, sorted by position.
    pub(crate) lists: [VecDeque<Entry>; 2],
    /// Held positions the ring table dropped, as sorted disjoint `[start, end)`
    /// ranges, all below every ring entry.
    evicted: Vec<(usize, usize)>,
    evicted_len: usize,
}

/// Many sequences in one pool of cells. See the module docs.
///
/// `PartialEq` compares the observable state (scratch and memoized visibility
/// excluded): tests use it to check that a refused call changed nothing.
#[derive(Debug, Clone, PartialEq)]
pub struct CellCache {
    cfg: CacheConfig,
    n_cells: usize,
    n_seq_max: usize,
    /// Distinct policies and which one each layer uses.
    table: PolicyTable,
    /// Policy -> table.
    policy_table: Vec<usize>,
    full: Option<usize>,
    ring: Option<usize>,
    /// Largest ring window (0 without ring layers).
    ring_window: usize,
    /// Ring positions each sequence keeps: `ring_window + max_step - 1`.
    ring_keep: usize,
    tables: Vec<Table>,
    seqs: Vec<Seq>,
    /// Free indices; `pop` gives the next one.
    free_indices: Vec<u32>,
    n_live: usize,
    step_open: bool,
    step_ids: Vec<SeqId>,
    step_indices: Vec<u32>,
    step_pos: Vec<usize>,
    generation: u64,
    scratch: Scratch,
    /// Per distinct policy: the open step's visibility, memoized.
    views: Vec<Views>,
}

impl CellCache {
    /// Validates `cfg`, `1 <= n_cells <= MAX_CELLS`, `1 <= n_seq_max <= MAX_SEQS`,
    /// and builds an empty cache.
    pub fn new(cfg: CacheConfig, n_cells: usize, n_seq_max: usize) -> Result<Self> {
        cfg.validate()?;
        if n_cells == 0 || n_cells > MAX_CELLS {
            return Err(CacheError::InvalidArgument(format!(
                "n_cells must be in 1..={MAX_CELLS}, got {n_cells}"
            )));
        }
        if n_seq_max == 0 || n_seq_max > MAX_SEQS {
            return Err(CacheError::InvalidArgument(format!(
                "n_seq_max must be in 1..={MAX_SEQS}, got {n_seq_max}"
            )));
        }
        let words = n_seq_max.div_ceil(64);
        let owner_words = n_cells
            .checked_mul(words)
            .filter(|w| *w <= MAX_OWNER_WORDS)
            .ok_or_else(|| {
                CacheError::InvalidArgument(format!(
                    "n_cells {n_cells} x n_seq_max {n_seq_max}: owner bitsets would need more than {MAX_OWNER_WORDS} words"
                ))
            })?;
        let table = cfg.distinct_policies()?;
        let policies = table.policies();
        let has_flat = policies.contains(&LayerPolicy::Flat);
        let ring_window = policies
            .iter()
            .filter_map(|p| p.window())
            .max()
            .unwrap_or(0);
        let mut tables = Vec::with_capacity(2);
        let full = if has_flat {
            tables.push(Table::new(n_cells, words, owner_words));
            Some(0)
        } else {
            None
        };
        let ring = if ring_window > 0 {
            tables.push(Table::new(n_cells, words, owner_words));
            Some(tables.len().saturating_sub(1))
        } else {
            None
        };
        // Saturating: a window at or above what a sequence can hold keeps every
        // position, which is what a full layer does.
        let ring_keep = crate::window::ring_keep(ring_window, cfg.max_step);
        let policy_table = policies
            .iter()
            .map(|p| match p {
                LayerPolicy::Flat => full.unwrap_or(0),
                LayerPolicy::Ring { .. } => ring.unwrap_or(0),
            })
            .collect();
        let n_pol = policies.len();
        let n_indices = u32::try_from(n_seq_max).map_err(|_| {
            CacheError::InvalidArgument(format!("n_seq_max {n_seq_max} does not fit a u32"))
        })?;
        Ok(CellCache {
            cfg,
            n_cells,
            n_seq_max,
            table,
            policy_table,
            full,
            ring,
            ring_window,
            ring_keep,
            tables,
            seqs: vec![Seq::default(); n_seq_max],
            free_indices: (0..n_indices).rev().collect(),
            n_live: 0,
            step_open: false,
            step_ids: Vec::new(),
            step_indices: Vec::new(),
            step_pos: Vec::new(),
            generation: 0,
            scratch: Scratch {
                stamp: 0,
                seen: vec![0; n_seq_max],
                last: vec![0; n_seq_max],
                count: vec![0; n_seq_max],
                drop_n: vec![0; n_seq_max],
                keep_from: vec![0; n_seq_max],
                distinct: Vec::new(),
            },
            views: vec![Views::default(); n_pol],
        })
    }

    pub fn config(&self) -> &CacheConfig {
        &self.cfg
    }

    /// Cells per table.
    pub fn capacity(&self) -> usize {
        self.n_cells
    }

    pub fn n_seq_max(&self) -> usize {
        self.n_seq_max
    }

    /// Free cells of the tightest table.
    pub fn free_cells(&self) -> usize {
        self.tables.iter().map(|t| t.n_free).min().unwrap_or(0)
    }

    /// Free cells of table `table`.
    pub fn free_cells_in(&self, table: usize) -> Result<usize> {
        Ok(self.table_ref(table)?.n_free)
    }

    /// Whether `n` more tokens fit in the free cells of every table. Conservative
    /// for the ring table, whose drops at `begin_step` may free more.
    pub fn can_extend(&self, n: usize) -> bool {
        n <= self.free_cells()
    }

    /// Number of cell tables: 1 or 2 (see the module docs).
    pub fn n_tables(&self) -> usize {
        self.tables.len()
    }

    /// The full table (flat layers), if the config has a flat layer.
    pub fn full_table(&self) -> Option<usize> {
        self.full
    }

    /// The ring table (ring layers), if the config has a ring layer.
    pub fn ring_table(&self) -> Option<usize> {
        self.ring
    }

    /// Positions each sequence keeps in the ring table: largest window +
    /// max_step - 1 (`None` without ring layers).
    pub fn ring_keep(&self) -> Option<usize> {
        self.ring.map(|_| self.ring_keep)
    }

    /// The distinct policies, in first-seen layer order.
    pub fn policies(&self) -> &[LayerPolicy] {
        self.table.policies()
    }

    /// Index into [`Self::policies`] of a layer's policy.
    pub fn policy_index(&self, layer: usize) -> Result<usize> {
        self.table.index(layer)
    }

    /// Which cell table a layer's K/V pools are indexed by.
    pub fn table_of(&self, layer: usize) -> Result<usize> {
        self.table.of_layer(layer, &self.policy_table)
    }

    /// Changes whenever a step opens or closes.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn step_open(&self) -> bool {
        self.step_open
    }

    fn table_ref(&self, table: usize) -> Result<&Table> {
        self.tables.get(table).ok_or_else(|| {
            CacheError::InvalidArgument(format!(
                "table {table} out of range: the cache has {} tables",
                self.tables.len()
            ))
        })
    }

    fn seq_ref(&self, ix: usize) -> Option<&Seq> {
        self.seqs.get(ix)
    }

    /// The list that holds a sequence's logical positions (with the evicted
    /// ranges when there is no full table).
    fn logical_table(&self) -> usize {
        self.full.or(self.ring).unwrap_or(0)
    }

    fn max_logical_below(&self, ix: usize, bound: usize) -> Option<usize> {
        let seq = self.seq_ref(ix)?;
        let in_list = list_max_below(seq.lists.get(self.logical_table())?, bound);
        if self.full.is_some() {
            in_list
        } else {
            in_list.max(ranges_max_below(&seq.evicted, bound))
        }
    }

    fn next_pos_slot(&self, ix: usize) -> usize {
        self.max_logical_below(ix, usize::MAX)
            .map_or(0, |m| m.saturating_add(1))
    }

    fn close_step(&mut self) {
        if self.step_open {
            self.step_open = false;
            self.generation = self.generation.wrapping_add(1);
        }
    }

    /// A new empty sequence. Does not close an open step.
    pub fn seq_new(&mut self) -> Result<SeqId> {
        let ix = self.alloc_index("seq_new")?;
        Ok(self.id_of(ix))
    }

    /// A new sequence owning `src`'s cells with position `< upto` (all when
    /// `None`) by setting its bit: no K/V is copied. Closes the step.
    pub fn seq_clone(&mut self, src: SeqId, upto: Option<usize>) -> Result<SeqId> {
        let src_ix = self.index_of(src, "seq_clone")?;
        let up = upto.unwrap_or(usize::MAX);
        if self.n_live >= self.n_seq_max {
            return Err(CacheError::OutOfCapacity(format!(
                "seq_clone: all {} sequence ids are live (n_seq_max)",
                self.n_seq_max
            )));
        }
        let max_after = self.max_logical_below(src_ix, up);
        let ev_after = self.max_evicted_below(src_ix, up);
        self.check_hole("seq_clone", src, max_after, ev_after)?;
        let new_ix = self.alloc_index("seq_clone")?;
        let mut lists: [VecDeque<Entry>; 2] = Default::default();
        let mut evicted = Vec::new();
        let mut evicted_len = 0usize;
        if let Some(s) = self.seqs.get(src_ix) {
            for ((src_list, dst), table) in s
                .lists
                .iter()
                .zip(lists.iter_mut())
                .zip(self.tables.iter_mut())
            {
                let k = src_list.partition_point(|e| e.pos < up);
                dst.extend(src_list.range(..k).copied());
                for e in dst.iter() {
                    table.add_owner(e.cell as usize, new_ix);
                }
            }
            for &(a, b) in &s.evicted {
                if a >= up {
                    break;
                }
                let b = b.min(up);
                evicted.push((a, b));
                evicted_len = evicted_len.saturating_add(b.saturating_sub(a));
            }
        }
        if let Some(d) = self.seqs.get_mut(new_ix) {
            d.lists = lists;
            d.evicted = evicted;
            d.evicted_len = evicted_len;
        }
        self.close_step();
        Ok(self.id_of(new_ix))
    }

    /// Drops `seq`'s positions in `[p0, p1)` (`p1 = None`: to the end); a cell
    /// whose owner set empties is freed. Refused when `p1 < p0`, and when the
    /// ring table dropped a position the remaining sequence's next step needs.
    /// Closes the step.
    pub fn seq_rm(&mut self, seq: SeqId, p0: usize, p1: Option<usize>) -> Result<()> {
        let ix = self.index_of(seq, "seq_rm")?;
        if let Some(p1) = p1 {
            if p1 < p0 {
                return Err(CacheError::InvalidArgument(format!(
                    "seq_rm: p1 {p1} is below p0 {p0}"
                )));
            }
        }
        let p1 = p1.unwrap_or(usize::MAX);
        let max_after = max_outside(|b| self.max_logical_below(ix, b), p0, p1);
        let ev_after = max_outside(|b| self.max_evicted_below(ix, b), p0, p1);
        self.check_hole("seq_rm", seq, max_after, ev_after)?;
        if let Some(s) = self.seqs.get_mut(ix) {
            for (list, table) in s.lists.iter_mut().zip(self.tables.iter_mut()) {
                let a = list.partition_point(|e| e.pos < p0);
                let b = list.partition_point(|e| e.pos < p1).max(a);
                for e in list.drain(a..b) {
                    table.remove_owner(e.cell as usize, ix);
                }
            }
            let gone = cut_ranges(&mut s.evicted, p0, p1);
            s.evicted_len = s.evicted_len.saturating_sub(gone);
        }
        self.close_step();
        Ok(())
    }

    /// Drops every position of `seq` and retires its id. Closes the step.
    pub fn seq_free(&mut self, seq: SeqId) -> Result<()> {
        let ix = self.index_of(seq, "seq_free")?;
        if let Some(s) = self.seqs.get_mut(ix) {
            for (list, table) in s.lists.iter_mut().zip(self.tables.iter_mut()) {
                for e in list.drain(..) {
                    table.remove_owner(e.cell as usize, ix);
                }
            }
            s.evicted.clear();
            s.evicted_len = 0;
        }
        self.retire_index(ix);
        self.close_step();
        Ok(())
    }

    /// Frees every cell and retires every id; closes the step.
    pub fn clear(&mut self) {
        for t in &mut self.tables {
            t.reset();
        }
        for ix in 0..self.seqs.len() {
            if let Some(s) = self.seqs.get_mut(ix) {
                for l in &mut s.lists {
                    l.clear();
                }
                s.evicted.clear();
                s.evicted_len = 0;
            }
            self.retire_index(ix);
        }
        // Lowest index first, as after construction.
        self.free_indices.clear();
        self.free_indices.extend(
            (0..self.seqs.len())
                .rev()
                .filter_map(|s| u32::try_from(s).ok()),
        );
        self.close_step();
    }

    /// Admission and placement of one step, all or nothing: one entry per
    /// token. Checks `1 <= tokens <= max_step`, that every id is live, that each
    /// sequence's positions are strictly increasing within the step and beyond
    /// every position it holds, and room; then places every token in every
    /// table and opens the step. A refused call changes nothing (an open step
    /// stays open).
    pub fn begin_step(&mut self, seq_ids: &[SeqId], positions: &[usize]) -> Result<()> {
        let n = seq_ids.len();
        if n != positions.len() {
            return Err(CacheError::InvalidArgument(format!(
                "begin_step: {n} seq_ids but {} positions",
                positions.len()
            )));
        }
        if n == 0 || n > self.cfg.max_step {
            return Err(CacheError::InvalidArgument(format!(
                "begin_step: tokens must be in 1..=max_step ({}), got {n}",
                self.cfg.max_step
            )));
        }
        self.check_tokens(seq_ids, positions)?;
        self.check_room(n)?;
        self.place(seq_ids, positions)
    }

    /// The open step's plan for `layer`: O(1), borrowing the step's placement.
    pub fn plan(&self, layer: usize) -> Result<CellStepPlan<'_>> {
        let pi = self.policy_index(layer)?;
        if !self.step_open {
            return Err(CacheError::StepProtocol(format!(
                "plan: no open step for layer {layer} (call begin_step first; seq_rm, seq_clone, seq_free and clear close the step)"
            )));
        }
        let ti = self.policy_table.get(pi).copied().unwrap_or(0);
        let table = self.table_ref(ti)?;
        let policy = self.table.policy(layer)?;
        Ok(CellStepPlan {
            cells: &table.step_cells,
            positions: &self.step_pos,
            seq_ids: &self.step_ids,
            seq_indices: &self.step_indices,
            seqs: &self.seqs,
            read_len: table.read_len,
            policy,
            table: ti,
        })
    }
}
