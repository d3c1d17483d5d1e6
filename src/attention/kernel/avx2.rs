//! The AVX2 path: the portable kernel compiled with AVX2 and FMA enabled (its
//! fixed-width loops autovectorise and `Portable<true>`'s `mul_add` is a fused
//! multiply-add), plus the decode step over rows as stored with 8-lane
//! registers, float16 widened by F16C's `vcvtph2ps`; `Avx2<true>` scores
//! q8_0 keys by integer dot products instead (`avx2_int8.rs`).

use super::simd::{widen_rows, Simd};
use super::{run_block, Block, Isa, Portable, State, Step};
use crate::dtype::KvDtype;
use std::arch::x86_64::*;

/// The AVX2 micro-kernels; `I8`: q8_0 keys of decode blocks by integer dot
/// products (`vpmaddubsw`) instead of widening them to f32.
#[derive(Clone, Copy)]
pub(crate) struct Avx2<const I8: bool>;

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn block_avx2(b: &Block<'_>, st: &mut State<'_>) {
    // SAFETY: the caller checked avx2, fma and f16c; the block comes from a validated geometry.
    unsafe { run_block::<Avx2<false>>(b, st) }
}

/// [`block_avx2`] with q8_0 keys by integer dot products.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn block_avx2_int8(b: &Block<'_>, st: &mut State<'_>) {
    // SAFETY: the caller checked avx2, fma and f16c; the block comes from a validated geometry.
    unsafe { run_block::<Avx2<true>>(b, st) }
}

impl<const I8: bool> Isa for Avx2<I8> {
    #[inline(always)]
    unsafe fn scores(qs: *const f32, nr: usize, k: *const f32, nk: usize, hd: usize, sc: *mut f32) {
        // SAFETY: the same contract.
        unsafe { Portable::<true>::scores(qs, nr, k, nk, hd, sc) }
    }

    #[inline(always)]
    unsafe fn pv(p: *const f32, nr: usize, v: *const f32, nk: usize, hd: usize, acc: *mut f32) {
        // SAFETY: the same contract.
        unsafe { Portable::<true>::pv(p, nr, v, nk, hd, acc) }
    }

    #[inline(always)]
    fn stored_ok(nr: usize, hd: usize) -> bool {
        nr <= 4 && hd.is_multiple_of(8)
    }

    #[inline(always)]
    unsafe fn quantize_q(qs: *const f32, nr: usize, hd: usize, out: *mut u8) -> *const u8 {
        if !I8 || !hd.is_multiple_of(32) {
            return std::ptr::null();
        }
        // SAFETY: the trait contract (4 * nr * hd bytes cover the int8 layout).
        unsafe { super::avx2_int8::quantize(qs, nr, hd, out) };
        out
    }

    #[inline(always)]
    unsafe fn scores_pv_stored(s: Step) {
        // SAFETY: forwarded contract (stored_ok held: nr <= 4, hd % 8 == 0).
        unsafe { super::stored::scores_pv_stored::<Self>(s) }
    }

    #[inline(always)]
    unsafe fn decode_rows(dtype: KvDtype, src: *const u8, n_rows: usize, hd: usize, dst: *mut f32) {
        // SAFETY: the trait contract.
        unsafe { widen_rows::<Self>(dtype, src, n_rows, hd, dst) }
    }
}

impl<const I8: bool> Simd for Avx2<I8> {
    type R = __m256;
    const W: usize = 8;
    // 4 rows × 2 keys: 8 accumulators, 4 q rows and a K vector fit the 16 registers.
    const KB: usize = 2;
    // SAFETY (every method): AVX2, FMA and F16C per the trait contract;
    // pointers as documented.
    #[inline(always)]
    unsafe fn zero() -> __m256 {
        unsafe { _mm256_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn loadu(p: *const f32) -> __m256 {
        unsafe { _mm256_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn storeu(p: *mut f32, x: __m256) {
        unsafe { _mm256_storeu_ps(p, x) }
    }
    #[inline(always)]
    unsafe fn set1(x: f32) -> __m256 {
        unsafe { _mm256_set1_ps(x) }
    }
    #[inline(always)]
    unsafe fn fmadd(a: __m256, b: __m256, c: __m256) -> __m256 {
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }
    /// Lane `i` of the 8 first registers' sums: a `hadd` tree, then the two
    /// 128-bit halves added.
    #[inline(always)]
    unsafe fn hsum(acc: &[__m256; 16], out: &mut [f32; 16]) {
        unsafe {
            let t0 = _mm256_hadd_ps(acc[0], acc[1]);
            let t1 = _mm256_hadd_ps(acc[2], acc[3]);
            let t2 = _mm256_hadd_ps(acc[4], acc[5]);
            let t3 = _mm256_hadd_ps(acc[6], acc[7]);
            // u0 = [v0..v3 of the low halves | v0..v3 of the high halves], u1 for v4..v7.
            let u0 = _mm256_hadd_ps(t0, t1);
            let u1 = _mm256_hadd_ps(t2, t3);
            let s = _mm256_add_ps(
                _mm256_permute2f128_ps::<0x20>(u0, u1),
                _mm256_permute2f128_ps::<0x31>(u0, u1),
            );
            _mm256_storeu_ps(out.as_mut_ptr(), s);
        }
    }
    #[inline(always)]
    unsafe fn f16(p: *const u8) -> __m256 {
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
    }
    #[inline(always)]
    unsafe fn bf16(p: *const u8) -> __m256 {
        unsafe {
            let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast()));
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(h))
        }
    }
    const INT8: bool = I8;
    #[inline(always)]
    unsafe fn q8_dots<const R: usize>(
        q8: *const u8,
        kp: &[*const u8; 4],
        hd: usize,
        out: &mut [f32; 16],
    ) {
        // SAFETY: forwarded contract.
        unsafe { super::avx2_int8::dots::<R>(q8, kp, hd, out) }
    }
    #[inline(always)]
    unsafe fn q8_scale(d: u16) -> __m256 {
        unsafe { _mm256_cvtph_ps(_mm_set1_epi16(d as i16)) }
    }
    #[inline(always)]
    unsafe fn q8_mul(scale: __m256, q: *const u8) -> __m256 {
        unsafe {
            let q = _mm_loadl_epi64(q.cast());
            _mm256_mul_ps(scale, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)))
        }
    }
}
