//! The online-softmax state of a block of query rows and its fold, shared by
//! the native kernel and XNNPACK.
//!
//! Scores live in the log2 domain: `q` is pre-scaled by `scale · log2(e)`, so
//! the state's running max is in log2 units and rescaling uses [`exp2`].
// Row indices and offsets are bounded by the validated block geometry
// ("Arithmetic bounds" in validate.rs).
#![allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]

/// Online-softmax state of a block: running max (log2 domain), sum, accumulator.
pub(super) struct State<'a> {
    pub m: &'a mut [f32],
    pub l: &'a mut [f32],
    pub acc: &'a mut [f32],
    /// Score tile scratch: two tiles of `RB * KT` (the pipeline's double buffer).
    pub sc: &'a mut [f32],
    /// Widened K and V tiles of non-float32 pools: `2 * KT * hd` floats.
    pub conv: &'a mut [f32],
}

impl State<'_> {
    /// Folds one tile's softmax of row `r` (new running max `mn`, its sum of
    /// `2^(s - mn)`) into the running state, rescaling the accumulator when
    /// the max grew. The native kernel calls the free [`fold_row`] on the
    /// state's parts instead (its score buffers stay borrowed).
    #[cfg(feature = "xnnpack")]
    #[inline(always)]
    pub(super) fn fold_row(&mut self, r: usize, mn: f32, sum: f32, hd: usize) {
        fold_row(self.m, self.l, self.acc, r, mn, sum, hd);
    }
}

/// [`State::fold_row`] on the state's parts (so the score buffers can stay borrowed).
#[inline(always)]
pub(super) fn fold_row(
    m: &mut [f32],
    l: &mut [f32],
    acc: &mut [f32],
    r: usize,
    mn: f32,
    sum: f32,
    hd: usize,
) {
    let m_old = m[r];
    if m_old == f32::NEG_INFINITY {
        l[r] = sum;
    } else if mn > m_old {
        let alpha = exp2(m_old - mn);
        l[r] = l[r] * alpha + sum;
        for x in &mut acc[r * hd..(r + 1) * hd] {
            *x *= alpha;
        }
    } else {
        l[r] += sum;
    }
    m[r] = mn;
}

/// `e^f` for `|f| <= 0.347` (so `2^x = 2^n · e^((x - n) ln 2)`): the Taylor
/// coefficients through `f^7`, highest first, for Horner's rule. The scalar
/// [`exp2`] and the ISAs' vector forms all evaluate this one polynomial.
pub(super) const EXP2_POLY: [f32; 8] = [
    1.0 / 5040.0,
    1.0 / 720.0,
    1.0 / 120.0,
    1.0 / 24.0,
    1.0 / 6.0,
    0.5,
    1.0,
    1.0,
];

/// `2^x` for `x <= 0` to ~1e-7 relative; 0 below -126 (and for -inf).
/// Pure arithmetic on bits so loops over it vectorise.
#[inline(always)]
pub(super) fn exp2(x: f32) -> f32 {
    if x.is_nan() || x < -126.0 {
        return 0.0;
    }
    exp2_in_range(x)
}

/// [`exp2`] without its range check: `x` must be finite and `>= -127`.
/// Branch-free, so callers that select the out-of-range lanes themselves
/// vectorise it even where the early return would not.
#[inline(always)]
pub(super) fn exp2_in_range(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23: round to nearest integer
    let n = (x + MAGIC) - MAGIC;
    let f = (x - n) * std::f32::consts::LN_2; // |f| <= 0.347
    let [first, rest @ ..] = EXP2_POLY;
    let p = rest.iter().fold(first, |p, &c| p * f + c);
    let bits = ((n as i32 + 127) as u32) << 23;
    p * f32::from_bits(bits)
}
