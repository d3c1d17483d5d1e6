//! AVX-512 VNNI dots for the 32-value block types, several rows per pass;
//! Q4_K and Q6_K are in `vnni_k`; Q5_1, Q5_K, Q8_K and the float types run
//! the AVX2 kernels, compiled here with the wider feature set.
//!
//! `vpdpbusd` multiplies unsigned weight bytes by signed activation bytes
//! and adds groups of four straight into int32 lanes, so there is no int16
//! step to saturate. Signed weights enter with an offset that makes them
//! unsigned (Q4_0 `q + 8`, Q5_0 `q + 16`, Q8_0 `q + 128` as `q ^ 0x80`);
//! the offset's product `o · Σy` is taken off by starting the block's int32
//! accumulator at `−o · Σy`, itself one `vpdpbusd` of the activations with a
//! constant, shared by all rows of the pass. The block's int32 dot then takes
//! its f32 scale in an FMA into a float accumulator per (row, token): `R`
//! rows give `R` independent FMA chains, and each activation block is loaded
//! once for all of them. The rows' f16 scales are converted four at a time.
//!
//! All kernels are `#[inline(always)]` and only reached from
//! `driver::compute_vnni`, compiled with avx2, fma, f16c, avx512f/bw/vl and
//! avx512vnni.

use super::act::Act;
use super::avx2::Avx2;
use super::kernel::Kernel;
use super::simd::{check, hsum};
use super::vnni_wide::q32x;
use crate::ggml_type::GgmlType;
use std::arch::x86_64::*;

/// The AVX-512 VNNI kernels (see the module docs for when they may run).
pub(super) struct Vnni;

impl Kernel for Vnni {
    #[inline(always)]
    fn dots<const T: usize>(ty: GgmlType, row: &[u8], a: &[Act<'_>; T]) -> Option<[f32; T]> {
        let [v] = Self::dots_rows::<1, T>(ty, &[row], a)?;
        Some(v)
    }

    #[inline(always)]
    fn dots_rows<const R: usize, const T: usize>(
        ty: GgmlType,
        rows: &[&[u8]; R],
        a: &[Act<'_>; T],
    ) -> Option<[[f32; T]; R]> {
        let cols = a.first()?.x.len();
        for row in rows {
            check(ty, row, a, cols)?;
        }
        // SAFETY: `check` verified every row holds exactly `cols` values of
        // `ty` and every token's views hold `cols` values, their scales and
        // sums; the CPU has the module's features (module docs).
        unsafe {
            Some(match ty {
                // Batched steps: two blocks a register (`vnni_wide`).
                GgmlType::Q4_0 if T > 1 => q32x::<R, T, 0>(rows, a, cols),
                GgmlType::Q4_1 if T > 1 => q32x::<R, T, 1>(rows, a, cols),
                GgmlType::Q5_0 if T > 1 => q32x::<R, T, 2>(rows, a, cols),
                GgmlType::Q8_0 if T > 1 => q32x::<R, T, 4>(rows, a, cols),
                GgmlType::Q4_0 if R <= 4 => q32::<R, T, 0>(rows, a, cols),
                GgmlType::Q4_1 if R <= 4 => q32::<R, T, 1>(rows, a, cols),
                GgmlType::Q5_0 if R <= 4 => q32::<R, T, 2>(rows, a, cols),
                GgmlType::Q8_0 if R <= 4 => q32::<R, T, 4>(rows, a, cols),
                GgmlType::Q4_K | GgmlType::Q6_K => {
                    let mut out = [[0f32; T]; R];
                    for (o, row) in out.iter_mut().zip(rows) {
                        *o = if ty == GgmlType::Q4_K {
                            super::vnni_k::q4k::<T>(row, a, cols)
                        } else {
                            super::vnni_k::q6k::<T>(row, a, cols)
                        };
                    }
                    out
                }
                _ => {
                    let mut out = [[0f32; T]; R];
                    for (o, row) in out.iter_mut().zip(rows) {
                        *o = Avx2::dots::<T>(ty, row, a)?;
                    }
                    out
                }
            })
        }
    }
}

/// The f16 bits at `p` (unaligned).
#[inline(always)]
unsafe fn bits16(p: *const u8) -> u64 {
    // SAFETY: the caller's 2 bytes at `p`.
    unsafe { u64::from(p.cast::<u16>().read_unaligned().to_le()) }
}

/// Up to four f16s (lane `r` from `p[r]`) as f32 lanes 0..R.
#[inline(always)]
unsafe fn halves<const R: usize>(p: &[*const u8; R]) -> __m128 {
    // SAFETY: the caller's 2 bytes at each `p[r]`; F16C per the module docs.
    unsafe {
        let mut h = 0u64;
        for (r, p) in p.iter().enumerate().take(4) {
            h |= bits16(*p) << (16 * r);
        }
        _mm_cvtph_ps(_mm_cvtsi64_si128(h as i64))
    }
}

/// Lane `r` of `v` in all eight lanes.
#[inline(always)]
unsafe fn lane(v: __m128, r: usize) -> __m256 {
    // SAFETY: register-only AVX2 arithmetic.
    unsafe { _mm256_permutevar8x32_ps(_mm256_castps128_ps256(v), _mm256_set1_epi32(r as i32)) }
}

/// The 32-value types: `K` 0 Q4_0, 1 Q4_1, 2 Q5_0, 4 Q8_0 (Q5_1 runs AVX2);
/// at most four rows (their scales share one `__m128`).
#[inline(always)]
unsafe fn q32<const R: usize, const T: usize, const K: u8>(
    rows: &[&[u8]; R],
    a: &[Act<'_>; T],
    cols: usize,
) -> [[f32; T]; R] {
    let bb = match K {
        0 => 18,
        1 => 20,
        2 => 22,
        _ => 34,
    };
    // The unsigned offset of signed weights (module docs); Q4_1 has none.
    let off: i8 = match K {
        0 => 8,
        1 => 0,
        2 => 16,
        _ => -128, // 0x80: read as 128 by the unsigned operand
    };
    // SAFETY (whole fn): block `b` of each row is at `b * bb` (`check`),
    // each token has `cols` quants and `cols / 32` scales and sums.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); T]; R];
        // Q4_1: the rows' mins times the tokens' block sums, four rows a lane.
        let mut mins = [_mm_setzero_ps(); T];
        let low = _mm256_set1_epi8(0x0f);
        let offv = _mm256_set1_epi8(off);
        let base: [*const u8; R] = core::array::from_fn(|r| rows.get_unchecked(r).as_ptr());
        for b in 0..cols / 32 {
            let p: [*const u8; R] = core::array::from_fn(|r| base.get_unchecked(r).add(b * bb));
            for p in &p {
                // Ahead into this row or the next: a matvec streams the rows.
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(16 * bb).cast());
            }
            let dw = halves::<R>(&p);
            let ys: [__m256i; T] = core::array::from_fn(|t| {
                _mm256_loadu_si256(a.get_unchecked(t).qs.as_ptr().add(b * 32).cast())
            });
            // −o · Σy spread over the lanes (zero for Q4_1).
            let start: [__m256i; T] = core::array::from_fn(|t| {
                if K == 1 {
                    _mm256_setzero_si256()
                } else {
                    let o = _mm256_dpbusd_epi32(_mm256_setzero_si256(), offv, *ys.get_unchecked(t));
                    _mm256_sub_epi32(_mm256_setzero_si256(), o)
                }
            });
            let da: [__m128; T] =
                core::array::from_fn(|t| _mm_set1_ps(*a.get_unchecked(t).d.get_unchecked(b)));
            if K == 1 {
                let m: [*const u8; R] = core::array::from_fn(|r| p.get_unchecked(r).add(2));
                let m = halves::<R>(&m);
                for t in 0..T {
                    let s = _mm_set1_ps(*a.get_unchecked(t).s.get_unchecked(b));
                    let mt = mins.get_unchecked_mut(t);
                    *mt = _mm_fmadd_ps(m, s, *mt);
                }
            }
            for r in 0..R {
                let pr = *p.get_unchecked(r);
                let u = match K {
                    0 => nibbles(pr.add(2), low),
                    1 => nibbles(pr.add(4), low),
                    2 => {
                        let qh = pr.add(2).cast::<u32>().read_unaligned().to_le();
                        let n = nibbles(pr.add(6), low);
                        _mm256_mask_add_epi8(n, qh, n, _mm256_set1_epi8(16))
                    }
                    _ => _mm256_xor_si256(_mm256_loadu_si256(pr.add(2).cast()), offv),
                };
                for t in 0..T {
                    let dot = _mm256_dpbusd_epi32(*start.get_unchecked(t), u, *ys.get_unchecked(t));
                    let sc = lane(_mm_mul_ps(dw, *da.get_unchecked(t)), r);
                    let acc_rt = acc.get_unchecked_mut(r).get_unchecked_mut(t);
                    *acc_rt = _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(dot), *acc_rt);
                }
            }
        }
        core::array::from_fn(|r| {
            core::array::from_fn(|t| {
                let m = if K == 1 {
                    let mut l = [0f32; 4];
                    _mm_storeu_ps(l.as_mut_ptr(), *mins.get_unchecked(t));
                    *l.get_unchecked(r)
                } else {
                    0.0
                };
                hsum(*acc.get_unchecked(r).get_unchecked(t)) + m
            })
        })
    }
}

/// 16 bytes of nibbles as 32 bytes: low nibbles in the low lane, high
/// nibbles in the high lane.
#[inline(always)]
unsafe fn nibbles(p: *const u8, low: __m256i) -> __m256i {
    // SAFETY: the caller's 16 bytes at `p`.
    unsafe {
        let b = _mm_loadu_si128(p.cast());
        _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(b, 4), b), low)
    }
}
