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
//! # Ring layers: two cell tables
//!
//! A ring layer must not keep every old cell alive, yet the flat layers of the
//! same model need every position. Like llama.cpp's separate sliding-window
//! cache, this cache keeps **up to two cell tables of `n_cells` cells each**: a
//! *full* table (present iff the config has a flat layer) indexed by the flat
//! layers' K/V pools, and a *ring* table (present iff it has a ring layer)
//! indexed by every ring layer's pools. Each token gets a cell in each table;
//! [`CellCache::table_of`] says which table a layer uses. An all-ring model has
//! only the ring table, so it never runs out of cells from context growth; a
//! flat-only model has only the full table and pays nothing for rings.
//!
//! In the ring table each sequence keeps only its `D = W + max_step - 1`
//! highest positions, where `W` is the largest ring window. At `begin_step`,
//! before placing, each sequence of the step drops its bit on its oldest ring
//! cells so that after placement it holds at most `D` (a cell whose owner set
//! empties is freed and may take one of the step's tokens). Why `D` highest
//! positions rather than a position floor:
//! - the step's earliest query needs at most `W - 1` older held positions, and
//!   they are the highest ones, so `D` covers every query of a step of up to
//!   `max_step` tokens, also when positions have gaps;
//! - a rewind (`seq_rm` of a tail) of up to `max_step` tokens after a step
//!   leaves the `W - 1` highest remaining positions in the ring, which is what
//!   the next step needs (speculative decoding relies on it);
//! - the ring table per sequence is bounded by `D` cells exactly, like a
//!   `SequenceCache` ring pool's depth.
//!
//! Positions a sequence dropped from the ring table are still *held* (logical
//! length, `next_pos`, `seq_len` and the full table are unchanged); they are
//! recorded per sequence as sorted ranges (normally one, `[0, floor)`; one more
//! per gap). A `seq_rm` of a tail, or a `seq_clone` with `upto`, that would
//! leave a sequence whose next step (from `n = next_pos`) needs a dropped
//! position (any held `p` with `p > n - W`) is refused with
//! [`CacheError::InvalidArgument`], never served with a hole.
//!
//! Costs: the ring table doubles cell bookkeeping (two placements per token)
//! and the K/V bytes of ring layers live in a pool of `n_cells` rows indexed by
//! ring cells; in exchange the ring table holds `<= D` cells per live sequence
//! whatever the context, and flat layers keep using dense, low cell indices.
//!
//! Measured (`benches/cell.rs`, 32 layers alternating flat / ring(512), both
//! tables; medians on a shared 2-core dev box): one sequence decoding at 8K
//! context in 16K cells, `begin_step` + `plan` for all 32 layers, ~0.27 µs per
//! step; 64 sequences x 1000 tokens decoding one token each, ~4.5 µs in 64K
//! cells and ~4.7 µs in 256K cells (placement does not scale with `n_cells`);
//! a 512-token prefill step ~12.5 µs; `seq_clone` / `seq_free` of a 4K-token
//! sequence ~16 µs each. Building the dense masks of the 64-sequence step costs
//! ~220 µs, the sparse `visible_into` runs of every token ~105 µs.
//!
//! `free_cells`/`can_extend` are conservative for the ring table: a step may be
//! admitted with fewer free ring cells than tokens when its own sequences'
//! drops free enough (admission counts exactly which cells would free).
//!
//! # Ids
//!
//! An id is `generation * n_seq_max + slot`; freeing a slot bumps its
//! generation, so a stale id is refused rather than aliasing a new sequence.
//! The first `n_seq_max` ids handed out after construction are `0, 1, 2, ...`.

mod plan;
mod table;

pub use plan::CellStepPlan;

use std::collections::VecDeque;
use std::fmt;

use crate::config::{CacheConfig, LayerPolicy, MAX_CAPACITY};
use crate::error::{CacheError, Result};
use table::{Table, FREE};

/// A sequence id, handed out by [`CellCache::seq_new`] / [`CellCache::seq_clone`].
pub type SeqId = u32;

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

/// A sequence slot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Seq {
    /// Generation of the id this slot hands out (or handed out last).
    gen: u32,
    live: bool,
    /// Per table, the cells the sequence owns, sorted by position.
    pub(crate) lists: [VecDeque<Entry>; 2],
    /// Held positions the ring table dropped, as sorted disjoint `[start, end)`
    /// ranges, all below every ring entry.
    evicted: Vec<(usize, usize)>,
    evicted_len: usize,
}

/// Per-call scratch of `begin_step`, sized by `n_seq_max`. Not state: it is
/// neither compared nor printed.
#[derive(Clone, Default)]
struct Scratch {
    stamp: u64,
    /// `seen[slot] == stamp` when the slot has a token in the step being checked.
    seen: Vec<u64>,
    last: Vec<usize>,
    count: Vec<usize>,
    /// Ring entries the slot drops before placement.
    drop_n: Vec<usize>,
    /// Position of the slot's first kept ring entry (`usize::MAX`: none).
    keep_from: Vec<usize>,
    /// Distinct slots of the step, in first-token order.
    distinct: Vec<usize>,
}

impl fmt::Debug for Scratch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Scratch")
    }
}

impl PartialEq for Scratch {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// Dense masks of the open step, one buffer per distinct policy (derived data:
/// neither compared nor printed in full).
#[derive(Clone, Default)]
struct Masks {
    built: Vec<bool>,
    bufs: Vec<Vec<u8>>,
}

impl fmt::Debug for Masks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Masks").field("built", &self.built).finish()
    }
}

impl PartialEq for Masks {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// Many sequences in one pool of cells. See the module docs.
///
/// `PartialEq` compares the observable state (scratch and memoized masks
/// excluded): tests use it to check that a refused call changed nothing.
#[derive(Debug, Clone, PartialEq)]
pub struct CellCache {
    cfg: CacheConfig,
    n_cells: usize,
    n_seq_max: usize,
    /// Distinct policies, in first-seen layer order.
    policies: Vec<LayerPolicy>,
    /// Layer -> index into `policies`.
    layer_policy: Vec<usize>,
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
    /// Free slots; `pop` gives the next one.
    free_slots: Vec<u32>,
    n_live: usize,
    step_open: bool,
    step_ids: Vec<SeqId>,
    step_slots: Vec<u32>,
    step_pos: Vec<usize>,
    generation: u64,
    scratch: Scratch,
    masks: Masks,
}

fn unknown(verb: &str, id: SeqId) -> CacheError {
    CacheError::UnknownSequence(format!(
        "{verb}: sequence id {id} is not live (not handed out by this cache, or already freed)"
    ))
}

/// Removes `[p0, p1)` from sorted disjoint ranges; returns how many positions went.
fn cut_ranges(ranges: &mut Vec<(usize, usize)>, p0: usize, p1: usize) -> usize {
    if p0 >= p1 || !ranges.iter().any(|&(s, e)| s < p1 && e > p0) {
        return 0;
    }
    let mut removed = 0usize;
    let mut out = Vec::with_capacity(ranges.len().saturating_add(1));
    for &(s, e) in ranges.iter() {
        if e <= p0 || s >= p1 {
            out.push((s, e));
            continue;
        }
        if s < p0 {
            out.push((s, p0));
        }
        if e > p1 {
            out.push((p1, e));
        }
        removed = removed.saturating_add(e.min(p1).saturating_sub(s.max(p0)));
    }
    *ranges = out;
    removed
}

/// Largest position below `bound` in sorted disjoint ranges.
fn ranges_max_below(ranges: &[(usize, usize)], bound: usize) -> Option<usize> {
    let k = ranges.partition_point(|r| r.0 < bound);
    let (_, e) = *ranges.get(k.checked_sub(1)?)?;
    e.min(bound).checked_sub(1)
}

/// Largest position below `bound` in a position-sorted list.
fn list_max_below(list: &VecDeque<Entry>, bound: usize) -> Option<usize> {
    let k = list.partition_point(|e| e.pos < bound);
    list.get(k.checked_sub(1)?).map(|e| e.pos)
}

/// The largest of `f`'s values not in `[p0, p1)`, where `f(b)` is the largest
/// held position below `b`.
fn max_outside(f: impl Fn(usize) -> Option<usize>, p0: usize, p1: usize) -> Option<usize> {
    let m = f(usize::MAX)?;
    if m >= p0 && m < p1 {
        f(p0)
    } else {
        Some(m)
    }
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
        let (policies, layer_policy) = cfg.distinct_policies()?;
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
        let ring_keep = ring_window
            .checked_add(cfg.max_step.saturating_sub(1))
            .ok_or_else(|| {
                CacheError::InvalidConfig(format!(
                    "ring window {ring_window} + max_step {} overflows",
                    cfg.max_step
                ))
            })?;
        let policy_table = policies
            .iter()
            .map(|p| match p {
                LayerPolicy::Flat => full.unwrap_or(0),
                LayerPolicy::Ring { .. } => ring.unwrap_or(0),
            })
            .collect();
        let n_pol = policies.len();
        let n_slots = u32::try_from(n_seq_max).map_err(|_| {
            CacheError::InvalidArgument(format!("n_seq_max {n_seq_max} does not fit a u32"))
        })?;
        Ok(CellCache {
            cfg,
            n_cells,
            n_seq_max,
            policies,
            layer_policy,
            policy_table,
            full,
            ring,
            ring_window,
            ring_keep,
            tables,
            seqs: vec![Seq::default(); n_seq_max],
            free_slots: (0..n_slots).rev().collect(),
            n_live: 0,
            step_open: false,
            step_ids: Vec::new(),
            step_slots: Vec::new(),
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
            masks: Masks {
                built: vec![false; n_pol],
                bufs: vec![Vec::new(); n_pol],
            },
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
        &self.policies
    }

    /// Index into [`Self::policies`] of a layer's policy.
    pub fn policy_index(&self, layer: usize) -> Result<usize> {
        self.layer_policy
            .get(layer)
            .copied()
            .ok_or_else(|| self.layer_error(layer))
    }

    /// Which cell table a layer's K/V pools are indexed by.
    pub fn table_of(&self, layer: usize) -> Result<usize> {
        let pi = self.policy_index(layer)?;
        self.policy_table
            .get(pi)
            .copied()
            .ok_or_else(|| self.layer_error(layer))
    }

    /// Changes whenever a step opens or closes.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn step_open(&self) -> bool {
        self.step_open
    }

    fn layer_error(&self, layer: usize) -> CacheError {
        CacheError::InvalidArgument(format!(
            "layer {layer} out of range: the cache has {} layers",
            self.cfg.n_layers
        ))
    }

    fn table_ref(&self, table: usize) -> Result<&Table> {
        self.tables.get(table).ok_or_else(|| {
            CacheError::InvalidArgument(format!(
                "table {table} out of range: the cache has {} tables",
                self.tables.len()
            ))
        })
    }

    fn id_of(&self, slot: usize) -> SeqId {
        let gen = self.seqs.get(slot).map_or(0, |s| u64::from(s.gen));
        let id = gen
            .checked_mul(self.n_seq_max as u64)
            .and_then(|x| x.checked_add(slot as u64))
            .unwrap_or(u64::MAX);
        SeqId::try_from(id).unwrap_or(SeqId::MAX)
    }

    fn slot_of(&self, id: SeqId, verb: &str) -> Result<usize> {
        // n_seq_max >= 1 (validated by `new`); a zero divisor is refused, not a panic.
        let (Some(slot), Some(gen)) = (
            (id as usize).checked_rem(self.n_seq_max),
            (id as usize).checked_div(self.n_seq_max),
        ) else {
            return Err(unknown(verb, id));
        };
        match self.seqs.get(slot) {
            Some(s) if s.live && s.gen as usize == gen => Ok(slot),
            _ => Err(unknown(verb, id)),
        }
    }

    /// Live sequence ids, in slot order.
    pub fn live_seqs(&self) -> Vec<SeqId> {
        (0..self.seqs.len())
            .filter(|s| self.seqs.get(*s).is_some_and(|q| q.live))
            .map(|s| self.id_of(s))
            .collect()
    }

    /// Whether `seq` is live.
    pub fn is_live(&self, seq: SeqId) -> bool {
        self.slot_of(seq, "is_live").is_ok()
    }

    fn seq_ref(&self, slot: usize) -> Option<&Seq> {
        self.seqs.get(slot)
    }

    /// The list that holds a sequence's logical positions (with the evicted
    /// ranges when there is no full table).
    fn logical_table(&self) -> usize {
        self.full.or(self.ring).unwrap_or(0)
    }

    fn max_logical_below(&self, slot: usize, bound: usize) -> Option<usize> {
        let seq = self.seq_ref(slot)?;
        let in_list = list_max_below(seq.lists.get(self.logical_table())?, bound);
        if self.full.is_some() {
            in_list
        } else {
            in_list.max(ranges_max_below(&seq.evicted, bound))
        }
    }

    fn max_evicted_below(&self, slot: usize, bound: usize) -> Option<usize> {
        ranges_max_below(&self.seq_ref(slot)?.evicted, bound)
    }

    fn next_pos_slot(&self, slot: usize) -> usize {
        self.max_logical_below(slot, usize::MAX)
            .map_or(0, |m| m.saturating_add(1))
    }

    /// One past the highest position `seq` holds, 0 if none.
    pub fn next_pos(&self, seq: SeqId) -> Result<usize> {
        let slot = self.slot_of(seq, "next_pos")?;
        Ok(self.next_pos_slot(slot))
    }

    /// Positions `seq` holds (including those the ring table dropped).
    pub fn seq_len(&self, seq: SeqId) -> Result<usize> {
        let slot = self.slot_of(seq, "seq_len")?;
        let s = self.seq_ref(slot).ok_or_else(|| unknown("seq_len", seq))?;
        let list_len = s.lists.get(self.logical_table()).map_or(0, |l| l.len());
        Ok(if self.full.is_some() {
            list_len
        } else {
            list_len.saturating_add(s.evicted_len)
        })
    }

    /// `seq`'s (position, cell) pairs in `table`, sorted by position.
    pub fn seq_cells(&self, seq: SeqId, table: usize) -> Result<Vec<(usize, u32)>> {
        let slot = self.slot_of(seq, "seq_cells")?;
        self.table_ref(table)?;
        Ok(self
            .seq_ref(slot)
            .and_then(|s| s.lists.get(table))
            .map(|l| l.iter().map(|e| (e.pos, e.cell)).collect())
            .unwrap_or_default())
    }

    /// The position cell `cell` of `table` holds, `None` if free.
    pub fn cell_pos(&self, table: usize, cell: usize) -> Result<Option<usize>> {
        let t = self.table_ref(table)?;
        let p = t.pos.get(cell).copied().ok_or_else(|| {
            CacheError::InvalidArgument(format!(
                "cell {cell} out of range: tables have {} cells",
                self.n_cells
            ))
        })?;
        Ok((p != FREE).then_some(p))
    }
    /// Cells of `table` owned by two sequences or more (shared by forks).
    /// O(n_cells x owner words): a statistic, not for the hot path.
    pub fn shared_cells(&self, table: usize) -> Result<usize> {
        let t = self.table_ref(table)?;
        let mut shared = 0usize;
        for cell in 0..self.n_cells {
            let owners: u32 = t.owner_words(cell).iter().map(|w| w.count_ones()).sum();
            if owners >= 2 {
                shared = shared.saturating_add(1);
            }
        }
        Ok(shared)
    }

    /// The ids owning cell `cell` of `table`, in slot order.
    pub fn cell_owners(&self, table: usize, cell: usize) -> Result<Vec<SeqId>> {
        self.cell_pos(table, cell)?;
        let t = self.table_ref(table)?;
        let mut out = Vec::new();
        for (w, word) in t.owner_words(cell).iter().enumerate() {
            let mut bits = *word;
            while bits != 0 {
                let b = bits.trailing_zeros() as usize;
                bits &= bits.wrapping_sub(1);
                out.push(self.id_of(w.saturating_mul(64).saturating_add(b)));
            }
        }
        Ok(out)
    }

    /// The largest ring window (0 without ring layers): each sequence's next
    /// step needs its held positions above `next_pos - window` in the ring table.
    pub fn ring_window(&self) -> usize {
        self.ring_window
    }

    /// `seq`'s held positions below `upto` (including those the ring table
    /// dropped) as sorted, disjoint, non-adjacent `[start, end)` ranges.
    pub fn held_ranges(&self, seq: SeqId, upto: usize) -> Result<Vec<(usize, usize)>> {
        let slot = self.slot_of(seq, "held_ranges")?;
        let s = self
            .seq_ref(slot)
            .ok_or_else(|| unknown("held_ranges", seq))?;
        let mut out: Vec<(usize, usize)> = Vec::new();
        let mut push = |a: usize, b: usize| match out.last_mut() {
            Some(last) if last.1 == a => last.1 = b,
            _ => out.push((a, b)),
        };
        if self.full.is_none() {
            for &(a, b) in &s.evicted {
                if a < upto {
                    push(a, b.min(upto));
                }
            }
        }
        if let Some(list) = s.lists.get(self.logical_table()) {
            for e in list.iter().take_while(|e| e.pos < upto) {
                push(e.pos, e.pos.saturating_add(1));
            }
        }
        Ok(out)
    }

    /// A new sequence holding `held` (sorted disjoint ranges of `held_count`
    /// positions): a full-table cell per held position, a ring-table cell per
    /// position of `ring` (a sorted suffix of `held` covering what the next
    /// step needs), the held positions below `ring` recorded as dropped from
    /// the ring table. The snapshot loader has checked all of that; this
    /// re-checks room so a refusal changes nothing. Returns the id and the
    /// cells taken in each table, in position order. Closes the step.
    pub(crate) fn restore_seq(
        &mut self,
        held: &[(usize, usize)],
        held_count: usize,
        ring: &[usize],
    ) -> Result<(SeqId, Vec<u32>, Vec<u32>)> {
        let full_need = if self.full.is_some() { held_count } else { 0 };
        let ring_need = if self.ring.is_some() { ring.len() } else { 0 };
        for (t, need) in [(self.full, full_need), (self.ring, ring_need)] {
            let free = t.and_then(|t| self.tables.get(t)).map_or(0, |t| t.n_free);
            if need > free {
                return Err(CacheError::OutOfCapacity(format!(
                    "load_seq: {need} cells needed, {free} free"
                )));
            }
        }
        let slot = self.alloc_slot("load_seq")?;
        let mut full_cells = Vec::with_capacity(full_need);
        let mut ring_cells = Vec::with_capacity(ring_need);
        let ring_lo = ring.first().copied().unwrap_or(usize::MAX);
        let mut evicted: Vec<(usize, usize)> = Vec::new();
        let mut evicted_len = 0usize;
        let Some(s) = self.seqs.get_mut(slot) else {
            return Err(CacheError::OutOfCapacity("load_seq: no slot".to_string()));
        };
        for (ti, want) in [(self.full, true), (self.ring, false)] {
            let Some(ti) = ti else {
                continue;
            };
            let (Some(table), Some(list)) = (self.tables.get_mut(ti), s.lists.get_mut(ti)) else {
                continue;
            };
            let positions: Box<dyn Iterator<Item = usize>> = if want {
                Box::new(held.iter().flat_map(|&(a, b)| a..b))
            } else {
                Box::new(ring.iter().copied())
            };
            for p in positions {
                let cell = table.take_lowest_free(p).ok_or_else(|| {
                    CacheError::OutOfCapacity("load_seq: ran out of cells (internal error)".into())
                })?;
                table.add_owner(cell as usize, slot);
                list.push_back(Entry { pos: p, cell });
                if want {
                    full_cells.push(cell);
                } else {
                    ring_cells.push(cell);
                }
            }
        }
        if self.ring.is_some() {
            for &(a, b) in held {
                let b = b.min(ring_lo);
                if a < b {
                    evicted.push((a, b));
                    evicted_len = evicted_len.saturating_add(b.saturating_sub(a));
                }
            }
        }
        s.evicted = evicted;
        s.evicted_len = evicted_len;
        self.close_step();
        Ok((self.id_of(slot), full_cells, ring_cells))
    }

    fn alloc_slot(&mut self, verb: &str) -> Result<usize> {
        if self.n_live >= self.n_seq_max {
            return Err(CacheError::OutOfCapacity(format!(
                "{verb}: all {} sequence ids are live (n_seq_max)",
                self.n_seq_max
            )));
        }
        let slot = self.free_slots.pop().ok_or_else(|| {
            CacheError::OutOfCapacity(format!(
                "{verb}: no free sequence slot (n_seq_max {})",
                self.n_seq_max
            ))
        })? as usize;
        if let Some(s) = self.seqs.get_mut(slot) {
            s.live = true;
        }
        self.n_live = self.n_live.saturating_add(1);
        Ok(slot)
    }

    /// Retires `slot`: its id will be refused from now on.
    fn retire_slot(&mut self, slot: usize) {
        let n = self.n_seq_max as u64;
        if let Some(s) = self.seqs.get_mut(slot) {
            if !s.live {
                return;
            }
            s.live = false;
            let next = u64::from(s.gen).saturating_add(1);
            let next_id = next.checked_mul(n).and_then(|x| x.checked_add(slot as u64));
            s.gen = match (next_id, u32::try_from(next)) {
                (Some(id), Ok(g)) if id <= u64::from(u32::MAX) => g,
                _ => 0,
            };
            self.n_live = self.n_live.saturating_sub(1);
            if let Ok(v) = u32::try_from(slot) {
                self.free_slots.push(v);
            }
        }
    }

    fn close_step(&mut self) {
        if self.step_open {
            self.step_open = false;
            self.generation = self.generation.wrapping_add(1);
        }
    }

    /// A new empty sequence. Does not close an open step.
    pub fn seq_new(&mut self) -> Result<SeqId> {
        let slot = self.alloc_slot("seq_new")?;
        Ok(self.id_of(slot))
    }

    /// Refuses a change that would leave `slot` with held positions dropped from
    /// the ring table that its next step's window needs.
    fn check_hole(
        &self,
        verb: &str,
        seq: SeqId,
        max_after: Option<usize>,
        evicted_after: Option<usize>,
    ) -> Result<()> {
        if self.ring.is_none() {
            return Ok(());
        }
        if let Some(ev) = evicted_after {
            let next = max_after.map_or(0, |m| m.saturating_add(1));
            if ev.saturating_add(self.ring_window) > next {
                return Err(CacheError::InvalidArgument(format!(
                    "{verb}: sequence {seq} would continue from position {next}, whose ring window ({}) needs position {ev}, which the ring table already dropped",
                    self.ring_window
                )));
            }
        }
        Ok(())
    }

    /// A new sequence owning `src`'s cells with position `< upto` (all when
    /// `None`) by setting its bit: no K/V is copied. Closes the step.
    pub fn seq_clone(&mut self, src: SeqId, upto: Option<usize>) -> Result<SeqId> {
        let sslot = self.slot_of(src, "seq_clone")?;
        let up = upto.unwrap_or(usize::MAX);
        if self.n_live >= self.n_seq_max {
            return Err(CacheError::OutOfCapacity(format!(
                "seq_clone: all {} sequence ids are live (n_seq_max)",
                self.n_seq_max
            )));
        }
        let max_after = self.max_logical_below(sslot, up);
        let ev_after = self.max_evicted_below(sslot, up);
        self.check_hole("seq_clone", src, max_after, ev_after)?;
        let nslot = self.alloc_slot("seq_clone")?;
        let mut lists: [VecDeque<Entry>; 2] = Default::default();
        let mut evicted = Vec::new();
        let mut evicted_len = 0usize;
        if let Some(s) = self.seqs.get(sslot) {
            for ((src_list, dst), table) in s
                .lists
                .iter()
                .zip(lists.iter_mut())
                .zip(self.tables.iter_mut())
            {
                let k = src_list.partition_point(|e| e.pos < up);
                dst.extend(src_list.range(..k).copied());
                for e in dst.iter() {
                    table.add_owner(e.cell as usize, nslot);
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
        if let Some(d) = self.seqs.get_mut(nslot) {
            d.lists = lists;
            d.evicted = evicted;
            d.evicted_len = evicted_len;
        }
        self.close_step();
        Ok(self.id_of(nslot))
    }

    /// Drops `seq`'s positions in `[p0, p1)` (`p1 = None`: to the end); a cell
    /// whose owner set empties is freed. Refused when `p1 < p0`, and when the
    /// ring table dropped a position the remaining sequence's next step needs.
    /// Closes the step.
    pub fn seq_rm(&mut self, seq: SeqId, p0: usize, p1: Option<usize>) -> Result<()> {
        let slot = self.slot_of(seq, "seq_rm")?;
        if let Some(p1) = p1 {
            if p1 < p0 {
                return Err(CacheError::InvalidArgument(format!(
                    "seq_rm: p1 {p1} is below p0 {p0}"
                )));
            }
        }
        let p1 = p1.unwrap_or(usize::MAX);
        let max_after = max_outside(|b| self.max_logical_below(slot, b), p0, p1);
        let ev_after = max_outside(|b| self.max_evicted_below(slot, b), p0, p1);
        self.check_hole("seq_rm", seq, max_after, ev_after)?;
        if let Some(s) = self.seqs.get_mut(slot) {
            for (list, table) in s.lists.iter_mut().zip(self.tables.iter_mut()) {
                let a = list.partition_point(|e| e.pos < p0);
                let b = list.partition_point(|e| e.pos < p1).max(a);
                for e in list.drain(a..b) {
                    table.remove_owner(e.cell as usize, slot);
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
        let slot = self.slot_of(seq, "seq_free")?;
        if let Some(s) = self.seqs.get_mut(slot) {
            for (list, table) in s.lists.iter_mut().zip(self.tables.iter_mut()) {
                for e in list.drain(..) {
                    table.remove_owner(e.cell as usize, slot);
                }
            }
            s.evicted.clear();
            s.evicted_len = 0;
        }
        self.retire_slot(slot);
        self.close_step();
        Ok(())
    }

    /// Frees every cell and retires every id; closes the step.
    pub fn clear(&mut self) {
        for t in &mut self.tables {
            t.reset();
        }
        for slot in 0..self.seqs.len() {
            if let Some(s) = self.seqs.get_mut(slot) {
                for l in &mut s.lists {
                    l.clear();
                }
                s.evicted.clear();
                s.evicted_len = 0;
            }
            self.retire_slot(slot);
        }
        self.free_slots.clear();
        self.free_slots.extend(
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

    /// Ids and positions; fills the scratch (seen/last/count/distinct).
    fn check_tokens(&mut self, seq_ids: &[SeqId], positions: &[usize]) -> Result<()> {
        self.scratch.stamp = self.scratch.stamp.wrapping_add(1);
        if self.scratch.stamp == 0 {
            self.scratch.seen.fill(0);
            self.scratch.stamp = 1;
        }
        let stamp = self.scratch.stamp;
        self.scratch.distinct.clear();
        for (i, (&id, &p)) in seq_ids.iter().zip(positions).enumerate() {
            let slot = self.slot_of(id, "begin_step")?;
            if p == usize::MAX {
                return Err(CacheError::InvalidArgument(format!(
                    "begin_step: token {i} position {p} is out of range"
                )));
            }
            let seen = self.scratch.seen.get(slot).copied().unwrap_or(0) == stamp;
            if seen {
                let last = self.scratch.last.get(slot).copied().unwrap_or(0);
                if p <= last {
                    return Err(CacheError::InvalidArgument(format!(
                        "begin_step: token {i} of sequence {id} at position {p} does not follow its previous token at {last} (positions within a step must strictly increase)"
                    )));
                }
                if let Some(c) = self.scratch.count.get_mut(slot) {
                    *c = c.saturating_add(1);
                }
            } else {
                let next = self.next_pos_slot(slot);
                if p < next {
                    return Err(CacheError::StepProtocol(format!(
                        "begin_step: token {i} would rewrite position {p} of sequence {id}, which holds positions up to {}; a step only extends",
                        next.saturating_sub(1)
                    )));
                }
                if let Some(s) = self.scratch.seen.get_mut(slot) {
                    *s = stamp;
                }
                if let Some(c) = self.scratch.count.get_mut(slot) {
                    *c = 1;
                }
                self.scratch.distinct.push(slot);
            }
            if let Some(l) = self.scratch.last.get_mut(slot) {
                *l = p;
            }
        }
        Ok(())
    }

    /// Room in every table, counting exactly the ring cells the step's own drops free.
    fn check_room(&mut self, n: usize) -> Result<()> {
        if let Some(f) = self.full {
            let free = self.tables.get(f).map_or(0, |t| t.n_free);
            if free < n {
                return Err(CacheError::OutOfCapacity(format!(
                    "begin_step: {n} tokens need {n} cells of the full table, {free} free"
                )));
            }
        }
        let Some(r) = self.ring else {
            return Ok(());
        };
        let keep = self.ring_keep;
        // How many ring entries each sequence of the step drops.
        for &slot in &self.scratch.distinct {
            let list = self.seqs.get(slot).and_then(|s| s.lists.get(r));
            let len = list.map_or(0, |l| l.len());
            let cnt = self.scratch.count.get(slot).copied().unwrap_or(0);
            let d = len.saturating_add(cnt).saturating_sub(keep).min(len);
            if let Some(x) = self.scratch.drop_n.get_mut(slot) {
                *x = d;
            }
            let kf = list.and_then(|l| l.get(d)).map_or(usize::MAX, |e| e.pos);
            if let Some(x) = self.scratch.keep_from.get_mut(slot) {
                *x = kf;
            }
        }
        let Some(table) = self.tables.get(r) else {
            return Ok(());
        };
        if table.n_free >= n {
            return Ok(());
        }
        let stamp = self.scratch.stamp;
        let mut reclaim = 0usize;
        for &slot in &self.scratch.distinct {
            let d = self.scratch.drop_n.get(slot).copied().unwrap_or(0);
            let Some(list) = self.seqs.get(slot).and_then(|s| s.lists.get(r)) else {
                continue;
            };
            for e in list.range(..d) {
                let cell = e.cell as usize;
                if table.n_owners.get(cell).copied().unwrap_or(0) == 1 {
                    reclaim = reclaim.saturating_add(1);
                    continue;
                }
                // Shared: freed iff every owner is in the step and drops it;
                // counted once, from its lowest owner.
                let mut all_drop = true;
                let mut lowest = usize::MAX;
                'words: for (w, word) in table.owner_words(cell).iter().enumerate() {
                    let mut bits = *word;
                    while bits != 0 {
                        let o = w
                            .saturating_mul(64)
                            .saturating_add(bits.trailing_zeros() as usize);
                        bits &= bits.wrapping_sub(1);
                        lowest = lowest.min(o);
                        let in_step = self.scratch.seen.get(o).copied() == Some(stamp);
                        let drops =
                            in_step && self.scratch.keep_from.get(o).is_some_and(|kf| e.pos < *kf);
                        if !drops {
                            all_drop = false;
                            break 'words;
                        }
                    }
                }
                if all_drop && lowest == slot {
                    reclaim = reclaim.saturating_add(1);
                }
            }
        }
        if table.n_free.saturating_add(reclaim) < n {
            return Err(CacheError::OutOfCapacity(format!(
                "begin_step: {n} tokens need {n} cells of the ring table, {} free and {reclaim} freed by the step's ring drops",
                table.n_free
            )));
        }
        Ok(())
    }

    /// Mutation phase of `begin_step`; admission has succeeded.
    fn place(&mut self, seq_ids: &[SeqId], positions: &[usize]) -> Result<()> {
        self.close_step();
        if let Some(r) = self.ring {
            let distinct = std::mem::take(&mut self.scratch.distinct);
            for &slot in &distinct {
                let d = self.scratch.drop_n.get(slot).copied().unwrap_or(0);
                let (Some(s), Some(table)) = (self.seqs.get_mut(slot), self.tables.get_mut(r))
                else {
                    continue;
                };
                let Some(list) = s.lists.get_mut(r) else {
                    continue;
                };
                for e in list.drain(..d.min(list.len())) {
                    table.remove_owner(e.cell as usize, slot);
                    match s.evicted.last_mut() {
                        Some(last) if last.1 == e.pos => last.1 = last.1.saturating_add(1),
                        _ => s.evicted.push((e.pos, e.pos.saturating_add(1))),
                    }
                    s.evicted_len = s.evicted_len.saturating_add(1);
                }
            }
            self.scratch.distinct = distinct;
        }
        self.step_ids.clear();
        self.step_ids.extend_from_slice(seq_ids);
        self.step_pos.clear();
        self.step_pos.extend_from_slice(positions);
        self.step_slots.clear();
        for t in &mut self.tables {
            t.step_cells.clear();
        }
        for (&id, &p) in seq_ids.iter().zip(positions) {
            // Ids were validated by `check_tokens`; n_seq_max >= 1.
            let slot = (id as usize).checked_rem(self.n_seq_max).unwrap_or(0);
            self.step_slots.push(slot as u32);
            let Some(s) = self.seqs.get_mut(slot) else {
                continue;
            };
            for (ti, (table, list)) in self.tables.iter_mut().zip(s.lists.iter_mut()).enumerate() {
                let Some(cell) = table.take_lowest_free(p) else {
                    // Admission counted the room exactly; this is unreachable.
                    return Err(CacheError::OutOfCapacity(format!(
                        "begin_step: table {ti} ran out of cells after admission (internal error)"
                    )));
                };
                table.add_owner(cell as usize, slot);
                table.step_cells.push(cell);
                list.push_back(Entry { pos: p, cell });
            }
        }
        for t in &mut self.tables {
            t.shrink_used_end();
            t.read_len = t.used_end();
        }
        self.masks.built.fill(false);
        self.step_open = true;
        self.generation = self.generation.wrapping_add(1);
        Ok(())
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
        let policy = self
            .policies
            .get(pi)
            .copied()
            .ok_or_else(|| self.layer_error(layer))?;
        Ok(CellStepPlan {
            cells: &table.step_cells,
            positions: &self.step_pos,
            seq_ids: &self.step_ids,
            slots: &self.step_slots,
            seqs: &self.seqs,
            read_len: table.read_len,
            policy,
            table: ti,
        })
    }

    /// The open step's dense mask for `layer`: `[T, read_len]` row-major, 1 where
    /// token i sees cell j. Built on the first call for each distinct policy of
    /// the step, then served from memory (buffers are reused across steps).
    pub fn dense_mask(&mut self, layer: usize) -> Result<&[u8]> {
        let (t, read_len, window, table) = {
            let pl = self.plan(layer)?;
            (pl.n_tokens(), pl.read_len(), pl.window(), pl.table())
        };
        let pi = self.policy_index(layer)?;
        if !self.masks.built.get(pi).copied().unwrap_or(false) {
            let size = t.checked_mul(read_len).ok_or_else(|| {
                CacheError::OutOfCapacity(format!("dense_mask: {t} x {read_len} overflows"))
            })?;
            let Some(buf) = self.masks.bufs.get_mut(pi) else {
                return Err(self.layer_error(layer));
            };
            buf.clear();
            buf.resize(size, 0);
            for (i, (&slot, &p)) in self.step_slots.iter().zip(&self.step_pos).enumerate() {
                let Some(list) = self
                    .seqs
                    .get(slot as usize)
                    .and_then(|s| s.lists.get(table))
                else {
                    continue;
                };
                // i < t and cell < read_len, so row + cell < t * read_len (checked above).
                let row = i.saturating_mul(read_len);
                for e in plan::visible_range(list, p, window) {
                    if let Some(b) = buf.get_mut(row.saturating_add(e.cell as usize)) {
                        *b = 1;
                    }
                }
            }
            if let Some(b) = self.masks.built.get_mut(pi) {
                *b = true;
            }
        }
        self.masks
            .bufs
            .get(pi)
            .map(|b| b.as_slice())
            .ok_or_else(|| self.layer_error(layer))
    }

    /// Checks every internal invariant (diagnostics and tests; O(n_cells x
    /// words + held entries)). `Err` names the first violation.
    pub fn audit(&self) -> std::result::Result<(), String> {
        for (ti, t) in self.tables.iter().enumerate() {
            t.audit().map_err(|e| format!("table {ti}: {e}"))?;
            let mut pairs = 0usize;
            for (slot, s) in self.seqs.iter().enumerate() {
                let Some(list) = s.lists.get(ti) else {
                    continue;
                };
                if !s.live && !list.is_empty() {
                    return Err(format!("table {ti}: dead slot {slot} holds cells"));
                }
                let mut prev: Option<usize> = None;
                for e in list {
                    if prev.is_some_and(|p| p >= e.pos) {
                        return Err(format!(
                            "table {ti}: slot {slot} list not strictly increasing at {}",
                            e.pos
                        ));
                    }
                    prev = Some(e.pos);
                    let c = e.cell as usize;
                    if t.pos.get(c).copied() != Some(e.pos) {
                        return Err(format!(
                            "table {ti}: slot {slot} lists cell {c} at {} but the cell holds {:?}",
                            e.pos,
                            t.pos.get(c)
                        ));
                    }
                    if !t.owns(c, slot) {
                        return Err(format!(
                            "table {ti}: slot {slot} lists cell {c} without owning it"
                        ));
                    }
                }
                pairs = pairs.saturating_add(list.len());
                if Some(ti) == self.ring && list.len() > self.ring_keep {
                    return Err(format!(
                        "ring table: slot {slot} holds {} > {} cells",
                        list.len(),
                        self.ring_keep
                    ));
                }
            }
            let owned: usize = t.n_owners.iter().map(|n| *n as usize).sum();
            if owned != pairs {
                return Err(format!(
                    "table {ti}: {owned} owner bits but {pairs} listed entries"
                ));
            }
        }
        for (slot, s) in self.seqs.iter().enumerate() {
            let mut end = 0usize;
            let mut len = 0usize;
            for (i, &(a, b)) in s.evicted.iter().enumerate() {
                if a >= b || (i > 0 && a <= end) {
                    return Err(format!("slot {slot}: bad evicted ranges {:?}", s.evicted));
                }
                end = b;
                len = len.saturating_add(b.saturating_sub(a));
            }
            if len != s.evicted_len {
                return Err(format!(
                    "slot {slot}: evicted_len {} but ranges hold {len}",
                    s.evicted_len
                ));
            }
            if let Some(r) = self.ring {
                if let Some(front) = s.lists.get(r).and_then(|l| l.front()) {
                    if !s.evicted.is_empty() && end > front.pos {
                        return Err(format!(
                            "slot {slot}: evicted up to {end} but ring holds {}",
                            front.pos
                        ));
                    }
                }
                if let Some(f) = self.full {
                    let full: Vec<usize> = s
                        .lists
                        .get(f)
                        .map(|l| l.iter().map(|e| e.pos).collect())
                        .unwrap_or_default();
                    let mut logical: Vec<usize> =
                        s.evicted.iter().flat_map(|&(a, b)| a..b).collect();
                    logical.extend(
                        s.lists
                            .get(r)
                            .map(|l| l.iter().map(|e| e.pos).collect::<Vec<_>>())
                            .unwrap_or_default(),
                    );
                    if full != logical {
                        return Err(format!(
                            "slot {slot}: full table positions differ from evicted + ring"
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}
