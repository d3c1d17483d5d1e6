//! Prompt lookup: drafts for a sequence from its own tokens, no second model.
//!
//! The last `n` tokens (the longest `n` from `max_ngram` down to `min_ngram`
//! that occurred before) are looked up in the earlier text; the tokens that
//! followed their latest earlier occurrence are the draft. Agent and editing
//! loads quote their context back, so the continuation of a match is often
//! the text about to be written.

use crate::error::{EngineError, Result};

/// The lookup's n-gram sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ngram {
    min_ngram: usize,
    max_ngram: usize,
}

impl Default for Ngram {
    fn default() -> Self {
        Ngram {
            min_ngram: 1,
            max_ngram: 3,
        }
    }
}

impl Ngram {
    /// Lookup with n-grams of `min_ngram..=max_ngram` tokens: `InvalidArgument`
    /// unless `1 <= min_ngram <= max_ngram`.
    pub fn new(min_ngram: usize, max_ngram: usize) -> Result<Ngram> {
        if min_ngram == 0 || max_ngram < min_ngram {
            return Err(EngineError::InvalidArgument(format!(
                "n-gram sizes: expected 1 <= min <= max, got min {min_ngram}, max {max_ngram}"
            )));
        }
        Ok(Ngram {
            min_ngram,
            max_ngram,
        })
    }

    /// Up to `k` tokens that followed the latest earlier occurrence of the
    /// longest suffix of `tokens` (longest n first); empty when none occurs
    /// before or `k` is 0.
    pub fn draft(&self, tokens: &[u32], k: usize) -> Vec<u32> {
        let len = tokens.len();
        if k == 0 {
            return Vec::new();
        }
        for n in (self.min_ngram..=self.max_ngram.min(len.saturating_sub(1))).rev() {
            let Some(suffix) = tokens.get(len - n..) else {
                continue;
            };
            // Start of the latest earlier occurrence: the window ending
            // before the suffix itself.
            let found = tokens.windows(n).take(len - n).rposition(|w| w == suffix);
            if let Some(at) = found {
                let from = at + n;
                let to = (from + k).min(len);
                return tokens
                    .get(from..to)
                    .map(<[u32]>::to_vec)
                    .unwrap_or_default();
            }
        }
        Vec::new()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_suffix_wins_and_the_latest_occurrence() {
        let g = Ngram::default();
        // "1 2 3" occurs at 0 (then 4 5) and the 1-gram "3" later at 6 (then 9).
        let t = [1, 2, 3, 4, 5, 0, 3, 9, 1, 2, 3];
        assert_eq!(g.draft(&t, 2), vec![4, 5]);
        // Only "3" matches: its latest earlier occurrence is at 6.
        let t = [1, 2, 3, 4, 5, 0, 3, 9, 7, 3];
        assert_eq!(g.draft(&t, 3), vec![9, 7, 3]);
    }

    #[test]
    fn a_draft_stops_at_k_and_at_the_end() {
        let g = Ngram::default();
        let t = [7, 8, 7, 8];
        assert_eq!(g.draft(&t, 5), vec![7, 8]);
        assert_eq!(g.draft(&t, 1), vec![7]);
        assert!(g.draft(&t, 0).is_empty());
    }

    #[test]
    fn no_match_no_draft() {
        let g = Ngram::default();
        assert!(g.draft(&[], 4).is_empty());
        assert!(g.draft(&[5], 4).is_empty());
        assert!(g.draft(&[1, 2, 3, 4], 4).is_empty());
        // min_ngram 2: a repeated single token is not enough.
        let g = Ngram::new(2, 3).unwrap();
        assert!(g.draft(&[1, 2, 9, 2], 4).is_empty());
        assert_eq!(g.draft(&[1, 2, 9, 1, 2], 4), vec![9, 1, 2]);
    }

    #[test]
    fn bad_sizes_are_refused() {
        assert!(matches!(
            Ngram::new(0, 3),
            Err(EngineError::InvalidArgument(_))
        ));
        assert!(matches!(
            Ngram::new(3, 2),
            Err(EngineError::InvalidArgument(_))
        ));
    }
}
