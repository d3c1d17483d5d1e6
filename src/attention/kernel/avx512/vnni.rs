//! q8_0 key scores by integer dot products (AVX-512 VNNI `vpdpbusd`), as GGML
//! does: q is quantized once per block to Q8_0 blocks (32 int8 and a scale
//! per 32 values), and each key block's dot is an int32 sum.
//!
//! `vpdpbusd` multiplies unsigned by signed bytes. Keys are signed, so each
//! key byte is flipped to `k + 128` (xor 0x80, unsigned) and the excess
//! `128 · Σ q` of every 4-byte group is taken off by starting the int32
//! accumulator at `-128 · Σ q` (precomputed per query row, once).

use std::arch::x86_64::*;

/// Bytes of one quantized query row in the [`quantize`] layout: `hd` int8,
/// then `hd / 32` f32 scales, then per 64 values one `__m512i` of corrections.
#[inline(always)]
pub(super) fn row_stride(hd: usize) -> usize {
    hd + hd / 32 * 4 + hd / 64 * 64
}

/// Quantizes `nr` query rows of `hd` (a multiple of 64) into `out`: per 32
/// values `d = max|x| / 127` and `round(x / d)`, GGML's Q8_0 but with the
/// scale kept in f32 (q arrives pre-scaled, so rounding d to float16 would
/// make the result depend on the softmax scale), plus the `-128 · Σ q` corrections per 4-byte group.
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
            let corr = row.add(hd + hd / 32 * 4).cast::<i32>();
            super::super::q8_query::quantize_blocks(x, q, row.add(hd).cast::<f32>());
            for (g, qg) in q.chunks_exact(4).enumerate() {
                let s: i32 = qg.iter().map(|v| *v as i32).sum();
                corr.add(g).write_unaligned(-128 * s);
            }
        }
    }
}

/// `out[i * 4 + jj]` = q row `i < R` (quantized by [`quantize`]) · q8_0 key
/// row `kp[jj]`, both of `hd` (a multiple of 64) values.
///
/// # Safety
/// As `Simd::q8_dots`; AVX-512F, BW and VNNI.
#[inline(always)]
pub(super) unsafe fn dots<const R: usize>(
    q8: *const u8,
    kp: &[*const u8; 4],
    hd: usize,
    out: &mut [f32; 16],
) {
    // SAFETY (whole fn): offsets stay inside the rows per the layouts above.
    unsafe {
        let flip = _mm512_set1_epi8(-128);
        let mut acc = [_mm512_setzero_ps(); 16];
        let stride = row_stride(hd);
        for pair in 0..hd / 64 {
            let (qo, so, co) = (pair * 64, hd + pair * 8, hd + hd / 8 + pair * 64);
            let qv: [__m512i; R] =
                core::array::from_fn(|i| _mm512_loadu_si512(q8.add(i * stride + qo).cast()));
            let cv: [__m512i; R] =
                core::array::from_fn(|i| _mm512_loadu_si512(q8.add(i * stride + co).cast()));
            // The two scales of each row's blocks, spread over lanes 0-7 and 8-15.
            let dq: [__m512; R] = core::array::from_fn(|i| {
                let s = q8.add(i * stride + so).cast::<f32>();
                _mm512_castpd_ps(_mm512_insertf64x4::<1>(
                    _mm512_castps_pd(_mm512_set1_ps(s.read_unaligned())),
                    _mm256_castps_pd(_mm256_set1_ps(s.add(1).read_unaligned())),
                ))
            });
            for (jj, k) in kp.iter().enumerate() {
                let blk = k.add(pair * 68);
                let lo = _mm256_loadu_si256(blk.add(2).cast());
                let hi = _mm256_loadu_si256(blk.add(36).cast());
                let kx = _mm512_xor_si512(
                    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi),
                    flip,
                );
                let d0 = blk.cast::<u16>().read_unaligned() as i16;
                let d1 = blk.add(34).cast::<u16>().read_unaligned() as i16;
                let dk = _mm512_cvtph_ps(_mm256_set_m128i(_mm_set1_epi16(d1), _mm_set1_epi16(d0)));
                for i in 0..R {
                    let dot = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(cv[i], kx, qv[i]));
                    let a = &mut acc[i * 4 + jj];
                    *a = _mm512_fmadd_ps(dot, _mm512_mul_ps(dk, dq[i]), *a);
                }
            }
        }
        _mm512_storeu_ps(out.as_mut_ptr(), super::hsum16(&acc));
    }
}
