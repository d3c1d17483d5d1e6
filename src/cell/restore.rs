//! What the snapshot loader needs from the cell cache: a sequence's held
//! positions as ranges, and a sequence rebuilt from them.

use super::ids::unknown;
use super::{CellCache, Entry, SeqId};
use crate::error::{CacheError, Result};

impl CellCache {
    /// The largest ring window (0 without ring layers): each sequence's next
    /// step needs its held positions above `next_pos - window` in the ring table.
    pub fn ring_window(&self) -> usize {
        self.ring_window
    }

    /// `seq`'s held positions below `upto` (including those the ring table
    /// dropped) as sorted, disjoint, non-adjacent `[start, end)` ranges.
    pub fn held_ranges(&self, seq: SeqId, upto: usize) -> Result<Vec<(usize, usize)>> {
        let slot = self.index_of(seq, "held_ranges")?;
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
        let slot = self.alloc_index("load_seq")?;
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
}
