//! q8_0 key scores by integer dot products on AVX2 (`vpmaddubsw`), as GGML's
//! AVX2 q8_0 dot does: q is quantized once per block to Q8_0 blocks (32 int8
//! and an f32 scale per 32 values), and each key block's dot with each query
//! row is an int32 sum, scaled once by `d_k · d_q`.
//!
//! `vpmaddubsw` multiplies unsigned by signed bytes: the key bytes enter as
//! `|k|` (unsigned; -128 becomes 128) and the query bytes take the key's sign
//! (`vpsignb`), so each product is `k · q`; a pair of them is at most
//! 2 · 128 · 127 = 32,512 in magnitude, inside int16. `vpmaddwd` by ones sums
//! the pairs to int32.

use std::arch::x86_64::*;

/// Bytes of one quantized query row: `hd` int8, then `hd / 32` f32 scales.
#[inline(always)]
pub(super) fn row_stride(hd: usize) -> usize {
    hd + hd / 32 * 4
}

/// Quantizes `nr` query rows of `hd` (a multiple of 32) into `out`: per 32
/// values `d = max|x| / 127` and `round(x / d)`, GGML's Q8_0 with the scale
/// kept in f32 (q arrives pre-scaled by the softmax scale, so a float16 `d`
/// would make the rounding depend on it).
///
/// # Safety
/// `qs` holds `nr * hd` floats; `out` `nr * row_stride(hd) <= 4 * nr * hd` bytes.
#[inline(always)]
pub(super) unsafe fn quantize(qs: *const f32, nr: usize, hd: usize, out: *mut u8) {
    for i in 0..nr {
        // SAFETY: row i of qs; row i of out per the layout above.
        unsafe {
            let x = std::slice::from_raw_parts(qs.add(i * hd), hd);
            let row = out.add(i * row_stride(hd));
            let q = std::slice::from_raw_parts_mut(row.cast::<i8>(), hd);
            super::q8_query::quantize_blocks(x, q, row.add(hd).cast::<f32>());
        }
    }
}

/// `out[i * 2 + jj]` = q row `i < R` (quantized by [`quantize`]) · q8_0 key
/// row `kp[jj]`, `jj < 2`, both of `hd` (a multiple of 32) values.
///
/// # Safety
/// As `Simd::q8_dots`; AVX2, FMA and F16C.
#[inline(always)]
pub(super) unsafe fn dots<const R: usize>(
    q8: *const u8,
    kp: &[*const u8; 4],
    hd: usize,
    out: &mut [f32; 16],
) {
    // SAFETY (whole fn): offsets stay inside the rows per the layouts above.
    unsafe {
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); 16];
        let stride = row_stride(hd);
        for b in 0..hd / 32 {
            let qv: [__m256i; R] =
                core::array::from_fn(|i| _mm256_loadu_si256(q8.add(i * stride + b * 32).cast()));
            let dq: [f32; R] = core::array::from_fn(|i| {
                q8.add(i * stride + hd + b * 4)
                    .cast::<f32>()
                    .read_unaligned()
            });
            for (jj, k) in kp.iter().take(2).enumerate() {
                let blk = k.add(b * 34);
                let kv = _mm256_loadu_si256(blk.add(2).cast());
                let dk = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(
                    blk.cast::<u16>().read_unaligned() as i32,
                )));
                let ak = _mm256_sign_epi8(kv, kv);
                for i in 0..R {
                    let p = _mm256_maddubs_epi16(ak, _mm256_sign_epi8(qv[i], kv));
                    let dot = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones));
                    let a = &mut acc[i * 2 + jj];
                    *a = _mm256_fmadd_ps(dot, _mm256_set1_ps(dk * dq[i]), *a);
                }
            }
        }
        super::hsum::hsum8(&acc, out);
    }
}
