//! AVX2 dots for the 32-value block types and the float types; the K types
//! are in `avx2_k`, Q2_K, Q3_K and the IQ4 types in `avx2_lowbit`. Each
//! kernel takes one stored row and `T` tokens: a block is decoded to 32
//! bytes once and multiplied into all `T` tokens' quants.
//!
//! The integer products use `vpmaddubsw` (unsigned × signed bytes, pairs
//! summed to int16) then `vpmaddwd` (pairs to int32). Signed weights enter
//! as `|w|` with the activation taking `w`'s sign (`vpsignb`); a pair is then
//! at most 2 · 128 · 127 = 32,512, inside int16. Unsigned weights (Q4_1,
//! Q5_1 and the K types) enter as they are.
//!
//! All kernels are `#[inline(always)]` and only reached from
//! `driver::compute_avx2`, which is compiled with avx2, fma and f16c.

use super::act::Act;
use super::kernel::{row_by_row, Kernel, LANES};
use super::simd::{check, check_rows, dot_us, half_at, hsum};
use crate::ggml_type::GgmlType;
use std::arch::x86_64::*;

/// The AVX2 kernels (see the module docs for when they may run).
pub(super) struct Avx2;

impl Kernel for Avx2 {
    #[inline(always)]
    fn dots_packed<const T: usize>(
        ty: GgmlType,
        group: &[u8],
        a: &[Act<'_>; T],
        cols: usize,
    ) -> Option<[[f32; LANES]; T]> {
        // SAFETY: only reached from `driver::compute_avx2` (module docs).
        unsafe {
            match ty {
                GgmlType::Q4_K | GgmlType::Q6_K => {
                    super::avx2_packed_k::dots::<T>(ty, group, a, cols)
                }
                _ => super::avx2_packed::dots::<T>(ty, group, a, cols),
            }
        }
    }

    #[inline(always)]
    fn dots<const T: usize>(ty: GgmlType, row: &[u8], a: &[Act<'_>; T]) -> Option<[f32; T]> {
        let cols = a.first()?.x.len();
        check(ty, row, a, cols)?;
        // SAFETY: `check` verified the row holds exactly `cols` values of
        // `ty` and every token's views hold `cols` values (and their scales
        // and sums); the CPU has avx2, fma and f16c (module docs).
        unsafe {
            Some(match ty {
                GgmlType::F32 => floats::<T, 0>(row, a, cols),
                GgmlType::F16 => floats::<T, 1>(row, a, cols),
                GgmlType::BF16 => floats::<T, 2>(row, a, cols),
                GgmlType::Q4_0 => q32::<T, 0>(row, a, cols),
                GgmlType::Q4_1 => q32::<T, 1>(row, a, cols),
                GgmlType::Q5_0 => q32::<T, 2>(row, a, cols),
                GgmlType::Q5_1 => q32::<T, 3>(row, a, cols),
                GgmlType::Q8_0 => q32::<T, 4>(row, a, cols),
                GgmlType::Q4_K => super::avx2_k::q45k::<T, false>(row, a, cols),
                GgmlType::Q5_K => super::avx2_k::q45k::<T, true>(row, a, cols),
                GgmlType::Q6_K => super::avx2_k::q6k::<T>(row, a, cols),
                GgmlType::Q8_K => super::avx2_k::q8k::<T>(row, a, cols),
                GgmlType::Q2_K => super::avx2_lowbit::q23k::<T, false>(row, a, cols),
                GgmlType::Q3_K => super::avx2_lowbit::q23k::<T, true>(row, a, cols),
                GgmlType::IQ4_NL => super::avx2_lowbit::iq4nl::<T>(row, a, cols),
                GgmlType::IQ4_XS => super::avx2_lowbit::iq4xs::<T>(row, a, cols),
            })
        }
    }

    /// One token (decode) against `R` rows of a 32-value type: the rows'
    /// blocks in lockstep, so the token's block is loaded once for all and
    /// the rows' chains overlap. Each row sums in `q32`'s order: the same
    /// bits as one row at a time.
    #[inline(always)]
    fn dots_rows<const R: usize, const T: usize>(
        ty: GgmlType,
        rows: &[&[u8]; R],
        a: &[Act<'_>; T],
    ) -> Option<[[f32; T]; R]> {
        let kind = match ty {
            GgmlType::Q4_0 => 0,
            GgmlType::Q4_1 => 1,
            GgmlType::Q5_0 => 2,
            GgmlType::Q5_1 => 3,
            GgmlType::Q8_0 => 4,
            _ => return row_by_row::<Self, R, T>(ty, rows, a),
        };
        let (1, Some(at)) = (T, a.first()) else {
            return row_by_row::<Self, R, T>(ty, rows, a);
        };
        let cols = check_rows(ty, rows, a)?;
        // SAFETY: `check_rows` verified every row and the token's views for
        // `cols` values; the CPU has avx2, fma and f16c.
        let v = unsafe {
            match kind {
                0 => q32_rows::<R, 0>(rows, at, cols),
                1 => q32_rows::<R, 1>(rows, at, cols),
                2 => q32_rows::<R, 2>(rows, at, cols),
                3 => q32_rows::<R, 3>(rows, at, cols),
                _ => q32_rows::<R, 4>(rows, at, cols),
            }
        };
        let mut out = [[0f32; T]; R];
        for (o, v) in out.iter_mut().zip(v) {
            *o.first_mut()? = v;
        }
        Some(out)
    }
}

/// 16 bytes of nibbles as 32 bytes: low nibbles (values 0..16) in the low
/// lane, high nibbles (values 16..32) in the high lane.
#[inline(always)]
unsafe fn nibbles(p: *const u8) -> __m256i {
    // SAFETY: the caller's 16 bytes at `p`.
    unsafe {
        let b = _mm_loadu_si128(p.cast());
        let v = _mm256_set_m128i(_mm_srli_epi16(b, 4), b);
        _mm256_and_si256(v, _mm256_set1_epi8(0x0f))
    }
}

/// 0xff in byte `j` where bit `j` of `qh` is set.
#[inline(always)]
unsafe fn bit_mask(qh: u32) -> __m256i {
    // SAFETY: register-only AVX2 arithmetic.
    unsafe {
        // Byte j takes byte j / 8 of qh, then tests its bit j % 8.
        let spread = _mm256_set_epi64x(
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
            0x0101_0101_0101_0101,
            0,
        );
        let v = _mm256_shuffle_epi8(_mm256_set1_epi32(qh as i32), spread);
        let bits = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        _mm256_cmpeq_epi8(_mm256_and_si256(v, bits), bits)
    }
}

/// Bytes of one block of a 32-value type: `K` 0 Q4_0, 1 Q4_1, 2 Q5_0, 3 Q5_1, 4 Q8_0.
const fn block_bytes(k: u8) -> usize {
    match k {
        0 => 18,
        1 => 20,
        2 => 22,
        3 => 24,
        _ => 34,
    }
}

/// The block at `p`: its scale, its 32 weights as bytes ready for
/// `dot_us` (|w| for a signed type), the sign source (`None`: unsigned) and
/// its min (0 for the types without one).
#[inline(always)]
unsafe fn block<const K: u8>(p: *const u8) -> (f32, __m256i, Option<__m256i>, f32) {
    // SAFETY: the caller's whole block at `p`.
    unsafe {
        let dw = half_at(p);
        // Signed weights as (|q|, sign source); unsigned ones as q.
        let (q, signed) = match K {
            0 => (
                _mm256_sub_epi8(nibbles(p.add(2)), _mm256_set1_epi8(8)),
                true,
            ),
            1 => (nibbles(p.add(4)), false),
            2 => {
                let qh = p.add(2).cast::<u32>().read_unaligned().to_le();
                let m = bit_mask(qh);
                // q − 16: a clear 5th bit makes the nibble negative (0xf0 | q).
                let hi = _mm256_andnot_si256(m, _mm256_set1_epi8(0xf0u8 as i8));
                (_mm256_or_si256(nibbles(p.add(6)), hi), true)
            }
            3 => {
                let qh = p.add(4).cast::<u32>().read_unaligned().to_le();
                let hi = _mm256_and_si256(bit_mask(qh), _mm256_set1_epi8(0x10));
                (_mm256_or_si256(nibbles(p.add(8)), hi), false)
            }
            _ => (_mm256_loadu_si256(p.add(2).cast()), true),
        };
        let m = if K == 1 || K == 3 {
            half_at(p.add(2))
        } else {
            0.0
        };
        if signed {
            (dw, _mm256_sign_epi8(q, q), Some(q), m)
        } else {
            (dw, q, None, m)
        }
    }
}

/// The 32-value types: `K` 0 Q4_0, 1 Q4_1, 2 Q5_0, 3 Q5_1, 4 Q8_0.
#[inline(always)]
unsafe fn q32<const T: usize, const K: u8>(row: &[u8], a: &[Act<'_>; T], cols: usize) -> [f32; T] {
    let bb = block_bytes(K);
    // SAFETY (whole fn): block `b` of the row is at `b * bb` (`check`), each
    // token has `cols` quants and `cols / 32` scales and sums.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); T];
        let mut mins = [0f32; T];
        let w = row.as_ptr();
        for b in 0..cols / 32 {
            let p = w.add(b * bb);
            // Ahead into this row or the next: a matvec streams the rows.
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(16 * bb).cast());
            let (dw, qa, sign, m) = block::<K>(p);
            for t in 0..T {
                let at = a.get_unchecked(t);
                let y = _mm256_loadu_si256(at.qs.as_ptr().add(b * 32).cast());
                let y = sign.map_or(y, |q| _mm256_sign_epi8(y, q));
                let s = _mm256_cvtepi32_ps(dot_us(qa, y));
                let acc_t = acc.get_unchecked_mut(t);
                *acc_t = _mm256_fmadd_ps(_mm256_set1_ps(dw * *at.d.get_unchecked(b)), s, *acc_t);
                if K == 1 || K == 3 {
                    *mins.get_unchecked_mut(t) += m * *at.s.get_unchecked(b);
                }
            }
        }
        core::array::from_fn(|t| hsum(*acc.get_unchecked(t)) + *mins.get_unchecked(t))
    }
}

/// `R` rows of a 32-value type against one token, in lockstep; each row's
/// sum in `q32`'s order.
#[inline(always)]
unsafe fn q32_rows<const R: usize, const K: u8>(
    rows: &[&[u8]; R],
    at: &Act<'_>,
    cols: usize,
) -> [f32; R] {
    let bb = block_bytes(K);
    // SAFETY (whole fn): as `q32`, for every row (the caller `check`ed each).
    unsafe {
        let mut acc = [_mm256_setzero_ps(); R];
        let mut mins = [0f32; R];
        for b in 0..cols / 32 {
            let y0 = _mm256_loadu_si256(at.qs.as_ptr().add(b * 32).cast());
            let da = *at.d.get_unchecked(b);
            for r in 0..R {
                let p = rows.get_unchecked(r).as_ptr().add(b * bb);
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(16 * bb).cast());
                let (dw, qa, sign, m) = block::<K>(p);
                let y = sign.map_or(y0, |q| _mm256_sign_epi8(y0, q));
                let s = _mm256_cvtepi32_ps(dot_us(qa, y));
                let acc_r = acc.get_unchecked_mut(r);
                *acc_r = _mm256_fmadd_ps(_mm256_set1_ps(dw * da), s, *acc_r);
                if K == 1 || K == 3 {
                    *mins.get_unchecked_mut(r) += m * *at.s.get_unchecked(b);
                }
            }
        }
        core::array::from_fn(|r| hsum(*acc.get_unchecked(r)) + *mins.get_unchecked(r))
    }
}

/// Float weights: `K` 0 F32, 1 F16 (F16C), 2 BF16, with f32 activations.
#[inline(always)]
unsafe fn floats<const T: usize, const K: u8>(
    row: &[u8],
    a: &[Act<'_>; T],
    cols: usize,
) -> [f32; T] {
    // SAFETY (whole fn): the row holds `cols` values and each token `cols`
    // floats (`check`).
    unsafe {
        let load = |c: usize| -> __m256 {
            match K {
                0 => _mm256_loadu_ps(row.as_ptr().add(c * 4).cast()),
                1 => _mm256_cvtph_ps(_mm_loadu_si128(row.as_ptr().add(c * 2).cast())),
                _ => {
                    let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(row.as_ptr().add(c * 2).cast()));
                    _mm256_castsi256_ps(_mm256_slli_epi32(h, 16))
                }
            }
        };
        let mut acc = [_mm256_setzero_ps(); T];
        let mut c = 0;
        let wb = if K == 0 { 4 } else { 2 };
        while c + 8 <= cols {
            _mm_prefetch::<_MM_HINT_T0>(row.as_ptr().wrapping_add((c + 256) * wb).cast());
            let w = load(c);
            for t in 0..T {
                let x = _mm256_loadu_ps(a.get_unchecked(t).x.as_ptr().add(c));
                let acc_t = acc.get_unchecked_mut(t);
                *acc_t = _mm256_fmadd_ps(w, x, *acc_t);
            }
            c += 8;
        }
        let mut out: [f32; T] = core::array::from_fn(|t| hsum(*acc.get_unchecked(t)));
        // A tail shorter than 8 (float rows need not be a multiple of 8).
        for c in c..cols {
            let w = match K {
                0 => row.as_ptr().add(c * 4).cast::<f32>().read_unaligned(),
                1 => offgraph_kv::half::f16_to_f32(
                    row.as_ptr()
                        .add(c * 2)
                        .cast::<u16>()
                        .read_unaligned()
                        .to_le(),
                ),
                _ => offgraph_kv::half::bf16_to_f32(
                    row.as_ptr()
                        .add(c * 2)
                        .cast::<u16>()
                        .read_unaligned()
                        .to_le(),
                ),
            };
            for t in 0..T {
                *out.get_unchecked_mut(t) += w * *a.get_unchecked(t).x.get_unchecked(c);
            }
        }
        out
    }
}
