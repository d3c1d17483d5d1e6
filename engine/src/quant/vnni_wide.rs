//! AVX-512 VNNI dots of the 32-value block types (Q4_0, Q4_1, Q5_0, Q8_0),
//! `R` rows against `T` tokens, for the rows of a weight that do not fill a
//! group of 16 (the rest run `vnni_lanes`): the same per-(row, token)
//! summation for every `T`, so such a row's result does not depend on the
//! step it ran in either.
//!
//! A 512-bit register holds two blocks, so one `vpdpbusd` does 64 products
//! of a (row, token) pair and one FMA applies both blocks' scales: lanes
//! 0-7 carry block `b`, lanes 8-15 block `b + 1`, and the scale vector is
//! `dw · da` spread the same way. Per block pair the work splits three ways:
//! per token (its 64 quants, the offset term `−o · Σy` as in `vnni`, its two
//! scales spread), per row (its unpacked bytes, its two scales spread) and
//! per (row, token) (one `vpdpbusd`, one multiply, one convert, one FMA), so
//! `R` rows reuse each token's registers and `T` tokens each row's. An odd
//! last block runs the same steps with the upper half zeroed.
//!
//! Only reached from `driver::compute_vnni` (compiled with avx2, fma, f16c,
//! avx512f/bw/vl and avx512vnni) through `vnni::Vnni::dots_rows`.

use super::act::Act;
use super::simd::{q32_block_bytes, q32_offset};
use std::arch::x86_64::*;

/// The f16 scales at `p` and `q` as f32 lanes 0 and 1.
#[inline(always)]
unsafe fn scales2(p: *const u8, q: *const u8) -> __m128 {
    // SAFETY: the caller's 2 bytes at `p` and at `q`; F16C per the module docs.
    unsafe {
        let lo = u32::from(p.cast::<u16>().read_unaligned().to_le());
        let hi = u32::from(q.cast::<u16>().read_unaligned().to_le());
        _mm_cvtph_ps(_mm_cvtsi32_si128((lo | (hi << 16)) as i32))
    }
}

/// Lanes 0 and 1 of `v` spread over lanes 0-7 and 8-15.
#[inline(always)]
unsafe fn spread(v: __m128) -> __m512 {
    // SAFETY: register-only AVX-512 arithmetic; lanes above 1 are not read.
    unsafe {
        let idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
        _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(v))
    }
}

/// 16 bytes of nibbles as 32 bytes: low nibbles first, then high nibbles.
#[inline(always)]
unsafe fn nibbles(p: *const u8) -> __m256i {
    // SAFETY: the caller's 16 bytes at `p`.
    unsafe {
        let b = _mm_loadu_si128(p.cast());
        let v = _mm256_set_m128i(_mm_srli_epi16(b, 4), b);
        _mm256_and_si256(v, _mm256_set1_epi8(0x0f))
    }
}

/// One block's 32 weights as unsigned bytes (`K` as `q32x`); the Q5_0
/// fifth bits come back apart, as a 32-bit mask.
#[inline(always)]
unsafe fn block<const K: u8>(p: *const u8) -> (__m256i, u32) {
    // SAFETY: the caller's whole block at `p`.
    unsafe {
        match K {
            0 => (nibbles(p.add(2)), 0),
            1 => (nibbles(p.add(4)), 0),
            2 => (
                nibbles(p.add(6)),
                p.add(2).cast::<u32>().read_unaligned().to_le(),
            ),
            _ => (
                _mm256_xor_si256(_mm256_loadu_si256(p.add(2).cast()), _mm256_set1_epi8(-128)),
                0,
            ),
        }
    }
}

/// Blocks `b` and `b + 1` (only `b` when `two` is false: the upper half is
/// zero) of a row as 64 unsigned bytes.
#[inline(always)]
unsafe fn pair<const K: u8>(p: *const u8, bb: usize, two: bool) -> __m512i {
    // SAFETY: the caller's block at `p`, and the next one when `two`.
    unsafe {
        let (lo, hl) = block::<K>(p);
        let (hi, hh) = if two {
            block::<K>(p.add(bb))
        } else {
            (_mm256_setzero_si256(), 0)
        };
        let u = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
        if K == 2 {
            let m = u64::from(hl) | (u64::from(hh) << 32);
            _mm512_mask_add_epi8(u, m, u, _mm512_set1_epi8(16))
        } else {
            u
        }
    }
}

/// Two f32 at `p` (only the first when `two` is false) as lanes 0 and 1.
#[inline(always)]
unsafe fn two_f32(p: *const f32, two: bool) -> __m128 {
    // SAFETY: the caller's one or two f32 at `p`.
    unsafe {
        if two {
            _mm_castpd_ps(_mm_load_sd(p.cast()))
        } else {
            _mm_load_ss(p)
        }
    }
}

/// `R` rows against `T` tokens for the 32-value types: `K` 0 Q4_0, 1 Q4_1,
/// 2 Q5_0, 4 Q8_0 (as `vnni::q32`).
///
/// # Safety
/// Every row holds exactly `cols` values of the type, every token `cols`
/// quants and `cols / 32` scales and sums (`simd::check`), and the CPU has
/// the module's features.
#[inline(always)]
pub(super) unsafe fn q32x<const R: usize, const T: usize, const K: u8>(
    rows: &[&[u8]; R],
    a: &[Act<'_>; T],
    cols: usize,
) -> [[f32; T]; R] {
    let bb = q32_block_bytes(K);
    // The unsigned offset of signed weights (`vnni`'s module docs), as a
    // byte (Q8_0's 128 is -128).
    let off = q32_offset(K) as u8 as i8;
    let blocks = cols / 32;
    // SAFETY (whole fn): block `b` of each row is at `b * bb`; each token
    // has `cols` quants and `blocks` scales and sums (the caller's contract).
    unsafe {
        let offv = _mm512_set1_epi8(off);
        let zero = _mm512_setzero_si512();
        let mut acc = [[_mm512_setzero_ps(); T]; R];
        // Q4_1: the rows' mins times the tokens' block sums, lanes 0 and 1.
        let mut mins = [[_mm_setzero_ps(); T]; R];
        let base: [*const u8; R] = core::array::from_fn(|r| rows.get_unchecked(r).as_ptr());
        let mut b = 0;
        while b < blocks {
            let two = b + 1 < blocks;
            let ys: [__m512i; T] = core::array::from_fn(|t| {
                let y = a.get_unchecked(t).qs.as_ptr().add(b * 32);
                if two {
                    _mm512_loadu_si512(y.cast())
                } else {
                    _mm512_zextsi256_si512(_mm256_loadu_si256(y.cast()))
                }
            });
            let start: [__m512i; T] = core::array::from_fn(|t| {
                if K == 1 {
                    zero
                } else {
                    _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, offv, *ys.get_unchecked(t)))
                }
            });
            let da2: [__m128; T] =
                core::array::from_fn(|t| two_f32(a.get_unchecked(t).d.as_ptr().add(b), two));
            let da: [__m512; T] = core::array::from_fn(|t| spread(*da2.get_unchecked(t)));
            for r in 0..R {
                let p = base.get_unchecked(r).add(b * bb);
                // Ahead into this row: the pass streams the rows' blocks.
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(8 * bb).cast());
                let u = pair::<K>(p, bb, two);
                let q = if two { p.add(bb) } else { p };
                let dw2 = scales2(p, q);
                let dw = spread(dw2);
                if K == 1 {
                    let m2 = scales2(p.add(2), q.add(2));
                    for t in 0..T {
                        let s2 = two_f32(a.get_unchecked(t).s.as_ptr().add(b), two);
                        let m = mins.get_unchecked_mut(r).get_unchecked_mut(t);
                        *m = _mm_fmadd_ps(m2, s2, *m);
                    }
                }
                for t in 0..T {
                    let dot = _mm512_dpbusd_epi32(*start.get_unchecked(t), u, *ys.get_unchecked(t));
                    let sc = _mm512_mul_ps(dw, *da.get_unchecked(t));
                    let acc_rt = acc.get_unchecked_mut(r).get_unchecked_mut(t);
                    *acc_rt = _mm512_fmadd_ps(sc, _mm512_cvtepi32_ps(dot), *acc_rt);
                }
            }
            b += 2;
        }
        core::array::from_fn(|r| {
            core::array::from_fn(|t| {
                let m = if K == 1 {
                    let mut l = [0f32; 4];
                    _mm_storeu_ps(l.as_mut_ptr(), *mins.get_unchecked(r).get_unchecked(t));
                    l[0] + l[1]
                } else {
                    0.0
                };
                _mm512_reduce_add_ps(*acc.get_unchecked(r).get_unchecked(t)) + m
            })
        })
    }
}
