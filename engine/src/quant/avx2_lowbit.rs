//! AVX2 dots for the low-bit types (layouts in `lowbit`; see `avx2` for the
//! byte arithmetic and when these may run). The VNNI path runs these too.
//!
//! Q2_K and Q3_K: unsigned quants (Q3_K's as `q + 4` in 0..8) times the
//! activations by `vpmaddubsw`, an int16 scale per 16 values by `vpmaddwd`;
//! Q2_K's mins and Q3_K's offset of 4 come off once per super-block from
//! the activations' 16-value sums. IQ4_NL and IQ4_XS: the 4-bit indices
//! looked up in the table by `vpshufb`, the signed values entering as `|w|`
//! with the activation taking `w`'s sign (a pair at most 2 · 127 · 127).

use super::act::Act;
use super::lowbit::IQ4_TABLE;
use super::simd::{dot_us, half_at, hsum};
use std::arch::x86_64::*;

/// Sub-block `j`'s and `j + 1`'s int16 scales in the low and high lanes.
#[inline(always)]
unsafe fn lane_scales(lo: i16, hi: i16) -> __m256i {
    // SAFETY: register-only AVX2 arithmetic.
    unsafe { _mm256_set_m128i(_mm_set1_epi16(hi), _mm_set1_epi16(lo)) }
}

/// Q2_K (`THREE` false) and Q3_K super-blocks.
#[inline(always)]
pub(super) unsafe fn q23k<const T: usize, const THREE: bool>(
    row: &[u8],
    a: &[Act<'_>; T],
    cols: usize,
) -> [f32; T] {
    let bb = if THREE { 110 } else { 84 };
    // SAFETY (whole fn): super-block `b` is at `b * bb` (`simd::check`);
    // each token has `cols` quants, `cols / 256` scales, `cols / 16` sums.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); T];
        let mut corr = [0f32; T];
        let three = _mm256_set1_epi8(3);
        let one = _mm256_set1_epi8(1);
        for b in 0..cols / 256 {
            let p = row.as_ptr().add(b * bb);
            // Ahead by a few super-blocks (see `avx2::q32`).
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(4 * bb).cast());
            // Per 16 values: the multiplier and what comes off per unit of Σa.
            let (qs, d, dmin, sc, off) = if THREE {
                let raw = super::lowbit::q3k_scales(core::slice::from_raw_parts(p.add(96), 12));
                (
                    p.add(32),
                    half_at(p.add(108)),
                    0.0,
                    raw.map(i16::from),
                    raw.map(i16::from),
                )
            } else {
                let raw: [u8; 16] = p.cast::<[u8; 16]>().read_unaligned();
                let sc = raw.map(|s| i16::from(s & 0x0f));
                let mn = raw.map(|s| i16::from(s >> 4));
                (p.add(16), half_at(p.add(80)), half_at(p.add(82)), sc, mn)
            };
            let hm = if THREE {
                _mm256_loadu_si256(p.cast())
            } else {
                _mm256_setzero_si256()
            };
            let mut iacc = [_mm256_setzero_si256(); T];
            for h in 0..2 {
                let raw = _mm256_loadu_si256(qs.add(h * 32).cast());
                for s in 0..4 {
                    let sh = _mm_cvtsi32_si128(2 * s as i32);
                    let mut q = _mm256_and_si256(_mm256_srl_epi16(raw, sh), three);
                    if THREE {
                        // Bit h·4 + s of mask byte l: a set bit adds the 4 back.
                        let hs = _mm_cvtsi32_si128((h * 4 + s) as i32);
                        let bit = _mm256_and_si256(_mm256_srl_epi16(hm, hs), one);
                        q = _mm256_or_si256(q, _mm256_slli_epi16(bit, 2));
                    }
                    let j = h * 8 + s * 2;
                    let m = lane_scales(*sc.get_unchecked(j), *sc.get_unchecked(j + 1));
                    for t in 0..T {
                        let y = a.get_unchecked(t).qs.as_ptr().add(b * 256 + j * 16);
                        let pr = _mm256_madd_epi16(
                            _mm256_maddubs_epi16(q, _mm256_loadu_si256(y.cast())),
                            m,
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
                for (j, o) in off.iter().enumerate() {
                    m += i32::from(*bs.add(j)) * i32::from(*o);
                }
                *corr.get_unchecked_mut(t) += if THREE {
                    d * da * (4 * m) as f32
                } else {
                    dmin * da * m as f32
                };
                let acc_t = acc.get_unchecked_mut(t);
                let v = _mm256_cvtepi32_ps(*iacc.get_unchecked(t));
                *acc_t = _mm256_fmadd_ps(_mm256_set1_ps(d * da), v, *acc_t);
            }
        }
        core::array::from_fn(|t| hsum(*acc.get_unchecked(t)) - *corr.get_unchecked(t))
    }
}

/// The 32 table values of the 16 index bytes at `p` (values 0..16 from the
/// low nibbles in the low lane, 16..32 from the high nibbles in the high).
#[inline(always)]
unsafe fn iq4_values(p: *const u8, table: __m256i) -> __m256i {
    // SAFETY: the caller's 16 bytes at `p`.
    unsafe {
        let b = _mm_loadu_si128(p.cast());
        let idx = _mm256_and_si256(
            _mm256_set_m128i(_mm_srli_epi16(b, 4), b),
            _mm256_set1_epi8(0x0f),
        );
        _mm256_shuffle_epi8(table, idx)
    }
}

/// The table in both lanes, for `vpshufb`.
#[inline(always)]
unsafe fn iq4_table() -> __m256i {
    // SAFETY: reads the 16-byte constant.
    unsafe { _mm256_broadcastsi128_si256(_mm_loadu_si128(IQ4_TABLE.as_ptr().cast())) }
}

/// IQ4_NL blocks (18 bytes, 32 values) against Q8 activations.
#[inline(always)]
pub(super) unsafe fn iq4nl<const T: usize>(row: &[u8], a: &[Act<'_>; T], cols: usize) -> [f32; T] {
    // SAFETY (whole fn): block `b` is at `b * 18` (`simd::check`); each
    // token has `cols` quants and `cols / 32` scales.
    unsafe {
        let table = iq4_table();
        let mut acc = [_mm256_setzero_ps(); T];
        for b in 0..cols / 32 {
            let p = row.as_ptr().add(b * 18);
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(16 * 18).cast());
            let dw = half_at(p);
            let w = iq4_values(p.add(2), table);
            let wa = _mm256_sign_epi8(w, w);
            for t in 0..T {
                let at = a.get_unchecked(t);
                let y = _mm256_loadu_si256(at.qs.as_ptr().add(b * 32).cast());
                let s = _mm256_cvtepi32_ps(dot_us(wa, _mm256_sign_epi8(y, w)));
                let acc_t = acc.get_unchecked_mut(t);
                *acc_t = _mm256_fmadd_ps(_mm256_set1_ps(dw * *at.d.get_unchecked(b)), s, *acc_t);
            }
        }
        core::array::from_fn(|t| hsum(*acc.get_unchecked(t)))
    }
}

/// IQ4_XS super-blocks (136 bytes) against Q8_K activations.
#[inline(always)]
pub(super) unsafe fn iq4xs<const T: usize>(row: &[u8], a: &[Act<'_>; T], cols: usize) -> [f32; T] {
    // SAFETY (whole fn): super-block `b` is at `b * 136` (`simd::check`);
    // each token has `cols` quants and `cols / 256` scales.
    unsafe {
        let table = iq4_table();
        let mut acc = [_mm256_setzero_ps(); T];
        for b in 0..cols / 256 {
            let p = row.as_ptr().add(b * 136);
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(4 * 136).cast());
            let d = half_at(p);
            let sc = super::lowbit::iq4xs_scales(core::slice::from_raw_parts(p, 8));
            let mut iacc = [_mm256_setzero_si256(); T];
            for (j, &s) in sc.iter().enumerate() {
                let w = iq4_values(p.add(8 + j * 16), table);
                let wa = _mm256_sign_epi8(w, w);
                let m = _mm256_set1_epi32(i32::from(s));
                for t in 0..T {
                    let y = a.get_unchecked(t).qs.as_ptr().add(b * 256 + j * 32);
                    let y = _mm256_sign_epi8(_mm256_loadu_si256(y.cast()), w);
                    let ia = iacc.get_unchecked_mut(t);
                    *ia = _mm256_add_epi32(*ia, _mm256_mullo_epi32(dot_us(wa, y), m));
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
