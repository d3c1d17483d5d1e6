//! Read-only questions about sequences and cells: which ids are live, what a
//! sequence holds, and who owns a cell. None of them changes the cache.

use super::ids::unknown;
use super::table::FREE;
use super::{CellCache, SeqId};
use crate::error::{CacheError, Result};

impl CellCache {
    /// Live sequence ids, in index order.
    pub fn live_seqs(&self) -> Vec<SeqId> {
        (0..self.seqs.len())
            .filter(|s| self.seqs.get(*s).is_some_and(|q| q.live))
            .map(|s| self.id_of(s))
            .collect()
    }

    /// Whether `seq` is live.
    pub fn is_live(&self, seq: SeqId) -> bool {
        self.index_of(seq, "is_live").is_ok()
    }

    /// One past the highest position `seq` holds, 0 if none.
    pub fn next_pos(&self, seq: SeqId) -> Result<usize> {
        let ix = self.index_of(seq, "next_pos")?;
        Ok(self.next_pos_slot(ix))
    }

    /// Positions `seq` holds (including those the ring table dropped).
    pub fn seq_len(&self, seq: SeqId) -> Result<usize> {
        let ix = self.index_of(seq, "seq_len")?;
        let s = self.seq_ref(ix).ok_or_else(|| unknown("seq_len", seq))?;
        let list_len = s.lists.get(self.logical_table()).map_or(0, |l| l.len());
        Ok(if self.full.is_some() {
            list_len
        } else {
            list_len.saturating_add(s.evicted_len)
        })
    }

    /// `seq`'s (position, cell) pairs in `table`, sorted by position.
    pub fn seq_cells(&self, seq: SeqId, table: usize) -> Result<Vec<(usize, u32)>> {
        let ix = self.index_of(seq, "seq_cells")?;
        self.table_ref(table)?;
        Ok(self
            .seq_ref(ix)
            .and_then(|s| s.lists.get(table))
            .map(|l| l.iter().map(|e| (e.pos, e.cell)).collect())
            .unwrap_or_default())
    }

    /// The cells of `seq`'s positions in `[start, end)` in `table`, in position
    /// order: a binary search and the range, not a walk of the whole sequence
    /// (a chunk snapshot of a long sequence reads only its chunk).
    pub fn seq_cells_in(
        &self,
        seq: SeqId,
        table: usize,
        start: usize,
        end: usize,
    ) -> Result<Vec<(usize, u32)>> {
        let ix = self.index_of(seq, "seq_cells_in")?;
        self.table_ref(table)?;
        let Some(list) = self.seq_ref(ix).and_then(|s| s.lists.get(table)) else {
            return Ok(Vec::new());
        };
        let first = list.partition_point(|e| e.pos < start);
        Ok(list
            .range(first..)
            .take_while(|e| e.pos < end)
            .map(|e| (e.pos, e.cell))
            .collect())
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

    /// The ids owning cell `cell` of `table`, in index order.
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

    /// Runs `(first cell, count)` of the free cells of `table`, in order, and
    /// one past its highest occupied cell. O(n_cells): for `trim`, not a step.
    pub fn free_runs(&self, table: usize) -> Result<(Vec<(usize, usize)>, usize)> {
        let t = self.table_ref(table)?;
        let mut runs: Vec<(usize, usize)> = Vec::new();
        let mut used_end = 0usize;
        for (cell, &p) in t.pos.iter().enumerate() {
            if p != FREE {
                used_end = cell.saturating_add(1);
                continue;
            }
            match runs.last_mut() {
                Some((start, n)) if start.saturating_add(*n) == cell => *n = n.saturating_add(1),
                _ => runs.push((cell, 1)),
            }
        }
        Ok((runs, used_end))
    }
}
