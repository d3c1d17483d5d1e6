//! Ring retention of the cell cache: what the ring table drops per sequence,
//! the held ranges it dropped, and the refusals that keep a sequence's next
//! step from reading a dropped position (see the module docs of `cell`).
//!
//! # Two cell tables
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
//! `free_cells`/`can_extend` are conservative for the ring table: a step may be
//! admitted with fewer free ring cells than tokens when its own sequences'
//! drops free enough (admission counts exactly which cells would free).

use std::collections::VecDeque;

use super::{CellCache, Entry, SeqId};
use crate::error::{CacheError, Result};

/// Removes `[p0, p1)` from sorted disjoint ranges; returns how many positions went.
pub(super) fn cut_ranges(ranges: &mut Vec<(usize, usize)>, p0: usize, p1: usize) -> usize {
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
pub(super) fn ranges_max_below(ranges: &[(usize, usize)], bound: usize) -> Option<usize> {
    let k = ranges.partition_point(|r| r.0 < bound);
    let (_, e) = *ranges.get(k.checked_sub(1)?)?;
    e.min(bound).checked_sub(1)
}

/// Largest position below `bound` in a position-sorted list.
pub(super) fn list_max_below(list: &VecDeque<Entry>, bound: usize) -> Option<usize> {
    let k = list.partition_point(|e| e.pos < bound);
    list.get(k.checked_sub(1)?).map(|e| e.pos)
}

/// The largest of `f`'s values not in `[p0, p1)`, where `f(b)` is the largest
/// held position below `b`.
pub(super) fn max_outside(
    f: impl Fn(usize) -> Option<usize>,
    p0: usize,
    p1: usize,
) -> Option<usize> {
    let m = f(usize::MAX)?;
    if m >= p0 && m < p1 {
        f(p0)
    } else {
        Some(m)
    }
}

impl CellCache {
    pub(super) fn max_evicted_below(&self, ix: usize, bound: usize) -> Option<usize> {
        ranges_max_below(&self.seq_ref(ix)?.evicted, bound)
    }

    /// Refuses a change that would leave `ix` with held positions dropped from
    /// the ring table that its next step's window needs.
    pub(super) fn check_hole(
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

    /// Room in the ring table for `n` tokens, counting exactly the ring cells
    /// the step's own drops free; records each sequence's drops in the scratch.
    pub(super) fn check_ring_room(&mut self, n: usize) -> Result<()> {
        let Some(r) = self.ring else {
            return Ok(());
        };
        let keep = self.ring_keep;
        // How many ring entries each sequence of the step drops.
        for &ix in &self.scratch.distinct {
            let list = self.seqs.get(ix).and_then(|s| s.lists.get(r));
            let len = list.map_or(0, |l| l.len());
            let cnt = self.scratch.count.get(ix).copied().unwrap_or(0);
            let d = len.saturating_add(cnt).saturating_sub(keep).min(len);
            if let Some(x) = self.scratch.drop_n.get_mut(ix) {
                *x = d;
            }
            let kf = list.and_then(|l| l.get(d)).map_or(usize::MAX, |e| e.pos);
            if let Some(x) = self.scratch.keep_from.get_mut(ix) {
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
        for &ix in &self.scratch.distinct {
            let d = self.scratch.drop_n.get(ix).copied().unwrap_or(0);
            let Some(list) = self.seqs.get(ix).and_then(|s| s.lists.get(r)) else {
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
                if all_drop && lowest == ix {
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

    /// Drops the ring entries `check_ring_room` counted, recording them as
    /// evicted (still held) ranges.
    pub(super) fn evict_ring_drops(&mut self) {
        if let Some(r) = self.ring {
            let distinct = std::mem::take(&mut self.scratch.distinct);
            for &ix in &distinct {
                let d = self.scratch.drop_n.get(ix).copied().unwrap_or(0);
                let (Some(s), Some(table)) = (self.seqs.get_mut(ix), self.tables.get_mut(r)) else {
                    continue;
                };
                let Some(list) = s.lists.get_mut(r) else {
                    continue;
                };
                for e in list.drain(..d.min(list.len())) {
                    table.remove_owner(e.cell as usize, ix);
                    match s.evicted.last_mut() {
                        Some(last) if last.1 == e.pos => last.1 = last.1.saturating_add(1),
                        _ => s.evicted.push((e.pos, e.pos.saturating_add(1))),
                    }
                    s.evicted_len = s.evicted_len.saturating_add(1);
                }
            }
            self.scratch.distinct = distinct;
        }
    }
}
