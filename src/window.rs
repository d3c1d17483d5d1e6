//! A layer's window policy and its arithmetic, in one place: how deep a ring
//! layer is, which positions a query sees, and how many cells a forked
//! workload needs. Every part of the
//! project (the caches, attention, the bindings, the demo, the runner and the
//! transformers adapter) asks here instead of repeating the formulas.

/// How a layer keeps its history.
///
/// Serialised discriminants (see [`LayerPolicy::code`]) are append-only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LayerPolicy {
    /// Keeps every position up to the cache's capacity.
    Flat,
    /// A sliding window: a query at position p sees keys in `[p - window + 1, p]`.
    ///
    /// A window at or above what the layer can ever hold (the cache's capacity)
    /// makes the layer a full one: every held position is visible, and its pool
    /// depth is bounded by the capacity, so it never wraps and never bounds a
    /// rewind.
    Ring { window: usize },
}

impl LayerPolicy {
    /// Stable serialised discriminant: 0 = Flat, 1 = Ring. Append-only.
    pub fn code(&self) -> u8 {
        match self {
            LayerPolicy::Flat => 0,
            LayerPolicy::Ring { .. } => 1,
        }
    }

    /// The window of a ring layer, `None` for a flat one.
    pub fn window(&self) -> Option<usize> {
        match self {
            LayerPolicy::Flat => None,
            LayerPolicy::Ring { window } => Some(*window),
        }
    }
}

/// Positions a ring layer of `window` keeps for steps of up to `max_step`
/// tokens: `window + max_step - 1`. The step's earliest query needs the
/// `window - 1` positions before it, and the step itself adds `max_step`; the
/// same margin lets any rewind within `max_step` of the high water succeed.
/// Saturates: a window at or above what a cache can hold keeps everything.
pub fn ring_keep(window: usize, max_step: usize) -> usize {
    window.saturating_add(max_step.saturating_sub(1))
}

/// The first position a query at `pos` sees: `pos + 1 - window` for a ring
/// layer (0 when that is negative), 0 for a flat one (`window = None`).
pub fn first_visible(pos: usize, window: Option<usize>) -> usize {
    // pos + 1 - w, written so that it cannot overflow at pos = usize::MAX.
    window.map_or(0, |w| pos.saturating_sub(w.saturating_sub(1)))
}

/// Whether a query at `query_pos` sees the key at `key_pos` (causal, and
/// within the window for a ring layer).
pub fn sees(query_pos: usize, key_pos: usize, window: Option<usize>) -> bool {
    key_pos <= query_pos && key_pos >= first_visible(query_pos, window)
}

/// Cells a `CellCache` needs, for layers of `policies` and steps of up to
/// `max_step` tokens (`CacheConfig::cells_for_forks` passes its own), for
/// `n_seqs` sequences forked from one
/// `prefix`-token sequence, each then growing by `new_tokens` positions one
/// step at a time, with no cell ever refused. The full table (flat layers)
/// holds the prefix once plus every sequence's own tokens; the ring table
/// holds per sequence at most `ring_keep` positions, plus one token of
/// headroom each for the step that places before its drops free a cell.
pub fn cells_for_forks(
    policies: impl IntoIterator<Item = LayerPolicy>,
    max_step: usize,
    prefix: usize,
    n_seqs: usize,
    new_tokens: usize,
) -> usize {
    checked_cells_for_forks(policies, max_step, prefix, n_seqs, new_tokens).unwrap_or(usize::MAX)
}

/// [`cells_for_forks`], or `None` when the count does not fit a `usize`
/// (where `cells_for_forks` saturates to `usize::MAX`).
pub fn checked_cells_for_forks(
    policies: impl IntoIterator<Item = LayerPolicy>,
    max_step: usize,
    prefix: usize,
    n_seqs: usize,
    new_tokens: usize,
) -> Option<usize> {
    let mut need = 0usize;
    let mut widest: Option<usize> = None;
    for policy in policies {
        match policy {
            LayerPolicy::Ring { window } => widest = widest.max(Some(window)),
            LayerPolicy::Flat => {
                need = need.max(prefix.checked_add(n_seqs.checked_mul(new_tokens)?)?)
            }
        }
    }
    if let Some(w) = widest {
        let keep = ring_keep(w, max_step);
        let ring = prefix
            .min(keep)
            .checked_add(n_seqs.checked_mul(new_tokens.min(keep))?)?
            .checked_add(n_seqs)?;
        need = need.max(ring);
    }
    Some(need)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{CacheConfig, LayerConfig};

    #[test]
    fn first_visible_and_sees_follow_the_window() {
        assert_eq!(first_visible(10, Some(4)), 7);
        assert_eq!(first_visible(2, Some(4)), 0);
        assert_eq!(first_visible(10, None), 0);
        assert_eq!(first_visible(usize::MAX, Some(1)), usize::MAX);
        assert!(sees(10, 7, Some(4)) && !sees(10, 6, Some(4)) && !sees(10, 11, None));
    }

    #[test]
    fn ring_keep_saturates() {
        assert_eq!(ring_keep(512, 1), 512);
        assert_eq!(ring_keep(8, 4), 11);
        assert_eq!(ring_keep(usize::MAX, 4), usize::MAX);
    }

    #[test]
    fn cells_for_forks_takes_the_tighter_table() {
        let ring = LayerConfig::new(LayerPolicy::Ring { window: 8 }, 1, 4);
        let flat = LayerConfig::new(LayerPolicy::Flat, 1, 4);
        let mut cfg = CacheConfig::new(1024, 2, vec![ring, flat]);
        cfg.max_step = 4;
        // flat: 100 + 3 * 20 = 160; ring: min(100, 11) + 3 * min(20, 11) + 3 = 47
        assert_eq!(cfg.cells_for_forks(100, 3, 20), 160);
        cfg.layers = vec![ring];
        assert_eq!(cfg.cells_for_forks(100, 3, 20), 47);
        let ring_policy = LayerPolicy::Ring { window: 8 };
        assert_eq!(cells_for_forks([ring_policy], 4, 100, 3, 20), 47);
    }
}
