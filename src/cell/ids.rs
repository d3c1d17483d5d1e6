//! Sequence ids: `generation * n_seq_max + index`, where the index is the
//! sequence's place in the per-sequence tables (never a pool row). Ids are at
//! most `i64::MAX`.
//!
//! Freeing an index bumps its generation, so a stale id is refused instead of
//! addressing the sequence that reuses the index. Ids never repeat in a cache's
//! lifetime: an index whose next id would pass `i64::MAX` is retired for good
//! rather than wrapped (with `n_seq_max = 65536` that takes 2^47 frees of one
//! index, so in practice never; then `seq_new` runs out of indices, it never
//! hands out an old id). The bound keeps every id a non-negative signed 64-bit
//! integer, which Python, numpy's int64 and C's `int64_t` all hold.

use super::CellCache;
use crate::error::{CacheError, Result};

/// A sequence id, handed out by `CellCache::seq_new` / `CellCache::seq_clone`.
pub type SeqId = u64;

/// Largest id handed out.
pub const MAX_SEQ_ID: SeqId = i64::MAX as SeqId;

/// The id that sequence index `ix` hands out at generation `gen` (`None` past [`MAX_SEQ_ID`]).
pub(crate) fn compose(gen: u64, ix: usize, n_seq_max: usize) -> Option<SeqId> {
    gen.checked_mul(u64::try_from(n_seq_max).ok()?)?
        .checked_add(u64::try_from(ix).ok()?)
        .filter(|id| *id <= MAX_SEQ_ID)
}

/// The index and generation an id names (`None` for `n_seq_max == 0`).
pub(crate) fn split(id: SeqId, n_seq_max: usize) -> Option<(usize, u64)> {
    let n = u64::try_from(n_seq_max).ok()?;
    let ix = usize::try_from(id.checked_rem(n)?).ok()?;
    Some((ix, id.checked_div(n)?))
}

/// The generation after `gen` for `ix`, or `None` when its id would not fit:
/// the index must then be retired, never wrapped to an id it handed out before.
pub(crate) fn next_gen(gen: u64, ix: usize, n_seq_max: usize) -> Option<u64> {
    let next = gen.checked_add(1)?;
    compose(next, ix, n_seq_max).map(|_| next)
}

pub(super) fn unknown(verb: &str, id: SeqId) -> CacheError {
    CacheError::UnknownSequence(format!(
        "{verb}: sequence id {id} is not live (not handed out by this cache, or already freed)"
    ))
}

impl CellCache {
    pub(super) fn id_of(&self, ix: usize) -> SeqId {
        // A live index's generation always composes (`retire_index` keeps it so).
        let gen = self.seqs.get(ix).map_or(0, |s| s.gen);
        compose(gen, ix, self.n_seq_max).unwrap_or(SeqId::MAX)
    }

    pub(super) fn index_of(&self, id: SeqId, verb: &str) -> Result<usize> {
        let Some((ix, gen)) = split(id, self.n_seq_max) else {
            return Err(unknown(verb, id));
        };
        match self.seqs.get(ix) {
            Some(s) if s.live && s.gen == gen => Ok(ix),
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
        let ix = self.free_indices.pop().ok_or_else(|| {
            CacheError::OutOfCapacity(format!(
                "{verb}: no free sequence index (n_seq_max {})",
                self.n_seq_max
            ))
        })? as usize;
        if let Some(s) = self.seqs.get_mut(ix) {
            s.live = true;
        }
        self.n_live = self.n_live.saturating_add(1);
        Ok(ix)
    }

    /// Retires `ix`: its id will be refused from now on.
    pub(super) fn retire_index(&mut self, ix: usize) {
        let n_seq_max = self.n_seq_max;
        if let Some(s) = self.seqs.get_mut(ix) {
            if !s.live {
                return;
            }
            s.live = false;
            self.n_live = self.n_live.saturating_sub(1);
            match next_gen(s.gen, ix, n_seq_max) {
                Some(g) => {
                    s.gen = g;
                    if let Ok(v) = u32::try_from(ix) {
                        self.free_indices.push(v);
                    }
                }
                None => s.exhausted = true,
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::arithmetic_side_effects)]
mod tests {
    use super::*;

    #[test]
    fn compose_and_split_round_trip() {
        for (gen, ix, n) in [(0, 0, 1), (7, 3, 4), (1 << 40, 65_535, 65_536)] {
            let id = compose(gen, ix, n).unwrap();
            assert_eq!(split(id, n), Some((ix, gen)));
        }
    }

    #[test]
    fn the_last_generation_retires_instead_of_wrapping() {
        let n = 65_536;
        let last = MAX_SEQ_ID / n as u64; // compose(last, index) fits for every index < n
        assert!(compose(last, n - 1, n).is_some());
        assert_eq!(next_gen(last - 1, n - 1, n), Some(last));
        assert_eq!(next_gen(last, 0, n), None);
        assert_eq!(next_gen(MAX_SEQ_ID, 0, 1), None);
        assert_eq!(compose(MAX_SEQ_ID, 0, 1), Some(MAX_SEQ_ID));
    }
}
