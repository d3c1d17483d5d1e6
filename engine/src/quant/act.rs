//! Activation quantization: each weight type's dot takes its activations in
//! the block form GGML pairs with it, quantized once per call for all rows.
//!
//! - 32-value weights (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0): Q8 blocks of 32 int8
//!   with an f32 scale `d = max|x| / 127` and `s = d · Σq` (the block sum the
//!   Q4_1/Q5_1 min term needs; Q8_1-style).
//! - K weights (Q4_K, Q5_K, Q6_K, Q8_K): Q8_K blocks of 256 int8, one f32
//!   scale, and the 16 partial sums of 16 values each (the K mins need them).
//! - Float weights (F32, F16, BF16): the f32 activations as given.
//!
//! The scales stay f32 (GGML's Q8_0 stores an f16 one): the rounding then
//! depends on the activations only.

use crate::ggml_type::GgmlType;

/// Which activation form a weight type's dot takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ActKind {
    F32,
    Q8,
    Q8K,
}

impl ActKind {
    pub(super) fn of(ty: GgmlType) -> ActKind {
        match ty {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => ActKind::F32,
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8_0 => {
                ActKind::Q8
            }
            GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K | GgmlType::Q8_K => ActKind::Q8K,
        }
    }
}

/// Quantized activations of `n` tokens of `cols` values; the vectors only
/// grow, so a warm buffer allocates nothing.
#[derive(Default)]
pub(super) struct ActBuf {
    qs: Vec<i8>,
    d: Vec<f32>,
    /// Q8: `d · Σq` per 32-block.
    s: Vec<f32>,
    /// Q8K: Σq per 16 values.
    bs: Vec<i16>,
    cols: usize,
    n: usize,
    kind: Option<ActKind>,
}

/// One token's activations in the form its weight's dot takes.
#[derive(Clone, Copy)]
pub(super) struct Act<'a> {
    pub qs: &'a [i8],
    pub d: &'a [f32],
    pub s: &'a [f32],
    pub bs: &'a [i16],
    pub x: &'a [f32],
}

fn grow<T: Copy + Default>(v: &mut Vec<T>, n: usize) {
    if v.len() < n {
        v.resize(n, T::default());
    }
}

/// `round(v)` half away from zero, clamped to int8's symmetric range.
#[inline(always)]
fn q8(v: f32) -> i8 {
    v.round().clamp(-127.0, 127.0) as i8
}

impl ActBuf {
    /// Quantizes `x` (`n * cols` values, `cols` a multiple of the kind's
    /// block) as `kind`.
    pub(super) fn fill(&mut self, kind: ActKind, x: &[f32], cols: usize, n: usize) {
        self.cols = cols;
        self.n = n;
        self.kind = Some(kind);
        let len = n.saturating_mul(cols);
        let x = x.get(..len).unwrap_or(&[]);
        match kind {
            ActKind::F32 => {}
            ActKind::Q8 => {
                grow(&mut self.qs, len);
                grow(&mut self.d, len / 32);
                grow(&mut self.s, len / 32);
                let it = x
                    .chunks_exact(32)
                    .zip(self.qs.chunks_exact_mut(32))
                    .zip(self.d.iter_mut().zip(self.s.iter_mut()));
                for ((xb, qb), (d, s)) in it {
                    let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
                    let dd = amax / 127.0;
                    let id = if dd > 0.0 { 1.0 / dd } else { 0.0 };
                    let mut sum = 0i32;
                    for (q, v) in qb.iter_mut().zip(xb) {
                        *q = q8(v * id);
                        sum += i32::from(*q);
                    }
                    *d = dd;
                    *s = dd * sum as f32;
                }
            }
            ActKind::Q8K => {
                grow(&mut self.qs, len);
                grow(&mut self.d, len / 256);
                grow(&mut self.bs, len / 16);
                let it = x
                    .chunks_exact(256)
                    .zip(self.qs.chunks_exact_mut(256))
                    .zip(self.d.iter_mut().zip(self.bs.chunks_exact_mut(16)));
                for ((xb, qb), (d, bs)) in it {
                    let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
                    let dd = amax / 127.0;
                    let id = if dd > 0.0 { 1.0 / dd } else { 0.0 };
                    for ((x16, q16), b) in xb.chunks_exact(16).zip(qb.chunks_exact_mut(16)).zip(bs)
                    {
                        let mut sum = 0i16;
                        for (q, v) in q16.iter_mut().zip(x16) {
                            *q = q8(v * id);
                            sum += i16::from(*q);
                        }
                        *b = sum;
                    }
                    *d = dd;
                }
            }
        }
    }

    /// Token `t`'s view (`x` is the same f32 input `fill` took); `None` when
    /// `t` is past the filled tokens.
    pub(super) fn token<'a>(&'a self, x: &'a [f32], t: usize) -> Option<Act<'a>> {
        if t >= self.n {
            return None;
        }
        let c = self.cols;
        let xs = x.get(t * c..(t + 1) * c)?;
        let none = Act {
            qs: &[],
            d: &[],
            s: &[],
            bs: &[],
            x: xs,
        };
        Some(match self.kind? {
            ActKind::F32 => none,
            ActKind::Q8 => Act {
                qs: self.qs.get(t * c..(t + 1) * c)?,
                d: self.d.get(t * c / 32..(t + 1) * c / 32)?,
                s: self.s.get(t * c / 32..(t + 1) * c / 32)?,
                ..none
            },
            ActKind::Q8K => Act {
                qs: self.qs.get(t * c..(t + 1) * c)?,
                d: self.d.get(t * c / 256..(t + 1) * c / 256)?,
                bs: self.bs.get(t * c / 16..(t + 1) * c / 16)?,
                ..none
            },
        })
    }
}
