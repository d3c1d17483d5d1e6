//! The x86 helpers shared by the AVX2 and VNNI kernels: the bounds check
//! every kernel relies on and the small register-level pieces (horizontal
//! sum, f16 load, unsigned × signed byte dot). Kept below every kernel module
//! so the kernels depend on it and not on each other.
//!
//! Like the kernels, these are only reached from the driver's functions
//! compiled with avx2, fma and f16c.

use super::act::{Act, ActKind};
use crate::ggml_type::GgmlType;
use std::arch::x86_64::*;

/// Bytes of a block of the 32-value type coded `k` as the VNNI kernels code
/// them (`vnni_wide`, `vnni_lanes`): 0 Q4_0, 1 Q4_1, 2 Q5_0, 4 Q8_0.
pub(super) const fn q32_block_bytes(k: u8) -> usize {
    match k {
        0 => 18,
        1 => 20,
        2 => 22,
        _ => 34,
    }
}

/// What makes the weights of type `k` (as [`q32_block_bytes`]) unsigned
/// bytes: `q + o` (Q4_0 8, Q5_0 16, Q8_0 128 by flipping the sign bit;
/// Q4_1's are unsigned).
pub(super) const fn q32_offset(k: u8) -> i32 {
    match k {
        0 => 8,
        1 => 0,
        2 => 16,
        _ => 128,
    }
}

/// `check` for each of `rows` against the same tokens; their width (from
/// the first token) when all pass.
pub(super) fn check_rows<const R: usize, const T: usize>(
    ty: GgmlType,
    rows: &[&[u8]; R],
    a: &[Act<'_>; T],
) -> Option<usize> {
    let cols = a.first()?.x.len();
    for row in rows {
        check(ty, row, a, cols)?;
    }
    Some(cols)
}

/// The one bounds check the kernels rely on.
pub(super) fn check<const T: usize>(
    ty: GgmlType,
    row: &[u8],
    a: &[Act<'_>; T],
    cols: usize,
) -> Option<()> {
    if ty.row_bytes(cols as u64).ok()? != row.len() as u64 {
        return None;
    }
    let bl = ty.block_len();
    // The activation's parts the type's kernels read: one answer with `act`'s.
    let ok = a.iter().all(|a| match ActKind::of(ty) {
        ActKind::F32 => a.x.len() == cols,
        ActKind::Q8K => {
            a.x.len() == cols
                && a.qs.len() >= cols
                && a.d.len() >= cols / bl
                && a.bs.len() >= cols / 16
        }
        ActKind::Q8 => {
            a.x.len() == cols
                && a.qs.len() >= cols
                && a.d.len() >= cols / bl
                && a.s.len() >= cols / bl
        }
    });
    ok.then_some(())
}

#[inline(always)]
pub(super) unsafe fn hsum(v: __m256) -> f32 {
    // SAFETY: register-only AVX arithmetic.
    unsafe {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
    }
}

/// The f16 at `p` (unaligned) as f32, by F16C.
#[inline(always)]
pub(super) unsafe fn half_at(p: *const u8) -> f32 {
    // SAFETY: the caller's 2 bytes at `p`; F16C per the module docs.
    unsafe {
        let h = p.cast::<u16>().read_unaligned().to_le();
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(h))))
    }
}

/// Σ u·s over 32 byte pairs as eight int32 (`u` unsigned, `s` signed).
#[inline(always)]
pub(super) unsafe fn dot_us(u: __m256i, s: __m256i) -> __m256i {
    // SAFETY: register-only AVX2 arithmetic.
    unsafe { _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)) }
}
