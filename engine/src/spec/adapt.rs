//! Draft length: the one that yields most tokens per second of forward.
//!
//! A step verifying `k` drafts of one sequence yields `1 + p + ... + p^k`
//! tokens on average (`p`: the sequence's estimated chance that a draft token
//! is accepted) and costs a forward of the step's token count. That cost
//! depends on the CPU and the kernels (on AVX-512 VNNI a 9-token step of a
//! small model costs ~1.5x a one-token one, on an AVX2-only CPU ~3.7x, and
//! 4-token chunks make 5 tokens cost nearly what 8 do), so [`StepCost`]
//! times every forward by its token count and [`choose`] weighs the lengths
//! with it. The same rule as the Python generator's (`batch/draft_length.py`).

use std::collections::BTreeMap;

use crate::error::{EngineError, Result};

/// A new measurement's weight in its count's estimate.
const ALPHA: f64 = 0.25;
/// A sample above this multiple of the estimate counts as this multiple: a
/// shared machine's interruptions only ever make a forward slower.
const SPIKE: f64 = 1.5;
/// Steps a sequence goes without drafting before it drafts anyway, to keep
/// its acceptance estimate current.
pub const PROBE_EVERY: usize = 16;

/// Seconds of a forward by its number of tokens: measured, or fixed as
/// ratios to a one-token forward.
#[derive(Debug, Clone, Default)]
pub struct StepCost {
    t: BTreeMap<usize, f64>,
    fixed: bool,
}

impl StepCost {
    /// Nothing measured yet.
    pub fn measured() -> StepCost {
        StepCost::default()
    }

    /// Fixed costs: `(tokens, ratio to one token)` pairs (none: every
    /// forward costs what one token's does). `InvalidArgument` for a count
    /// of 0 or a ratio that is not finite and above 0.
    pub fn fixed(ratios: &[(usize, f64)]) -> Result<StepCost> {
        let mut t = BTreeMap::from([(1, 1.0)]);
        for &(n, r) in ratios {
            if n == 0 || !(r.is_finite() && r > 0.0) {
                return Err(EngineError::InvalidArgument(format!(
                    "speculation step cost: expected token counts >= 1 and finite ratios > 0, \
                     got ({n}, {r})"
                )));
            }
            t.insert(n, r);
        }
        Ok(StepCost { t, fixed: true })
    }

    /// Records a forward of `n_tokens` that took `seconds` (ignored when fixed).
    pub fn record(&mut self, n_tokens: usize, seconds: f64) {
        if self.fixed || n_tokens == 0 || !(seconds > 0.0 && seconds.is_finite()) {
            return;
        }
        self.t
            .entry(n_tokens)
            .and_modify(|old| *old += ALPHA * (seconds.min(SPIKE * *old) - *old))
            .or_insert(seconds);
    }

    /// The estimate for `n_tokens`: measured, interpolated between the
    /// nearest measured counts, or the largest measured count's below it;
    /// `None` if nothing at or below it was measured.
    pub fn seconds(&self, n_tokens: usize) -> Option<f64> {
        let (&lo, &tl) = self.t.range(..=n_tokens).next_back()?;
        if lo == n_tokens {
            return Some(tl);
        }
        Some(match self.t.range(n_tokens..).next() {
            Some((&hi, &th)) => tl + (n_tokens - lo) as f64 / (hi - lo) as f64 * (th - tl),
            None => tl,
        })
    }

    /// The measured counts' costs over a one-token forward's (empty before one ran).
    pub fn ratios(&self) -> Vec<(usize, f64)> {
        match self.t.get(&1) {
            Some(&one) => self.t.iter().map(|(&n, &t)| (n, t / one)).collect(),
            None => Vec::new(),
        }
    }
}

/// A sequence's chance that a draft token is accepted: accepted tokens
/// against rejections (verifications that stopped before the draft's end),
/// older ones decaying, from one of each (0.5).
#[derive(Debug, Clone, Copy)]
pub struct Acceptance {
    accepted: f64,
    rejected: f64,
    /// Steps since the sequence last drafted.
    pub(super) idle: usize,
}

impl Default for Acceptance {
    fn default() -> Acceptance {
        Acceptance {
            accepted: 1.0,
            rejected: 1.0,
            idle: 0,
        }
    }
}

impl Acceptance {
    const DECAY: f64 = 0.9;

    /// Records a verification of `drafted` tokens that kept `accepted`.
    pub fn record(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        self.accepted = Self::DECAY * self.accepted + accepted as f64;
        self.rejected = Self::DECAY * self.rejected + f64::from(u8::from(accepted < drafted));
    }

    pub fn p(&self) -> f64 {
        self.accepted / (self.accepted + self.rejected)
    }
}

/// Tokens a step verifying `k` drafts yields when each is accepted with `p`
/// (independently, until the first rejection), the token after the last
/// kept one included.
pub fn expected_tokens(p: f64, k: usize) -> f64 {
    if p >= 1.0 {
        (k + 1) as f64
    } else {
        (1.0 - p.powi(k as i32 + 1)) / (1.0 - p)
    }
}

/// Tokens per second of a step of `n_before + k` tokens whose sequence
/// drafts `k` (each other token counting as one).
fn rate(cost: &StepCost, n_before: usize, k: usize, p: f64) -> Option<f64> {
    let t = cost.seconds(n_before + k)?;
    Some((n_before as f64 - 1.0 + expected_tokens(p, k)) / t)
}

/// The length in `ks` with the most tokens per second (the shortest of
/// equal ones; a length without an estimate counts as 0), `None` for none.
fn best(
    cost: &StepCost,
    n_before: usize,
    ks: std::ops::RangeInclusive<usize>,
    p: f64,
) -> Option<usize> {
    let mut out: Option<(usize, f64)> = None;
    for k in ks {
        let v = rate(cost, n_before, k, p).unwrap_or(0.0);
        if out.is_none_or(|(_, b)| v > b) {
            out = Some((k, v));
        }
    }
    out.map(|(k, _)| k)
}

/// The draft length (`0..=k_max`) with the most tokens per second for a
/// sequence whose pending token is the `n_before`-th of the step; 0 while
/// no forward of at most `n_before` tokens was measured (the step then
/// measures one, and every longer step has an estimate).
pub fn choose(cost: &StepCost, n_before: usize, k_max: usize, p: f64) -> usize {
    if cost.seconds(n_before).is_none() {
        return 0;
    }
    best(cost, n_before, 0..=k_max, p).unwrap_or(0)
}

/// The best length of at least one draft (a probe when [`choose`] says
/// none pays); 0 only for `k_max` 0.
pub fn best_positive(cost: &StepCost, n_before: usize, k_max: usize, p: f64) -> usize {
    best(cost, n_before, 1..=k_max, p).unwrap_or(0)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// By 4-token chunks, each past the first half a one-token forward more.
    fn chunked() -> StepCost {
        let r: Vec<(usize, f64)> = (1..=16)
            .map(|t: usize| (t, 1.0 + 0.5 * (t.div_ceil(4) - 1) as f64))
            .collect();
        StepCost::fixed(&r).unwrap()
    }

    #[test]
    fn measured_costs_interpolate_and_damp_spikes() {
        let mut c = StepCost::measured();
        assert_eq!(c.seconds(1), None);
        c.record(1, 0.010);
        c.record(9, 0.050);
        assert_eq!(c.seconds(1), Some(0.010));
        assert!((c.seconds(5).unwrap() - 0.030).abs() < 1e-12);
        assert_eq!(c.seconds(20), Some(0.050));
        c.record(1, 1.0); // an interruption: counted as 1.5x
        assert!((c.seconds(1).unwrap() - 0.01125).abs() < 1e-12);
        c.record(1, 0.0);
        c.record(0, 0.5);
        assert!((c.seconds(1).unwrap() - 0.01125).abs() < 1e-12);
        let mut below = StepCost::measured();
        below.record(40, 0.2);
        assert_eq!(below.seconds(1), None);
        assert!(below.ratios().is_empty());
    }

    #[test]
    fn fixed_costs_ignore_measurements_and_bad_ones_are_refused() {
        let mut c = StepCost::fixed(&[(4, 1.3)]).unwrap();
        c.record(4, 9.0);
        assert_eq!(c.seconds(4), Some(1.3));
        assert!((c.seconds(2).unwrap() - 1.1).abs() < 1e-12);
        assert_eq!(StepCost::fixed(&[]).unwrap().seconds(7), Some(1.0));
        for bad in [(0, 1.0), (2, -1.0), (2, f64::NAN), (2, f64::INFINITY)] {
            assert!(matches!(
                StepCost::fixed(&[bad]),
                Err(EngineError::InvalidArgument(_))
            ));
        }
    }

    #[test]
    fn acceptance_and_expected_tokens() {
        let mut a = Acceptance::default();
        assert_eq!(a.p(), 0.5);
        (0..10).for_each(|_| a.record(4, 4));
        assert!(a.p() > 0.9);
        (0..30).for_each(|_| a.record(4, 0));
        assert!(a.p() < 0.15);
        assert_eq!(expected_tokens(0.0, 5), 1.0);
        assert_eq!(expected_tokens(1.0, 5), 6.0);
        assert!((expected_tokens(0.5, 2) - 1.75).abs() < 1e-12);
    }

    #[test]
    fn lengths_follow_the_costs() {
        let c = chunked();
        assert_eq!(choose(&c, 1, 8, 0.9), 7); // 5 tokens cost what 8 do
        assert_eq!(choose(&c, 1, 8, 0.6), 3);
        assert_eq!(choose(&c, 1, 2, 0.6), 2);
        assert_eq!(choose(&c, 2, 8, 0.6), 2);
        assert_eq!(choose(&c, 4, 8, 0.3), 0);
        assert_eq!(best_positive(&c, 4, 8, 0.3), 4);
        let vnni = StepCost::fixed(&[(2, 1.08), (4, 1.29), (8, 1.54), (12, 1.92)]).unwrap();
        assert_eq!(choose(&vnni, 1, 8, 0.9), 8);
        assert_eq!(choose(&vnni, 1, 8, 0.05), 0);
        assert_eq!(choose(&StepCost::measured(), 1, 8, 0.99), 0);
    }
}
