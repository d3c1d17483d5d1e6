//! Reading float16, bfloat16 and q8_0 rows as stored on the AVX-512 path:
//! loaders that widen 16 values at a time in registers, the pipelined decode
//! step over stored rows, and tile widening for the other shapes.

use super::{hsum16, KT, PG};
use crate::dtype::KvDtype;
use std::arch::x86_64::*;

/// Widens 16 stored values of one row in registers.
pub(crate) trait Load: Copy {
    /// Values `[d, d + 16)` of the row at `row`.
    ///
    /// # Safety
    /// `row` addresses a whole stored row; `d + 16 <= hd`, `d % 16 == 0`; AVX-512F.
    unsafe fn load16(row: *const u8, d: usize) -> __m512;
}

#[derive(Clone, Copy)]
pub(super) struct LF32;
#[derive(Clone, Copy)]
pub(super) struct LF16;
#[derive(Clone, Copy)]
pub(super) struct LBf16;
#[derive(Clone, Copy)]
pub(super) struct LQ8;

impl Load for LF32 {
    #[inline(always)]
    unsafe fn load16(row: *const u8, d: usize) -> __m512 {
        // SAFETY: contract of `load16`.
        unsafe { _mm512_loadu_ps(row.cast::<f32>().add(d)) }
    }
}

impl Load for LF16 {
    #[inline(always)]
    unsafe fn load16(row: *const u8, d: usize) -> __m512 {
        // SAFETY: contract of `load16` (32 bytes at 2d).
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(row.add(2 * d).cast())) }
    }
}

impl Load for LBf16 {
    #[inline(always)]
    unsafe fn load16(row: *const u8, d: usize) -> __m512 {
        // SAFETY: contract of `load16`; bfloat16 widens by a 16-bit shift.
        unsafe {
            let h = _mm512_cvtepu16_epi32(_mm256_loadu_si256(row.add(2 * d).cast()));
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(h))
        }
    }
}

impl Load for LQ8 {
    #[inline(always)]
    unsafe fn load16(row: *const u8, d: usize) -> __m512 {
        // SAFETY: contract of `load16`: block d / 32 (34 bytes) lies in the row,
        // and its 16 values at d % 32 follow the 2-byte scale.
        unsafe {
            let blk = row.add(d / 32 * 34);
            let bits = blk.cast::<u16>().read_unaligned();
            let scale = _mm512_cvtph_ps(_mm256_set1_epi16(bits as i16));
            let q = _mm_loadu_si128(blk.add(2 + d % 32).cast());
            _mm512_mul_ps(scale, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)))
        }
    }
}

/// Prefetches one stored row a tile (`KT` rows) ahead, into L2.
#[inline(always)]
unsafe fn prefetch_row(row: *const u8, rb: usize) {
    let ahead = row.wrapping_add(KT * rb);
    let mut o = 0;
    while o < rb {
        // SAFETY: a prefetch never faults; the address is only computed.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(o).cast::<i8>()) };
        o += 64;
    }
}

/// The pipelined decode step (as `scores_pv_rows`) over stored K/V rows:
/// each 16-value chunk is widened in registers right where it is used.
///
/// # Safety
/// As [`Isa::scores_pv_stored`](super::Isa::scores_pv_stored) with `nr == R <= 4`, `hd % 16 == 0`; AVX-512F.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn stored_rows<const R: usize, K: Load, V: Load>(
    qs: *const f32,
    k: *const u8,
    krb: usize,
    nk: usize,
    sc: *mut f32,
    p: *const f32,
    v: *const u8,
    vrb: usize,
    nkp: usize,
    hd: usize,
    acc: *mut f32,
) {
    let qp: [*const f32; 4] = core::array::from_fn(|i| qs.wrapping_add(i.min(R - 1) * hd));
    let mut g = 0;
    // SAFETY (whole loop): rows clamped into k / v, offsets < hd, R rows of
    // p / acc / sc (contract of `scores_pv_stored`).
    unsafe {
        while g < nk.max(nkp) {
            let mut j0 = g;
            while j0 < nk.min(g + PG) {
                let kp: [*const u8; 4] =
                    core::array::from_fn(|i| k.wrapping_add((j0 + i).min(nk - 1) * krb));
                let mut a = [_mm512_setzero_ps(); 16];
                let mut d = 0;
                while d < hd {
                    let q: [__m512; 4] = core::array::from_fn(|i| _mm512_loadu_ps(qp[i].add(d)));
                    for jj in 0..4 {
                        let kv = K::load16(kp[jj], d);
                        for i in 0..4 {
                            a[i * 4 + jj] = _mm512_fmadd_ps(q[i], kv, a[i * 4 + jj]);
                        }
                    }
                    d += 16;
                }
                for r in kp {
                    prefetch_row(r, krb);
                }
                let mut sums = [0.0f32; 16];
                _mm512_storeu_ps(sums.as_mut_ptr(), hsum16(&a));
                for i in 0..R {
                    for jj in 0..4.min(nk - j0) {
                        *sc.add(i * KT + j0 + jj) = sums[i * 4 + jj];
                    }
                }
                j0 += 4;
            }
            if g < nkp {
                let n = (nkp - g).min(PG);
                for j in g..g + n {
                    prefetch_row(v.add(j * vrb), vrb);
                }
                let mut d = 0;
                while d < hd {
                    let mut a: [__m512; R] =
                        core::array::from_fn(|i| _mm512_loadu_ps(acc.add(i * hd + d)));
                    for j in g..g + n {
                        let x = V::load16(v.add(j * vrb), d);
                        for (i, ai) in a.iter_mut().enumerate() {
                            *ai = _mm512_fmadd_ps(_mm512_set1_ps(*p.add(i * KT + j)), x, *ai);
                        }
                    }
                    for (i, ai) in a.iter().enumerate() {
                        _mm512_storeu_ps(acc.add(i * hd + d), *ai);
                    }
                    d += 16;
                }
            }
            g += PG;
        }
    }
}

/// `stored_rows` for the runtime row count.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn stored_r<K: Load, V: Load>(
    qs: *const f32,
    nr: usize,
    k: *const u8,
    krb: usize,
    nk: usize,
    sc: *mut f32,
    p: *const f32,
    v: *const u8,
    vrb: usize,
    nkp: usize,
    hd: usize,
    acc: *mut f32,
) {
    // SAFETY: forwarded contract (nr <= 4).
    unsafe {
        match nr {
            1 => stored_rows::<1, K, V>(qs, k, krb, nk, sc, p, v, vrb, nkp, hd, acc),
            2 => stored_rows::<2, K, V>(qs, k, krb, nk, sc, p, v, vrb, nkp, hd, acc),
            3 => stored_rows::<3, K, V>(qs, k, krb, nk, sc, p, v, vrb, nkp, hd, acc),
            _ => stored_rows::<4, K, V>(qs, k, krb, nk, sc, p, v, vrb, nkp, hd, acc),
        }
    }
}

/// `stored_r` with V's loader chosen at run time.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn stored_v<K: Load>(
    qs: *const f32,
    nr: usize,
    k: *const u8,
    krb: usize,
    nk: usize,
    sc: *mut f32,
    p: *const f32,
    v: *const u8,
    vd: KvDtype,
    nkp: usize,
    hd: usize,
    acc: *mut f32,
) {
    let vrb = vd.row_bytes(hd);
    // SAFETY: forwarded contract.
    unsafe {
        match vd {
            KvDtype::Float32 => {
                stored_r::<K, LF32>(qs, nr, k, krb, nk, sc, p, v, vrb, nkp, hd, acc)
            }
            KvDtype::Float16 => {
                stored_r::<K, LF16>(qs, nr, k, krb, nk, sc, p, v, vrb, nkp, hd, acc)
            }
            KvDtype::Bfloat16 => {
                stored_r::<K, LBf16>(qs, nr, k, krb, nk, sc, p, v, vrb, nkp, hd, acc)
            }
            KvDtype::Q8_0 => stored_r::<K, LQ8>(qs, nr, k, krb, nk, sc, p, v, vrb, nkp, hd, acc),
        }
    }
}

/// Widens `n_rows` stored rows into `dst` with `L`'s register loads.
///
/// # Safety
/// `src` holds `n_rows` rows of `rb` bytes, `dst` `n_rows * hd` floats,
/// `hd % 16 == 0`; AVX-512F.
#[inline(always)]
pub(super) unsafe fn widen_rows<L: Load>(
    src: *const u8,
    rb: usize,
    n_rows: usize,
    hd: usize,
    dst: *mut f32,
) {
    for r in 0..n_rows {
        let mut d = 0;
        while d < hd {
            // SAFETY: row r of src and of dst, 16 values at d < hd.
            unsafe { _mm512_storeu_ps(dst.add(r * hd + d), L::load16(src.add(r * rb), d)) };
            d += 16;
        }
    }
}
