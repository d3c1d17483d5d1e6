//! Admission and placement of a step (`begin_step`'s two phases): checking
//! ids, positions and room without changing anything, then taking the lowest
//! free cell of each table for every token.

use std::fmt;

use super::{ids, CellCache, Entry, SeqId};
use crate::error::{CacheError, Result};

/// Per-call scratch of `begin_step`, sized by `n_seq_max`. Not state: it is
/// neither compared nor printed.
#[derive(Clone, Default)]
pub(super) struct Scratch {
    pub(super) stamp: u64,
    /// `seen[ix] == stamp` when the index has a token in the step being checked.
    pub(super) seen: Vec<u64>,
    pub(super) last: Vec<usize>,
    pub(super) count: Vec<usize>,
    /// Ring entries the index drops before placement.
    pub(super) drop_n: Vec<usize>,
    /// Position of the index's first kept ring entry (`usize::MAX`: none).
    pub(super) keep_from: Vec<usize>,
    /// Distinct indices of the step, in first-token order.
    pub(super) distinct: Vec<usize>,
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

impl CellCache {
    /// Ids and positions; fills the scratch (seen/last/count/distinct).
    pub(super) fn check_tokens(&mut self, seq_ids: &[SeqId], positions: &[usize]) -> Result<()> {
        self.scratch.stamp = self.scratch.stamp.wrapping_add(1);
        if self.scratch.stamp == 0 {
            self.scratch.seen.fill(0);
            self.scratch.stamp = 1;
        }
        let stamp = self.scratch.stamp;
        self.scratch.distinct.clear();
        for (i, (&id, &p)) in seq_ids.iter().zip(positions).enumerate() {
            let ix = self.index_of(id, "begin_step")?;
            if p == usize::MAX {
                return Err(CacheError::InvalidArgument(format!(
                    "begin_step: token {i} position {p} is out of range"
                )));
            }
            let seen = self.scratch.seen.get(ix).copied().unwrap_or(0) == stamp;
            if seen {
                let last = self.scratch.last.get(ix).copied().unwrap_or(0);
                if p <= last {
                    return Err(CacheError::InvalidArgument(format!(
                        "begin_step: token {i} of sequence {id} at position {p} does not follow its previous token at {last} (positions within a step must strictly increase)"
                    )));
                }
                if let Some(c) = self.scratch.count.get_mut(ix) {
                    *c = c.saturating_add(1);
                }
            } else {
                let next = self.next_pos_slot(ix);
                if p < next {
                    return Err(CacheError::StepProtocol(format!(
                        "begin_step: token {i} would rewrite position {p} of sequence {id}, which holds positions up to {}; a step only extends",
                        next.saturating_sub(1)
                    )));
                }
                if let Some(s) = self.scratch.seen.get_mut(ix) {
                    *s = stamp;
                }
                if let Some(c) = self.scratch.count.get_mut(ix) {
                    *c = 1;
                }
                self.scratch.distinct.push(ix);
            }
            if let Some(l) = self.scratch.last.get_mut(ix) {
                *l = p;
            }
        }
        Ok(())
    }

    /// Room in every table, counting exactly the ring cells the step's own drops free.
    pub(super) fn check_room(&mut self, n: usize) -> Result<()> {
        if let Some(f) = self.full {
            let free = self.tables.get(f).map_or(0, |t| t.n_free);
            if free < n {
                return Err(CacheError::OutOfCapacity(format!(
                    "begin_step: {n} tokens need {n} cells of the full table, {free} free"
                )));
            }
        }
        self.check_ring_room(n)
    }

    /// Mutation phase of `begin_step`; admission has succeeded.
    pub(super) fn place(&mut self, seq_ids: &[SeqId], positions: &[usize]) -> Result<()> {
        self.close_step();
        self.evict_ring_drops();
        self.step_ids.clear();
        self.step_ids.extend_from_slice(seq_ids);
        self.step_pos.clear();
        self.step_pos.extend_from_slice(positions);
        self.step_indices.clear();
        for t in &mut self.tables {
            t.step_cells.clear();
        }
        for (&id, &p) in seq_ids.iter().zip(positions) {
            // Ids were validated by `check_tokens`.
            let ix = ids::index_bits(id);
            self.step_indices.push(ix as u32);
            let Some(s) = self.seqs.get_mut(ix) else {
                continue;
            };
            for (ti, (table, list)) in self.tables.iter_mut().zip(s.lists.iter_mut()).enumerate() {
                let Some(cell) = table.take_lowest_free(p) else {
                    // Admission counted the room exactly; this is unreachable.
                    return Err(CacheError::OutOfCapacity(format!(
                        "begin_step: table {ti} ran out of cells after admission (internal error)"
                    )));
                };
                table.add_owner(cell as usize, ix);
                table.step_cells.push(cell);
                list.push_back(Entry { pos: p, cell });
            }
        }
        for t in &mut self.tables {
            t.shrink_used_end();
            t.read_len = t.used_end();
        }
        self.step_open = true;
        self.generation = self.generation.wrapping_add(1);
        Ok(())
    }
}
