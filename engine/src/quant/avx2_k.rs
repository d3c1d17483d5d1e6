//! AVX2 dots for the 256-value K types against Q8_K activations (see
//! `avx2` for the arithmetic and when these may run).
//!
//! Q4_K/Q5_K: unsigned quants, a 6-bit scale per 32 values applied as an
//! int16 multiplier in `vpmaddwd`, the mins folded in once per super-block
//! from the activations' 16-value sums. Q6_K: unsigned 6-bit quants (0..63,
//! a pair at most 2 · 63 · 127 = 16,002), an int8 scale per 16 values, the
//! −32 offset subtracted as 32 · Σ scale · sum.

use super::act::Act;
use super::simd::{dot_us, half_at, hsum};
use super::unpack::scale_min_k4;
use std::arch::x86_64::*;

/// Q4_K (`FIVE` false) and Q5_K super-blocks.
#[inline(always)]
pub(super) unsafe fn q45k<const T: usize, const FIVE: bool>(
    row: &[u8],
    a: &[Act<'_>; T],
    cols: usize,
) -> [f32; T] {
    let bb = if FIVE { 176 } else { 144 };
    // SAFETY (whole fn): super-block `b` is at `b * bb` (`avx2::check`);
    // each token has `cols` quants, `cols / 256` scales, `cols / 16` sums.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); T];
        let mut mins = [0f32; T];
        let low = _mm256_set1_epi8(0x0f);
        for b in 0..cols / 256 {
            let p = row.as_ptr().add(b * bb);
            // Ahead by a few super-blocks (see `avx2::q32`).
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(4 * bb).cast());
            let (d, dmin) = (half_at(p), half_at(p.add(2)));
            let sb: [u8; 12] = p.add(4).cast::<[u8; 12]>().read_unaligned();
            let (sc, mn) = scale_min_k4(&sb);
            let qs = p.add(if FIVE { 48 } else { 16 });
            let qh = if FIVE {
                _mm256_loadu_si256(p.add(16).cast())
            } else {
                _mm256_setzero_si256()
            };
            let mut iacc = [_mm256_setzero_si256(); T];
            for c in 0..4 {
                let raw = _mm256_loadu_si256(qs.add(c * 32).cast());
                let mut lo = _mm256_and_si256(raw, low);
                let mut hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
                if FIVE {
                    // Bit j of qh byte l is bit 4 of value l of sub-block j.
                    let one = _mm256_set1_epi8(1);
                    let j = _mm_cvtsi32_si128(2 * c as i32);
                    let h0 = _mm256_and_si256(_mm256_srl_epi16(qh, j), one);
                    let j1 = _mm_cvtsi32_si128(2 * c as i32 + 1);
                    let h1 = _mm256_and_si256(_mm256_srl_epi16(qh, j1), one);
                    lo = _mm256_or_si256(lo, _mm256_slli_epi16(h0, 4));
                    hi = _mm256_or_si256(hi, _mm256_slli_epi16(h1, 4));
                }
                let s0 = _mm256_set1_epi16(i16::from(*sc.get_unchecked(2 * c)));
                let s1 = _mm256_set1_epi16(i16::from(*sc.get_unchecked(2 * c + 1)));
                for t in 0..T {
                    let y = a.get_unchecked(t).qs.as_ptr().add(b * 256 + c * 64);
                    let y0 = _mm256_loadu_si256(y.cast());
                    let y1 = _mm256_loadu_si256(y.add(32).cast());
                    let p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, y0), s0);
                    let p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, y1), s1);
                    let ia = iacc.get_unchecked_mut(t);
                    *ia = _mm256_add_epi32(*ia, _mm256_add_epi32(p0, p1));
                }
            }
            for t in 0..T {
                let at = a.get_unchecked(t);
                let da = *at.d.get_unchecked(b);
                let bs = at.bs.as_ptr().add(b * 16);
                let mut m = 0i32;
                for j in 0..8 {
                    let s = i32::from(*bs.add(2 * j)) + i32::from(*bs.add(2 * j + 1));
                    m += s * i32::from(*mn.get_unchecked(j));
                }
                *mins.get_unchecked_mut(t) += dmin * da * m as f32;
                let acc_t = acc.get_unchecked_mut(t);
                let v = _mm256_cvtepi32_ps(*iacc.get_unchecked(t));
                *acc_t = _mm256_fmadd_ps(_mm256_set1_ps(d * da), v, *acc_t);
            }
        }
        core::array::from_fn(|t| hsum(*acc.get_unchecked(t)) - *mins.get_unchecked(t))
    }
}

/// Q6_K super-blocks.
#[inline(always)]
pub(super) unsafe fn q6k<const T: usize>(row: &[u8], a: &[Act<'_>; T], cols: usize) -> [f32; T] {
    // SAFETY (whole fn): as `q45k`, with 210-byte super-blocks.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); T];
        let mut corr = [0f32; T];
        let low = _mm256_set1_epi8(0x0f);
        let three = _mm256_set1_epi8(3);
        for b in 0..cols / 256 {
            let p = row.as_ptr().add(b * 210);
            // Ahead by a few super-blocks (see `avx2::q32`).
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(4 * 210).cast());
            let d = half_at(p.add(208));
            let sc: [i8; 16] = p.add(192).cast::<[i8; 16]>().read_unaligned();
            let mut iacc = [_mm256_setzero_si256(); T];
            for h in 0..2 {
                let ql0 = _mm256_loadu_si256(p.add(h * 64).cast());
                let ql1 = _mm256_loadu_si256(p.add(h * 64 + 32).cast());
                let qh = _mm256_loadu_si256(p.add(128 + h * 32).cast());
                let hb = |s: i32| {
                    let v = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(s));
                    _mm256_slli_epi16(_mm256_and_si256(v, three), 4)
                };
                let q = [
                    _mm256_or_si256(_mm256_and_si256(ql0, low), hb(0)),
                    _mm256_or_si256(_mm256_and_si256(ql1, low), hb(2)),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low), hb(4)),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low), hb(6)),
                ];
                for (k, q) in q.iter().enumerate() {
                    let i = h * 8 + k * 2;
                    let s = _mm256_set_m128i(
                        _mm_set1_epi16(i16::from(*sc.get_unchecked(i + 1))),
                        _mm_set1_epi16(i16::from(*sc.get_unchecked(i))),
                    );
                    for t in 0..T {
                        let y = a
                            .get_unchecked(t)
                            .qs
                            .as_ptr()
                            .add(b * 256 + h * 128 + k * 32);
                        let pr = _mm256_madd_epi16(
                            _mm256_maddubs_epi16(*q, _mm256_loadu_si256(y.cast())),
                            s,
                        );
                        let ia = iacc.get_unchecked_mut(t);
                        *ia = _mm256_add_epi32(*ia, pr);
                    }
                }
            }
            for t in 0..T {
                let at = a.get_unchecked(t);
                let da = *at.d.get_unchecked(b);
                let bs = at.bs.as_ptr().add(b * 16);
                let mut m = 0i32;
                for (j, s) in sc.iter().enumerate() {
                    m += i32::from(*bs.add(j)) * i32::from(*s);
                }
                *corr.get_unchecked_mut(t) += d * da * (32 * m) as f32;
                let acc_t = acc.get_unchecked_mut(t);
                let v = _mm256_cvtepi32_ps(*iacc.get_unchecked(t));
                *acc_t = _mm256_fmadd_ps(_mm256_set1_ps(d * da), v, *acc_t);
            }
        }
        core::array::from_fn(|t| hsum(*acc.get_unchecked(t)) - *corr.get_unchecked(t))
    }
}

/// Q8_K weights (f32 scale, 256 int8).
#[inline(always)]
pub(super) unsafe fn q8k<const T: usize>(row: &[u8], a: &[Act<'_>; T], cols: usize) -> [f32; T] {
    // SAFETY (whole fn): as `q45k`, with 292-byte super-blocks.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); T];
        for b in 0..cols / 256 {
            let p = row.as_ptr().add(b * 292);
            // Ahead by a few super-blocks (see `avx2::q32`).
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(4 * 292).cast());
            let d = p.cast::<f32>().read_unaligned();
            let mut iacc = [_mm256_setzero_si256(); T];
            for c in 0..8 {
                let q = _mm256_loadu_si256(p.add(4 + c * 32).cast());
                let qa = _mm256_sign_epi8(q, q);
                for t in 0..T {
                    let y = _mm256_loadu_si256(
                        a.get_unchecked(t).qs.as_ptr().add(b * 256 + c * 32).cast(),
                    );
                    let ia = iacc.get_unchecked_mut(t);
                    *ia = _mm256_add_epi32(*ia, dot_us(qa, _mm256_sign_epi8(y, q)));
                }
            }
            for t in 0..T {
                let da = *a.get_unchecked(t).d.get_unchecked(b);
                let acc_t = acc.get_unchecked_mut(t);
                let v = _mm256_cvtepi32_ps(*iacc.get_unchecked(t));
                *acc_t = _mm256_fmadd_ps(_mm256_set1_ps(d * da), v, *acc_t);
            }
        }
        core::array::from_fn(|t| hsum(*acc.get_unchecked(t)))
    }
}
