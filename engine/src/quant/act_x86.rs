//! AVX2 activation quantization: the same f32 operations as the scalar code
//! in `act` (max of |x|, `x · (1/d)`, rounding half away from zero, clamp),
//! so the quants and sums are bit-identical to it; a block holding a NaN or
//! an infinity is left to the scalar code (the vector max orders NaN
//! differently).

use std::arch::x86_64::*;

/// max |x| over `x` (a multiple of 8 values); `None` when one is not finite.
///
/// # Safety
/// The CPU has AVX2.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn amax(x: &[f32]) -> Option<f32> {
    let (chunks, rest) = x.as_chunks::<8>();
    if !rest.is_empty() {
        return None;
    }
    // SAFETY: 8 floats a chunk; register-only arithmetic.
    unsafe {
        let sign = _mm256_set1_ps(-0.0);
        let inf = _mm256_set1_ps(f32::INFINITY);
        let mut m = _mm256_setzero_ps();
        let mut bad = _mm256_setzero_ps();
        for c in chunks {
            let a = _mm256_andnot_ps(sign, _mm256_loadu_ps(c.as_ptr()));
            bad = _mm256_or_ps(bad, _mm256_cmp_ps::<_CMP_NLT_UQ>(a, inf));
            m = _mm256_max_ps(m, a);
        }
        if _mm256_movemask_ps(bad) != 0 {
            return None;
        }
        let s = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        let s = _mm_max_ps(s, _mm_movehl_ps(s, s));
        Some(_mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s))))
    }
}

/// `round(v · id)` half away from zero, clamped to ±127, as int32 lanes.
#[inline(always)]
unsafe fn q8x8(p: *const f32, id: __m256) -> __m256i {
    // SAFETY: the caller's 8 floats at `p`; AVX2 per the caller.
    unsafe {
        let v = _mm256_mul_ps(_mm256_loadu_ps(p), id);
        let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(v);
        let sign = _mm256_set1_ps(-0.0);
        let frac = _mm256_andnot_ps(sign, _mm256_sub_ps(v, t));
        let up = _mm256_cmp_ps::<_CMP_GE_OQ>(frac, _mm256_set1_ps(0.5));
        let one = _mm256_or_ps(_mm256_and_ps(v, sign), _mm256_set1_ps(1.0));
        let r = _mm256_add_ps(t, _mm256_and_ps(up, one));
        let r = _mm256_min_ps(
            _mm256_max_ps(r, _mm256_set1_ps(-127.0)),
            _mm256_set1_ps(127.0),
        );
        _mm256_cvttps_epi32(r)
    }
}

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

/// Quantizes `x` into `q` (same length, a multiple of 32) with `1/d = id`;
/// `sums[k]` takes Σq of values `16k..16k+16` (as many as `sums` holds).
///
/// # Safety
/// The CPU has AVX2.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn quantize(x: &[f32], q: &mut [i8], id: f32, sums: &mut [i32]) {
    let idv = _mm256_set1_ps(id);
    let (xc, _) = x.as_chunks::<32>();
    let (qc, _) = q.as_chunks_mut::<32>();
    let mut sums = sums.chunks_exact_mut(2);
    for (xb, qb) in xc.iter().zip(qc.iter_mut()) {
        // SAFETY: 32 floats in `xb`, 32 bytes in `qb`.
        unsafe {
            let p = xb.as_ptr();
            let (a, b) = (q8x8(p, idv), q8x8(p.add(8), idv));
            let (c, d) = (q8x8(p.add(16), idv), q8x8(p.add(24), idv));
            let packed = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
            let ordered =
                _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256(qb.as_mut_ptr().cast(), ordered);
            if let Some([lo, hi]) = sums.next() {
                *lo = hsum_i32(_mm256_add_epi32(a, b));
                *hi = hsum_i32(_mm256_add_epi32(c, d));
            }
        }
    }
}
