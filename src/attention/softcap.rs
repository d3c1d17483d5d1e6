//! Attention logit soft-capping (Gemma 2): each score becomes
//! `cap · tanh(score / cap)` before the mask and the softmax, so no score
//! leaves `(-cap, cap)`.
//!
//! The kernels hold scores in the log2 domain (`s = score · log2(e)`), where
//! the same map reads `s' = c · tanh(s / c)` with `c = cap · log2(e)`. It is
//! evaluated as `log2(e) · cap · tanh(s · ln(2) / cap)` so that no finite
//! cap overflows (`cap · log2(e)` would for caps above `f32::MAX / log2(e)`).
//!
//! [`cap_tanh`] is branch-free arithmetic, so the per-tile loop
//! ([`Softcap::apply_row`]) vectorises under each ISA's target features.
//! Accuracy: a few f32 ulps relative over the whole range (the unit test
//! below checks 6e-7 against f64), so a cap far above the scores changes
//! them by no more than rounding.

use super::softmax::exp2_in_range;
use std::f32::consts::{LN_2, LOG2_E};

/// A validated cap: finite and `> 0`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Softcap {
    cap: f32,
}

impl Softcap {
    /// `cap` must be finite and `> 0` (checked by `validate`).
    pub(super) fn new(cap: f32) -> Self {
        Softcap { cap }
    }

    /// One log2-domain score, capped.
    #[inline(always)]
    pub(super) fn apply(self, s: f32) -> f32 {
        LOG2_E * cap_tanh(s * LN_2, self.cap)
    }

    /// Caps every lane of a score row (fixed width, so it vectorises).
    #[inline(always)]
    pub(super) fn apply_row<const N: usize>(self, row: &mut [f32; N]) {
        for s in row.iter_mut() {
            *s = self.apply(*s);
        }
    }

    /// Caps a score tile of any length.
    #[cfg(feature = "xnnpack")]
    #[inline(always)]
    pub(super) fn apply_slice(self, s: &mut [f32]) {
        for x in s.iter_mut() {
            *x = self.apply(*x);
        }
    }
}

/// Below this `|x / cap|` the series is used: its first omitted term is
/// then under 5e-9 relative, and above it `e^(-2|x / cap|) <= 0.5`, so
/// `1 - e^(-2|x / cap|)` loses no bits to cancellation.
const SERIES_BELOW: f32 = 0.35;

/// `cap · tanh(x / cap)` to a few ulps, branch-free (both forms are computed
/// and one is selected). Near 0 it is `x · (1 + y² · series)` with
/// `y = x / cap`, never `cap · y`: a huge cap makes `y` subnormal or 0, and
/// the result is still `x`. NaN stays NaN; `±inf` gives `±cap`.
#[inline(always)]
pub(super) fn cap_tanh(x: f32, cap: f32) -> f32 {
    let a = (x / cap).abs();
    let a2 = a * a;
    // (tanh(y)/y - 1) / y² by tanh's Taylor series through y^11, highest
    // coefficient first (Horner), as a polynomial in y².
    let series = [
        -1382.0 / 155_925.0,
        62.0 / 2835.0,
        -17.0 / 315.0,
        2.0 / 15.0,
        -1.0 / 3.0,
    ]
    .iter()
    .fold(0.0f32, |p, &c| p * a2 + c);
    let small = x + x * (a2 * series);
    // tanh(a) = (1 - e) / (1 + e), e = e^(-2a) = 2^(-2a·log2(e)); below
    // 2^-127 the exponent is clamped and e is (as good as) 0, giving 1.
    let e = exp2_in_range((-2.0 * LOG2_E * a).max(-127.0));
    let large = cap * ((1.0 - e) / (1.0 + e));
    // A NaN `a` fails the comparison and keeps the series' NaN; the sign is
    // x's (the series already has it, except for -0).
    let t = if a >= SERIES_BELOW { large } else { small };
    t.copysign(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tanh_matches_f64_to_a_few_ulps() {
        let tanh = |x: f32| cap_tanh(x, 1.0);
        let mut worst = 0f64;
        let mut x = 1e-30f32;
        while x < 20.0 {
            for v in [x, -x] {
                let want = f64::from(v).tanh();
                let got = f64::from(tanh(v));
                let rel = (got - want).abs() / want.abs();
                assert!(rel <= 6e-7, "tanh({v}) = {got}, want {want} (rel {rel:e})");
                worst = worst.max(rel);
            }
            x *= 1.0007;
        }
        assert!(worst > 0.0);
        assert_eq!(tanh(0.0).to_bits(), 0.0f32.to_bits());
        assert_eq!(tanh(-0.0).to_bits(), (-0.0f32).to_bits());
        assert_eq!(tanh(f32::INFINITY), 1.0);
        assert_eq!(tanh(f32::NEG_INFINITY), -1.0);
        assert_eq!(tanh(1e30), 1.0);
        assert!(tanh(f32::NAN).is_nan());
    }

    #[test]
    fn capped_scores_stay_inside_the_cap_and_huge_caps_change_nothing() {
        let cap = Softcap::new(5.0);
        let c = 5.0 * LOG2_E;
        for s in [-1e6f32, -40.0, -7.2, -1.0, 0.0, 0.3, 7.2, 40.0, 1e6] {
            let got = cap.apply(s);
            let want = f64::from(c) * (f64::from(s) / f64::from(c)).tanh();
            assert!(got.abs() <= c, "{s} -> {got}");
            assert!((f64::from(got) - want).abs() <= 1e-6 * c as f64, "{s}");
        }
        for big in [1e6f32, 1e30, f32::MAX] {
            let cap = Softcap::new(big);
            for s in [-30.0f32, -1.5, 0.25, 12.0, 60.0] {
                let got = cap.apply(s);
                assert!(((got - s) / s).abs() <= 1e-6, "cap {big}: {s} -> {got}");
            }
        }
    }
}
