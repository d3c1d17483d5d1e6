//! Sequence ids, unique in the process: `ticket << 16 | index`, where the
//! index is the sequence's place in its cache's per-sequence tables (never a
//! pool row; `n_seq_max <= 2^16`) and the ticket comes from one process-wide
//! counter that every cell cache draws from. Every id handed out takes a new
//! ticket, so no two ids are ever equal, whichever caches handed them out: an
//! id from one cache is refused (`UnknownSequence`) by every other, and a
//! freed id by its own. (A `Clone` of a cache is the exception by
//! construction: it copies its live sequences with their ids.)
//!
//! Ids are at most `i64::MAX`, which Python, numpy's int64 and C's `int64_t`
//! all hold: 2^47 tickets per process (at a million new sequences a second,
//! four and a half years). Once they are spent, `seq_new`, `seq_clone` and
//! `load_seq` are refused with `OutOfCapacity`; an id is never handed out twice.

use std::sync::atomic::{AtomicU64, Ordering};

use super::CellCache;
use crate::error::{CacheError, Result};

/// A sequence id, handed out by `CellCache::seq_new` / `CellCache::seq_clone`.
pub type SeqId = u64;

/// Largest id handed out.
pub const MAX_SEQ_ID: SeqId = i64::MAX as SeqId;

/// Ids per ticket: an id's low 16 bits hold the sequence's index
/// (`MAX_SEQS` is `2^16`).
const INDEX_SPAN: u64 = 0x1_0000;
const INDEX_MASK: SeqId = 0xffff;
/// Tickets a process hands out, `2^47`: every one composes to an id
/// `<= MAX_SEQ_ID`.
const TICKETS: u64 = 0x8000_0000_0000;

/// The next ticket of the process; shared by every cell cache.
static NEXT_TICKET: AtomicU64 = AtomicU64::new(0);

/// Takes a ticket (`None` once the process has spent them all).
fn take_ticket() -> Option<u64> {
    NEXT_TICKET
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
            (t < TICKETS).then_some(t.saturating_add(1))
        })
        .ok()
}

/// The id of `ticket` at index `ix` (`None` past [`MAX_SEQ_ID`]).
pub(crate) fn compose(ticket: u64, ix: usize) -> Option<SeqId> {
    let ix = SeqId::try_from(ix).ok().filter(|i| *i <= INDEX_MASK)?;
    ticket
        .checked_mul(INDEX_SPAN)?
        .checked_add(ix)
        .filter(|id| *id <= MAX_SEQ_ID)
}

/// The index an id names (whether it is live there is the cache's question).
pub(crate) fn index_bits(id: SeqId) -> usize {
    // Masked to 16 bits: fits every usize.
    (id & INDEX_MASK) as usize
}

pub(super) fn unknown(verb: &str, id: SeqId) -> CacheError {
    CacheError::UnknownSequence(format!(
        "{verb}: sequence id {id} is not live in this cache (handed out by another cache, or already freed)"
    ))
}

impl CellCache {
    pub(super) fn id_of(&self, ix: usize) -> SeqId {
        self.seqs.get(ix).map_or(SeqId::MAX, |s| s.id)
    }

    pub(super) fn index_of(&self, id: SeqId, verb: &str) -> Result<usize> {
        let ix = index_bits(id);
        match self.seqs.get(ix) {
            Some(s) if s.live && s.id == id => Ok(ix),
            _ => Err(unknown(verb, id)),
        }
    }

    pub(super) fn alloc_index(&mut self, verb: &str) -> Result<usize> {
        if self.n_live >= self.n_seq_max {
            return Err(CacheError::OutOfCapacity(format!(
                "{verb}: all {} sequence ids are live (n_seq_max)",
                self.n_seq_max
            )));
        }
        let ix = self.free_indices.last().copied().ok_or_else(|| {
            CacheError::OutOfCapacity(format!(
                "{verb}: no free sequence index (n_seq_max {})",
                self.n_seq_max
            ))
        })? as usize;
        let id = take_ticket().and_then(|t| compose(t, ix)).ok_or_else(|| {
            CacheError::OutOfCapacity(format!(
                "{verb}: this process has handed out all {TICKETS} sequence ids"
            ))
        })?;
        self.free_indices.pop();
        if let Some(s) = self.seqs.get_mut(ix) {
            s.live = true;
            s.id = id;
        }
        self.n_live = self.n_live.saturating_add(1);
        Ok(ix)
    }

    /// Retires `ix`: its id will be refused from now on (the index takes a
    /// new id when it is handed out again).
    pub(super) fn retire_index(&mut self, ix: usize) {
        if let Some(s) = self.seqs.get_mut(ix) {
            if !s.live {
                return;
            }
            s.live = false;
            self.n_live = self.n_live.saturating_sub(1);
            if let Ok(v) = u32::try_from(ix) {
                self.free_indices.push(v);
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::arithmetic_side_effects)]
mod tests {
    use super::*;

    #[test]
    fn compose_keeps_the_index_and_the_bound() {
        for (t, ix) in [(0, 0), (7, 3), (1 << 40, 65_535)] {
            let id = compose(t, ix).unwrap();
            assert_eq!(index_bits(id), ix);
            assert_eq!(id / INDEX_SPAN, t);
        }
        assert_eq!(INDEX_MASK + 1, INDEX_SPAN);
        assert_eq!(TICKETS * INDEX_SPAN - 1, MAX_SEQ_ID);
        assert_eq!(INDEX_SPAN as usize, crate::cell::MAX_SEQS);
        assert_eq!(compose(TICKETS - 1, 65_535), Some(MAX_SEQ_ID));
        assert_eq!(compose(TICKETS, 0), None);
        assert_eq!(compose(0, 65_536), None);
    }
}
