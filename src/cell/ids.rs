//! Sequence ids: `generation * n_seq_max + slot`, at most `i64::MAX`.
//!
//! Freeing a slot bumps its generation, so a stale id is refused instead of
//! addressing the sequence that reuses the slot. Ids never repeat in a cache's
//! lifetime: a slot whose next id would pass `i64::MAX` is retired for good
//! rather than wrapped (with `n_seq_max = 65536` that takes 2^47 frees of one
//! slot, so in practice never; then `seq_new` runs out of slots, it never
//! hands out an old id). The bound keeps every id a non-negative signed 64-bit
//! integer, which Python, numpy's int64 and C's `int64_t` all hold.

/// A sequence id, handed out by `CellCache::seq_new` / `CellCache::seq_clone`.
pub type SeqId = u64;

/// Largest id handed out.
pub const MAX_SEQ_ID: SeqId = i64::MAX as SeqId;

/// The id that slot `slot` hands out at generation `gen` (`None` past [`MAX_SEQ_ID`]).
pub(crate) fn compose(gen: u64, slot: usize, n_seq_max: usize) -> Option<SeqId> {
    gen.checked_mul(u64::try_from(n_seq_max).ok()?)?
        .checked_add(u64::try_from(slot).ok()?)
        .filter(|id| *id <= MAX_SEQ_ID)
}

/// The slot and generation an id names (`None` for `n_seq_max == 0`).
pub(crate) fn split(id: SeqId, n_seq_max: usize) -> Option<(usize, u64)> {
    let n = u64::try_from(n_seq_max).ok()?;
    let slot = usize::try_from(id.checked_rem(n)?).ok()?;
    Some((slot, id.checked_div(n)?))
}

/// The generation after `gen` for `slot`, or `None` when its id would not fit:
/// the slot must then be retired, never wrapped to an id it handed out before.
pub(crate) fn next_gen(gen: u64, slot: usize, n_seq_max: usize) -> Option<u64> {
    let next = gen.checked_add(1)?;
    compose(next, slot, n_seq_max).map(|_| next)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::arithmetic_side_effects)]
mod tests {
    use super::*;

    #[test]
    fn compose_and_split_round_trip() {
        for (gen, slot, n) in [(0, 0, 1), (7, 3, 4), (1 << 40, 65_535, 65_536)] {
            let id = compose(gen, slot, n).unwrap();
            assert_eq!(split(id, n), Some((slot, gen)));
        }
    }

    #[test]
    fn the_last_generation_retires_instead_of_wrapping() {
        let n = 65_536;
        let last = MAX_SEQ_ID / n as u64; // compose(last, slot) fits for every slot < n
        assert!(compose(last, n - 1, n).is_some());
        assert_eq!(next_gen(last - 1, n - 1, n), Some(last));
        assert_eq!(next_gen(last, 0, n), None);
        assert_eq!(next_gen(MAX_SEQ_ID, 0, 1), None);
        assert_eq!(compose(MAX_SEQ_ID, 0, 1), Some(MAX_SEQ_ID));
    }
}
