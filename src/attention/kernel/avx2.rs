//! The AVX2 path: the portable kernel compiled with AVX2 and FMA enabled (its
//! fixed-width loops autovectorise and `Portable<true>`'s `mul_add` is a fused
//! multiply-add), plus the decode step over rows as stored with 8-lane
//! registers, float16 widened by F16C's `vcvtph2ps`; `Avx2<true>` scores
//! q8_0 keys by integer dot products instead (`avx2_int8.rs`).

use super::simd::{widen_rows, Simd};
use super::{run_block, Block, Isa, Portable, State, Step, KT};
use crate::attention::softmax::EXP2_POLY;
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

    // Prefill blocks too: the scratch-tile kernels reduce each score
    // separately and keep P·V accumulators in memory.
    const STORED_GROUPS: bool = true;

    #[inline(always)]
    fn q8_row_bytes(hd: usize) -> usize {
        super::avx2_int8::row_stride(hd)
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

    /// In 8-lane registers: the portable step's `exp2` keeps a branch per
    /// lane, which left it scalar and made it half of a decode call's time.
    #[inline(always)]
    unsafe fn softmax_row(row: &mut [f32; KT], va: usize, vb: usize, m_old: f32) -> (f32, f32) {
        const NV: usize = KT / 8;
        let rp = row.as_mut_ptr();
        // SAFETY: row holds KT = 8·NV floats; register ops otherwise; the
        // caller runs with AVX2 (trait contract).
        unsafe {
            let ninf = _mm256_set1_ps(f32::NEG_INFINITY);
            let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            // va < vb <= KT = 64, so both fit i32.
            let (a, b) = (_mm256_set1_epi32(va as i32), _mm256_set1_epi32(vb as i32));
            let mut s = [ninf; NV];
            let mut mx = ninf;
            for (v, sv) in s.iter_mut().enumerate() {
                let idx = _mm256_add_epi32(lane, _mm256_set1_epi32(8 * v as i32));
                // va <= idx < vb
                let vis =
                    _mm256_andnot_si256(_mm256_cmpgt_epi32(a, idx), _mm256_cmpgt_epi32(b, idx));
                *sv = _mm256_blendv_ps(
                    ninf,
                    _mm256_loadu_ps(rp.add(8 * v)),
                    _mm256_castsi256_ps(vis),
                );
                // NaN in the first operand yields the second: NaN scores are
                // skipped, as f32::max does.
                mx = _mm256_max_ps(*sv, mx);
            }
            let mn = m_old.max(reduce(mx, |x, y| _mm_max_ps(y, x)));
            let mb = _mm256_set1_ps(mn);
            let mut sum = _mm256_setzero_ps();
            for (v, sv) in s.iter().enumerate() {
                let p = exp2_ps(_mm256_sub_ps(*sv, mb));
                sum = _mm256_add_ps(sum, p);
                _mm256_storeu_ps(rp.add(8 * v), p);
            }
            (mn, reduce(sum, |x, y| _mm_add_ps(x, y)))
        }
    }
}

/// The 8 lanes of `x` folded by `op` to one value.
#[inline(always)]
unsafe fn reduce(x: __m256, op: impl Fn(__m128, __m128) -> __m128) -> f32 {
    // SAFETY: register-only AVX ops; the caller runs with AVX2.
    unsafe {
        let h = op(_mm256_castps256_ps128(x), _mm256_extractf128_ps::<1>(x));
        let h = op(h, _mm_movehl_ps(h, h));
        _mm_cvtss_f32(op(h, _mm_shuffle_ps::<1>(h, h)))
    }
}

/// `2^x` lane-wise with `softmax::exp2`'s contract: NaN and x below -126
/// give 0; [`EXP2_POLY`] with fused steps.
#[inline(always)]
unsafe fn exp2_ps(x: __m256) -> __m256 {
    // SAFETY (whole fn): register-only AVX2/FMA ops; the caller runs with both.
    unsafe {
        let keep = _mm256_cmp_ps::<_CMP_GE_OQ>(x, _mm256_set1_ps(-126.0));
        // max_ps returns the second operand when x is NaN (masked by keep).
        let x = _mm256_max_ps(x, _mm256_set1_ps(-127.0));
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x);
        let f = _mm256_mul_ps(_mm256_sub_ps(x, n), _mm256_set1_ps(std::f32::consts::LN_2));
        let [first, rest @ ..] = EXP2_POLY;
        let mut p = _mm256_set1_ps(first);
        for c in rest {
            p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(c));
        }
        let e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
        let scale = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(e));
        _mm256_and_ps(_mm256_mul_ps(p, scale), keep)
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
    /// Lane `i` of the 8 first registers' sums.
    #[inline(always)]
    unsafe fn hsum(acc: &[__m256; 16], out: &mut [f32; 16]) {
        // SAFETY: the same contract.
        unsafe { super::hsum::hsum8(acc, out) }
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

#[cfg(test)]
#[allow(clippy::indexing_slicing, clippy::unwrap_used)]
mod tests {
    use super::super::{portable::softmax_row_portable, Isa, KT};
    use super::Avx2;

    fn avx2() -> bool {
        crate::cpu::features().avx2_fma_f16c()
    }

    /// The register softmax step agrees with the portable one on every
    /// visible window, with masked lanes, NaN, -inf, far-negative and
    /// underflowing scores and a running max above or below the tile's.
    #[test]
    fn softmax_row_matches_portable() {
        if !avx2() {
            // Nothing to compare on this CPU: the path must then be refused.
            let forced = super::super::select_isa(crate::attention::NativeIsa::Avx2);
            assert!(forced.is_err(), "AVX2 forced on a CPU without it");
            return;
        }
        let mut seed = 0x9e37_79b9_u32;
        let mut rnd = || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            seed as f32 / u32::MAX as f32
        };
        for case in 0..400 {
            let m_old = match case % 4 {
                0 => f32::NEG_INFINITY,
                1 => 30.0,
                2 => -5.0,
                _ => 0.0,
            };
            let mut row = [0f32; KT];
            for (j, x) in row.iter_mut().enumerate() {
                *x = match (case + j) % 17 {
                    0 => f32::NAN,
                    1 => f32::NEG_INFINITY,
                    2 => -1.0e4,
                    3 => -130.0 + rnd(),
                    // Around exp2's cut at -126 below a running max of 30
                    // that every other score stays under.
                    4 => 30.0 - 126.0 - 0.5 * rnd(),
                    5 => 30.0 - 126.0 + 0.5 * rnd(),
                    6 => 30.0 - 127.0 - rnd(),
                    _ => 40.0 * rnd() - 20.0,
                };
            }
            let va = case % KT;
            let vb = va + 1 + (case * 7) % (KT - va);
            let mut want = row;
            let (wm, ws) = softmax_row_portable(&mut want, va, vb, m_old);
            let mut got = row;
            // SAFETY: AVX2, FMA and F16C detected above; va < vb <= KT.
            let (gm, gs) = unsafe { Avx2::<false>::softmax_row(&mut got, va, vb, m_old) };
            assert_eq!(gm.to_bits(), wm.to_bits(), "case {case}: max");
            assert!(
                (gs - ws).abs() <= 1e-5 * ws.abs().max(1e-30),
                "case {case}: sum {gs} vs {ws}"
            );
            for j in 0..KT {
                let (g, w) = (got[j], want[j]);
                assert!(
                    (g - w).abs() <= 1e-6 * w.abs().max(1e-37),
                    "case {case} lane {j} ({va}..{vb}): {g} vs {w}"
                );
            }
        }
    }
}
