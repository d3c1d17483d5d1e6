//! Horizontal sums of AVX2 accumulators, below both AVX2 kernels: the float
//! one's `Simd::hsum` and the int8 one's q8_0 key dots reduce their
//! accumulators through [`hsum8`].

use std::arch::x86_64::*;

/// `out[i]` = the sum of the 8 lanes of `acc[i]`, `i < 8` (`out[8..]` is left
/// as it was): a `hadd` tree, then the two 128-bit halves added.
///
/// # Safety
/// AVX.
#[inline(always)]
pub(super) unsafe fn hsum8(acc: &[__m256; 16], out: &mut [f32; 16]) {
    // SAFETY: register arithmetic; the store writes `out[..8]`, inside `out`.
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
