//! Activation quantization: each weight type's dot takes its activations in
//! the block form GGML pairs with it, quantized once per call for all rows.
//!
//! - 32-value weights (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL): Q8 blocks of 32 int8
//!   with an f32 scale `d = max|x| / 127`, `s = d · Σq` (the block sum the
//!   Q4_1/Q5_1 min term needs; Q8_1-style) and Σq itself (what the lanes
//!   kernels take off for their weights' unsigned offset).
//! - 256-value weights (Q2_K..Q6_K, Q8_K, IQ4_XS): Q8_K blocks of 256 int8, one f32
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
            GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Q8_0
            | GgmlType::IQ4_NL => ActKind::Q8,
            GgmlType::Q2_K
            | GgmlType::Q3_K
            | GgmlType::Q4_K
            | GgmlType::Q5_K
            | GgmlType::Q6_K
            | GgmlType::Q8_K
            | GgmlType::IQ4_XS => ActKind::Q8K,
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
    /// Q8K: Σq per 16 values; Q8: Σq per 32-block.
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

/// Quantizes one block `xb` into `qb` with `d = max|x| / 127`, returns `d`
/// and puts Σq of each 16 values in `sums`.
fn block(xb: &[f32], qb: &mut [i8], sums: &mut [i32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if offgraph_kv::cpu::features().avx2 {
        // SAFETY: the CPU has AVX2 (checked just above).
        if let Some(amax) = unsafe { super::act_x86::amax(xb) } {
            let (dd, id) = scale(amax);
            // SAFETY: as above.
            unsafe { super::act_x86::quantize(xb, qb, id, sums) };
            return dd;
        }
    }
    block_scalar(xb, qb, sums)
}

fn scale(amax: f32) -> (f32, f32) {
    let dd = amax / 127.0;
    (dd, if dd > 0.0 { 1.0 / dd } else { 0.0 })
}

fn block_scalar(xb: &[f32], qb: &mut [i8], sums: &mut [i32]) -> f32 {
    let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
    let (dd, id) = scale(amax);
    for ((x16, q16), s) in xb.chunks(16).zip(qb.chunks_mut(16)).zip(sums.iter_mut()) {
        let mut sum = 0i32;
        for (q, v) in q16.iter_mut().zip(x16) {
            *q = q8(v * id);
            sum += i32::from(*q);
        }
        *s = sum;
    }
    dd
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
                grow(&mut self.bs, len / 32);
                let it = x
                    .chunks_exact(32)
                    .zip(self.qs.chunks_exact_mut(32))
                    .zip(self.d.iter_mut().zip(self.s.iter_mut()))
                    .zip(self.bs.iter_mut());
                for (((xb, qb), (d, s)), bs) in it {
                    let mut sums = [0i32; 2];
                    let dd = block(xb, qb, &mut sums);
                    *d = dd;
                    *s = dd * (sums[0] + sums[1]) as f32;
                    // |Σ| of 32 quants is at most 4064.
                    *bs = (sums[0] + sums[1]) as i16;
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
                    let mut sums = [0i32; 16];
                    *d = block(xb, qb, &mut sums);
                    for (b, s) in bs.iter_mut().zip(sums) {
                        // |Σ| of 16 quants is at most 2032.
                        *b = s as i16;
                    }
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
                bs: self.bs.get(t * c / 32..(t + 1) * c / 32)?,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The vector quantization gives the scalar code's quants, scale and
    /// sums bit for bit, ties and non-finite blocks included.
    #[test]
    fn vector_and_scalar_blocks_agree() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut checked = 0;
        for case in 0..2000 {
            let len = if case % 2 == 0 { 32 } else { 256 };
            let mut x: Vec<f32> = (0..len)
                .map(|_| ((next() % 20001) as f32 - 10000.0) / 37.0)
                .collect();
            // Values whose quant is exactly half-way (amax 127 gives id 1).
            if case % 3 == 0 {
                for (i, v) in x.iter_mut().enumerate() {
                    *v = (i as f32 - 60.0) + 0.5;
                }
                if let Some(v) = x.first_mut() {
                    *v = 127.0;
                }
            }
            if case % 7 == 0 {
                if let Some(v) = x.get_mut(case % len) {
                    *v = if case % 2 == 0 {
                        f32::NAN
                    } else {
                        f32::INFINITY
                    };
                }
            }
            if case % 11 == 0 {
                x.iter_mut().for_each(|v| *v = 0.0);
            }
            let (mut qa, mut qb) = (vec![0i8; len], vec![0i8; len]);
            let (mut sa, mut sb) = (vec![0i32; len / 16], vec![0i32; len / 16]);
            let da = block(&x, &mut qa, &mut sa);
            let db = block_scalar(&x, &mut qb, &mut sb);
            assert_eq!(da.to_bits(), db.to_bits(), "case {case}");
            assert_eq!(qa, qb, "case {case}");
            assert_eq!(sa, sb, "case {case}");
            checked += 1;
        }
        println!("{checked} blocks agree");
    }
}
