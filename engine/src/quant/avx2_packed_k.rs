//! AVX2 dots of Q4_K and Q6_K groups packed at load (`lanes_k`'s layout,
//! the one the VNNI kernels read), rows in the lanes as in `avx2_packed`:
//! each 64-byte register of a record is four weights of 16 rows, its two
//! 32-byte halves rows 0..8 and 8..16. Against four activation bytes
//! broadcast, `vpmaddubsw` gives each row's pair sums in int16; a
//! sub-block's sums add up in int16 and one `vpmaddwd` against the rows'
//! scales (each in both int16 halves of its lane) widens and scales them at
//! once, so no `vpmulld`.
//!
//! Bounds: Q4_K's nibbles (at most 15) make a pair at most 3,810, so a
//! sub-block's eight sums fit int16 (30,480), and times a six-bit scale an
//! int32 lane. Q6_K's six-bit values (at most 63) make a pair at most
//! 16,002: two sums fit (32,004), then `vpmaddwd` by the int8 scale. Q4_K's
//! mins and Q6_K's `−32` offset come from the activations' 16-value sums by
//! `vpmaddwd`, as the VNNI kernel takes them by `vpdpwssd`. All integer
//! sums are exact, and per (row, token) the super-blocks' scaled sums are
//! added in super-block order whatever the token count.
//!
//! Only reached from `driver::compute_avx2` (avx2, fma, f16c) through
//! `avx2::Avx2::dots_packed`.

use super::act::Act;
use super::avx2_packed::{run, HalfStep};
use super::kernel::LANES;
use super::lanes_k::{Q4K_DMIN, Q4K_MN, Q4K_QS, Q4K_SB, Q4K_SC, Q6K_QS, Q6K_SB, Q6K_SC, Q6K_SUB};
use crate::ggml_type::GgmlType;
use std::arch::x86_64::*;

/// Rows of a half record.
const HALF: usize = LANES / 2;

/// A packed Q4_K or Q6_K group of `cols` values a row against `T` tokens'
/// Q8_K activations: `out[t][r]`; `None` when a length does not fit.
///
/// # Safety
/// The CPU has avx2, fma and f16c.
#[inline(always)]
pub(super) unsafe fn dots<const T: usize>(
    ty: GgmlType,
    group: &[u8],
    a: &[Act<'_>; T],
    cols: usize,
) -> Option<[[f32; LANES]; T]> {
    let sbs = super::lanes_k::fits(ty, group, a, cols)?;
    let g = group.as_ptr();
    // SAFETY: the group holds `sbs` records of `ty` and every token `cols`
    // quants, `sbs` scales and `cols / 16` sums (checked); the caller's CPU.
    unsafe {
        Some(match ty {
            GgmlType::Q4_K => run(&KQuant::<4>(g), a, sbs),
            GgmlType::Q6_K => run(&KQuant::<6>(g), a, sbs),
            _ => return None,
        })
    }
}

/// A packed Q4_K (`K` 4) or Q6_K (6) group: its base.
struct KQuant<const K: u8>(*const u8);

impl<const K: u8> HalfStep for KQuant<K> {
    #[inline(always)]
    unsafe fn step<const C: usize>(
        &self,
        a: &[Act<'_>; C],
        b: usize,
        h: usize,
        first: bool,
        acc: &mut [__m256; C],
    ) {
        let fetch = first && h == 0;
        // SAFETY: the caller's super-block and tokens.
        unsafe {
            if K == 4 {
                q4k_sb::<C>(self.0.add(b * Q4K_SB), a, b, h, fetch, acc);
            } else {
                q6k_sb::<C>(self.0.add(b * Q6K_SB), a, b, h, fetch, acc);
            }
        }
    }
}

/// Bytes ahead of the record being read that the first pass prefetches.
const AHEAD: usize = 2048;

/// Step `j` of 8 of record `p` (`rec` bytes): its eighth of the lines
/// [`AHEAD`] bytes on (a few per step: a record's worth at once measured
/// slower; past the group's end, the next group's; a prefetch never faults).
#[inline(always)]
unsafe fn ahead(p: *const u8, rec: usize, j: usize) {
    let per = rec.div_ceil(64 * 8) * 64;
    let from = p.wrapping_add(AHEAD + j * per);
    let mut l = 0;
    while l < per {
        // SAFETY: a prefetch reads nothing and never faults.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(from.wrapping_add(l).cast()) };
        l += 64;
    }
}

/// Token `a`'s four bytes at `at` (quants, or an int16 pair of sums at
/// `at` int16s) broadcast to every lane.
#[inline(always)]
unsafe fn quad(p: *const u8) -> __m256i {
    // SAFETY: the caller's four bytes at `p`.
    unsafe { _mm256_set1_epi32(p.cast::<i32>().read_unaligned()) }
}

/// Eight bytes (one per row) as int32 lanes with the value in both int16
/// halves: the multiplier `vpmaddwd` applies to both sums of a lane.
#[inline(always)]
unsafe fn bytes_twice(p: *const u8) -> __m256i {
    // SAFETY: the caller's eight bytes at `p`.
    unsafe {
        let v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.cast()));
        _mm256_or_si256(v, _mm256_slli_epi32::<16>(v))
    }
}

/// Q4_K super-block `b` (record `p`), half `h`, for `C` tokens.
#[inline(always)]
unsafe fn q4k_sb<const C: usize>(
    p: *const u8,
    a: &[Act<'_>; C],
    b: usize,
    h: usize,
    fetch: bool,
    acc: &mut [__m256; C],
) {
    // SAFETY (whole fn): `dots` checked the records and the tokens' views;
    // every load below reads inside record `b`'s half `h`.
    unsafe {
        let low = _mm256_set1_epi8(0x0f);
        let mut iacc = [_mm256_setzero_si256(); C];
        for j in 0..8 {
            if fetch {
                ahead(p, Q4K_SB, j);
            }
            let sc = bytes_twice(p.add(Q4K_SC + 16 * j + HALF * h));
            let q = p.add(Q4K_QS + 512 * (j / 2) + 32 * h);
            let mut w = [_mm256_setzero_si256(); 8];
            for (i, wi) in w.iter_mut().enumerate() {
                let v = _mm256_loadu_si256(q.add(64 * i).cast());
                let v = if j % 2 == 0 {
                    v
                } else {
                    _mm256_srli_epi16::<4>(v)
                };
                *wi = _mm256_and_si256(v, low);
            }
            for (at, ia) in a.iter().zip(iacc.iter_mut()) {
                let y = at.qs.as_ptr().add(256 * b + 32 * j).cast::<u8>();
                let s = _mm256_add_epi16(pairs4(&w, 0, y), pairs4(&w, 4, y));
                *ia = _mm256_add_epi32(*ia, _mm256_madd_epi16(s, sc));
            }
        }
        let d = _mm256_cvtph_ps(_mm_loadu_si128(p.add(16 * h).cast()));
        let dmin = _mm256_cvtph_ps(_mm_loadu_si128(p.add(Q4K_DMIN + 16 * h).cast()));
        for ((at, ia), acc_t) in a.iter().zip(&iacc).zip(acc.iter_mut()) {
            // Σ_j mn_j · (s_2j + s_2j+1): each min twice against a pair of sums.
            let bs = at.bs.as_ptr().add(16 * b).cast::<u8>();
            let mut m = _mm256_setzero_si256();
            for j in 0..8 {
                let mn = bytes_twice(p.add(Q4K_MN + 16 * j + HALF * h));
                m = _mm256_add_epi32(m, _mm256_madd_epi16(mn, quad(bs.add(4 * j))));
            }
            let da = _mm256_set1_ps(*at.d.get_unchecked(b));
            *acc_t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(*ia), _mm256_mul_ps(d, da), *acc_t);
            *acc_t = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(m), _mm256_mul_ps(dmin, da), *acc_t);
        }
    }
}

/// The int16 pair sums of registers `i0..i0 + 4` of `w` against the
/// activation bytes from `y` (a plain function, not a closure: see `join`).
#[inline(always)]
unsafe fn pairs4(w: &[__m256i; 8], i0: usize, y: *const u8) -> __m256i {
    // SAFETY: the caller's 32 activation bytes at `y` and `i0 + 4 <= 8`.
    unsafe {
        let mut s = [_mm256_setzero_si256(); 4];
        for (k, sk) in s.iter_mut().enumerate() {
            let i = i0 + k;
            *sk = _mm256_maddubs_epi16(*w.get_unchecked(i), quad(y.add(4 * i)));
        }
        _mm256_add_epi16(_mm256_add_epi16(s[0], s[1]), _mm256_add_epi16(s[2], s[3]))
    }
}

/// Q6_K super-block `b` (record `p`), half `h`, for `C` tokens.
#[inline(always)]
unsafe fn q6k_sb<const C: usize>(
    p: *const u8,
    a: &[Act<'_>; C],
    b: usize,
    h: usize,
    fetch: bool,
    acc: &mut [__m256; C],
) {
    // SAFETY (whole fn): as `q4k_sb`.
    unsafe {
        let low = _mm256_set1_epi8(0x0f);
        let high = _mm256_set1_epi8(0x30);
        let mut iacc = [_mm256_setzero_si256(); C];
        for k in 0..8 {
            if fetch {
                ahead(p, Q6K_SB, k);
            }
            // Row r's lane: scales 2k, 2k + 1 as int16.
            let pair =
                _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(Q6K_SC + 32 * k + 16 * h).cast()));
            let off = _mm256_mullo_epi16(pair, _mm256_set1_epi16(-32));
            for (at, ia) in a.iter().zip(iacc.iter_mut()) {
                let bs = at.bs.as_ptr().add(16 * b + 2 * k).cast::<u8>();
                *ia = _mm256_add_epi32(*ia, _mm256_madd_epi16(off, quad(bs)));
            }
            for hh in 0..2 {
                let j = 2 * k + hh;
                // The lane's scale 2k (2k + 1) in both of its int16 halves.
                let sc = if hh == 0 {
                    _mm256_shufflehi_epi16::<0b10_10_00_00>(
                        _mm256_shufflelo_epi16::<0b10_10_00_00>(pair),
                    )
                } else {
                    _mm256_shufflehi_epi16::<0b11_11_01_01>(
                        _mm256_shufflelo_epi16::<0b11_11_01_01>(pair),
                    )
                };
                let q = p.add(Q6K_QS + Q6K_SUB * j + 32 * h);
                let lo0 = _mm256_loadu_si256(q.cast());
                let lo1 = _mm256_loadu_si256(q.add(64).cast());
                let hi = _mm256_loadu_si256(q.add(128).cast());
                let w = [
                    join(lo0, _mm256_slli_epi16::<4>(hi), low, high),
                    join(
                        _mm256_srli_epi16::<4>(lo0),
                        _mm256_slli_epi16::<2>(hi),
                        low,
                        high,
                    ),
                    join(lo1, hi, low, high),
                    join(
                        _mm256_srli_epi16::<4>(lo1),
                        _mm256_srli_epi16::<2>(hi),
                        low,
                        high,
                    ),
                ];
                for (at, ia) in a.iter().zip(iacc.iter_mut()) {
                    let y = at.qs.as_ptr().add(256 * b + 16 * j).cast::<u8>();
                    let s01 = _mm256_add_epi16(
                        _mm256_maddubs_epi16(w[0], quad(y)),
                        _mm256_maddubs_epi16(w[1], quad(y.add(4))),
                    );
                    let s23 = _mm256_add_epi16(
                        _mm256_maddubs_epi16(w[2], quad(y.add(8))),
                        _mm256_maddubs_epi16(w[3], quad(y.add(12))),
                    );
                    let d =
                        _mm256_add_epi32(_mm256_madd_epi16(s01, sc), _mm256_madd_epi16(s23, sc));
                    *ia = _mm256_add_epi32(*ia, d);
                }
            }
        }
        let d = _mm256_loadu_ps(p.add(32 * h).cast());
        for ((at, ia), acc_t) in a.iter().zip(&iacc).zip(acc.iter_mut()) {
            let da = _mm256_set1_ps(*at.d.get_unchecked(b));
            *acc_t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(*ia), _mm256_mul_ps(d, da), *acc_t);
        }
    }
}

/// Six-bit Q6_K quants: `l`'s low nibbles and `h`'s bits 4 and 5 (a plain
/// function: a closure that failed to inline would lose the target features).
#[inline(always)]
unsafe fn join(l: __m256i, h: __m256i, low: __m256i, high: __m256i) -> __m256i {
    // SAFETY: register-only AVX2 arithmetic.
    unsafe { _mm256_or_si256(_mm256_and_si256(l, low), _mm256_and_si256(h, high)) }
}
