//! AVX-512 VNNI dots for Q4_K and Q6_K (see `vnni` for when they may run).
//!
//! As the AVX2 kernels (`avx2_k`), with the per-super-block scalar work
//! vectorized: the packed 6-bit scales and mins unpacked with 32-bit word
//! masks, each sub-block's scale taken from one register by a byte shuffle
//! (Q4_K) or word permute (Q6_K) instead of a scalar broadcast, the mins
//! and the Q6_K offset term as one `vpmaddwd` over the activations' 16-value
//! sums, and `vpdpwssd` applying the scale and accumulating in one step.

use super::act::Act;
use super::simd::{half_at, hsum};
use std::arch::x86_64::*;

/// Σ of the eight int32 lanes.
#[inline(always)]
unsafe fn hsum_i32(v: __m256i) -> i32 {
    // SAFETY: register-only AVX2 arithmetic.
    unsafe {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
        _mm_cvtsi128_si32(s)
    }
}

/// The eight scales and eight mins of a Q4_K super-block's 12 packed bytes
/// (the layout `unpack::scale_min_k4` documents), each as 8 bytes.
#[inline(always)]
fn scale_min_words(p: [u8; 12]) -> (u64, u64) {
    let [a, b, c, d, e, f, g, h, i, j, k, l] = p;
    let (w0, w1, w2) = (
        u32::from_le_bytes([a, b, c, d]),
        u32::from_le_bytes([e, f, g, h]),
        u32::from_le_bytes([i, j, k, l]),
    );
    let sc_lo = w0 & 0x3f3f_3f3f;
    let mn_lo = w1 & 0x3f3f_3f3f;
    let sc_hi = (w2 & 0x0f0f_0f0f) | (((w0 >> 6) & 0x0303_0303) << 4);
    let mn_hi = ((w2 >> 4) & 0x0f0f_0f0f) | (((w1 >> 6) & 0x0303_0303) << 4);
    (
        u64::from(sc_lo) | (u64::from(sc_hi) << 32),
        u64::from(mn_lo) | (u64::from(mn_hi) << 32),
    )
}

/// Q4_K super-blocks.
#[inline(always)]
pub(super) unsafe fn q4k<const T: usize>(row: &[u8], a: &[Act<'_>; T], cols: usize) -> [f32; T] {
    // SAFETY (whole fn): super-block `b` is at `b * 144` (`avx2::check`);
    // each token has `cols` quants, `cols / 256` scales, `cols / 16` sums.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); T];
        let mut mins = [0f32; T];
        let low = _mm256_set1_epi8(0x0f);
        for b in 0..cols / 256 {
            let p = row.as_ptr().add(b * 144);
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(4 * 144).cast());
            let (d, dmin) = (half_at(p), half_at(p.add(2)));
            let (sc, mn) = scale_min_words(p.add(4).cast::<[u8; 12]>().read_unaligned());
            // Scales as int16 in both lanes; mins as int16, each twice.
            let sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc as i64)));
            let m = _mm_cvtsi64_si128(mn as i64);
            let mn16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m, m));
            let qs = p.add(16);
            let mut iacc = [_mm256_setzero_si256(); T];
            for c in 0..4 {
                let raw = _mm256_loadu_si256(qs.add(c * 32).cast());
                let lo = _mm256_and_si256(raw, low);
                let hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
                let j0 = ((4 * c as i16 + 1) << 8) | (4 * c as i16);
                let s0 = _mm256_shuffle_epi8(sc16, _mm256_set1_epi16(j0));
                let s1 = _mm256_shuffle_epi8(sc16, _mm256_set1_epi16(j0 + 0x0202));
                for t in 0..T {
                    let y = a.get_unchecked(t).qs.as_ptr().add(b * 256 + c * 64);
                    let y0 = _mm256_loadu_si256(y.cast());
                    let y1 = _mm256_loadu_si256(y.add(32).cast());
                    let ia = iacc.get_unchecked_mut(t);
                    *ia = _mm256_dpwssd_epi32(*ia, _mm256_maddubs_epi16(lo, y0), s0);
                    *ia = _mm256_dpwssd_epi32(*ia, _mm256_maddubs_epi16(hi, y1), s1);
                }
            }
            for t in 0..T {
                let at = a.get_unchecked(t);
                let da = *at.d.get_unchecked(b);
                let bs = _mm256_loadu_si256(at.bs.as_ptr().add(b * 16).cast());
                let m = hsum_i32(_mm256_madd_epi16(bs, mn16));
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
    // SAFETY (whole fn): as `q4k`, with 210-byte super-blocks.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); T];
        let mut corr = [0f32; T];
        let low = _mm256_set1_epi8(0x0f);
        let three = _mm256_set1_epi8(3);
        for b in 0..cols / 256 {
            let p = row.as_ptr().add(b * 210);
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(4 * 210).cast());
            let d = half_at(p.add(208));
            let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(192).cast()));
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
                    // Low lane scale i, high lane scale i + 1.
                    let i = (h * 8 + k * 2) as i16;
                    let idx = _mm256_set_m128i(_mm_set1_epi16(i + 1), _mm_set1_epi16(i));
                    let s = _mm256_permutexvar_epi16(idx, sc16);
                    for t in 0..T {
                        let y = a
                            .get_unchecked(t)
                            .qs
                            .as_ptr()
                            .add(b * 256 + h * 128 + k * 32);
                        let pr = _mm256_maddubs_epi16(*q, _mm256_loadu_si256(y.cast()));
                        let ia = iacc.get_unchecked_mut(t);
                        *ia = _mm256_dpwssd_epi32(*ia, pr, s);
                    }
                }
            }
            for t in 0..T {
                let at = a.get_unchecked(t);
                let da = *at.d.get_unchecked(b);
                let bs = _mm256_loadu_si256(at.bs.as_ptr().add(b * 16).cast());
                let m = hsum_i32(_mm256_madd_epi16(bs, sc16));
                *corr.get_unchecked_mut(t) += d * da * (32 * m) as f32;
                let acc_t = acc.get_unchecked_mut(t);
                let v = _mm256_cvtepi32_ps(*iacc.get_unchecked(t));
                *acc_t = _mm256_fmadd_ps(_mm256_set1_ps(d * da), v, *acc_t);
            }
        }
        core::array::from_fn(|t| hsum(*acc.get_unchecked(t)) - *corr.get_unchecked(t))
    }
}
