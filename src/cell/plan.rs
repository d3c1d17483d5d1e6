//! The per-layer view of an open cell step.
//!
//! Arithmetic here is on cell indices and run lengths, all bounded by
//! n_cells <= MAX_CELLS (2^31, checked by `CellCache::new`): a run never
//! covers more than n_cells cells and `out.len() >= base`, so no sum overflows.
#![allow(clippy::arithmetic_side_effects)]

use std::collections::VecDeque;

use super::{Entry, Seq, SeqId};
use crate::config::LayerPolicy;
use crate::error::{CacheError, Result};
use crate::runs::Run;

/// One layer's view of the open step: where each token writes, the read
/// extent, and (on demand) each token's visible cells.
///
/// Borrowing the cache, a plan cannot outlive the step: every verb that closes
/// the step takes `&mut CellCache`.
#[derive(Debug, Clone, Copy)]
pub struct CellStepPlan<'a> {
    pub(super) cells: &'a [u32],
    pub(super) positions: &'a [usize],
    pub(super) seq_ids: &'a [SeqId],
    pub(super) seq_indices: &'a [u32],
    pub(super) seqs: &'a [Seq],
    pub(super) read_len: usize,
    pub(super) policy: LayerPolicy,
    pub(super) table: usize,
}

/// The part of `list` (sorted by position) a query at `pos` sees under `window`.
pub(super) fn visible_range(
    list: &VecDeque<Entry>,
    pos: usize,
    window: Option<usize>,
) -> std::collections::vec_deque::Iter<'_, Entry> {
    // pos(j) > pos - window  <=>  pos(j) >= pos + 1 - window
    let lo = crate::window::first_visible(pos, window);
    let a = list.partition_point(|e| e.pos < lo);
    let b = list.partition_point(|e| e.pos <= pos);
    list.range(a..b.max(a))
}

impl<'a> CellStepPlan<'a> {
    /// Tokens in the step.
    pub fn n_tokens(&self) -> usize {
        self.positions.len()
    }

    /// The cell each token writes, in this layer's table.
    pub fn cells(&self) -> &'a [u32] {
        self.cells
    }

    /// Each token's position.
    pub fn positions(&self) -> &'a [usize] {
        self.positions
    }

    /// Each token's sequence.
    pub fn seq_ids(&self) -> &'a [SeqId] {
        self.seq_ids
    }

    /// Cells `[0, read_len)` bound what any token of the step reads in this
    /// layer's table (one past the highest occupied cell).
    pub fn read_len(&self) -> usize {
        self.read_len
    }

    pub fn policy(&self) -> LayerPolicy {
        self.policy
    }

    /// The window of a ring layer, `None` for a flat one.
    pub fn window(&self) -> Option<usize> {
        self.policy.window()
    }

    /// The cell table this layer's K/V pools are indexed by.
    pub fn table(&self) -> usize {
        self.table
    }

    /// Token `i`'s visible cells as sorted, disjoint, maximal runs.
    pub fn visible(&self, i: usize) -> Result<Vec<Run>> {
        let mut out = Vec::new();
        self.visible_into(i, &mut out)?;
        Ok(out)
    }

    /// Appends token `i`'s visible cells to `out` as sorted, disjoint, maximal
    /// runs. Allocates nothing when `out` has room for the runs. Costs
    /// O(k + r log r) for k visible cells forming r runs in position order,
    /// never O(n_cells).
    pub fn visible_into(&self, i: usize, out: &mut Vec<Run>) -> Result<()> {
        let base = out.len();
        self.visible_in_order_into(i, out)?;
        let n = match out.get_mut(base..) {
            Some(tail) => {
                tail.sort_unstable_by_key(|r| r.start);
                merge_adjacent(tail)
            }
            None => 0,
        };
        out.truncate(base + n);
        Ok(())
    }

    /// Appends token `i`'s visible cells to `out` as disjoint runs in
    /// position order (oldest first), each run cells that follow each other
    /// in both positions and the pool. What attention reads: its summation
    /// order then follows the keys' positions, not where their cells lie.
    /// O(k) for k visible cells; allocates nothing when `out` has room.
    pub fn visible_in_order_into(&self, i: usize, out: &mut Vec<Run>) -> Result<()> {
        let (ix, pos) = match (self.seq_indices.get(i), self.positions.get(i)) {
            (Some(s), Some(p)) => (*s as usize, *p),
            _ => {
                return Err(CacheError::InvalidArgument(format!(
                    "visible: token {i} out of range: the step has {} tokens",
                    self.positions.len()
                )))
            }
        };
        let list = self
            .seqs
            .get(ix)
            .and_then(|s| s.lists.get(self.table))
            .ok_or_else(|| {
                CacheError::InvalidArgument(format!("visible: token {i} has no sequence state"))
            })?;
        let base = out.len();
        for e in visible_range(list, pos, self.policy.window()) {
            let cell = e.cell as usize;
            if out.len() > base {
                if let Some(last) = out.last_mut() {
                    if last.end() == cell {
                        last.len += 1;
                        continue;
                    }
                }
            }
            out.push(Run::new(cell, 1));
        }
        Ok(())
    }
}

/// Merges runs (sorted by start, disjoint) that touch; returns the new length.
fn merge_adjacent(runs: &mut [Run]) -> usize {
    let mut w = 0usize;
    for r in 1..runs.len() {
        let Some(cur) = runs.get(r).copied() else {
            break;
        };
        let Some(prev) = runs.get_mut(w) else {
            break;
        };
        if prev.end() == cur.start {
            prev.len += cur.len;
        } else {
            w += 1;
            if let Some(run) = runs.get_mut(w) {
                *run = cur;
            }
        }
    }
    if runs.is_empty() {
        0
    } else {
        w + 1
    }
}
