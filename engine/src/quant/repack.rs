//! Weights repacked at load for the lanes kernels: each group of
//! [`LANES`] consecutive rows becomes one record in which every register the
//! kernel needs is one contiguous load, instead of 16 loads (or a gather)
//! over rows a row's bytes apart. Same bytes as the rows it packs, only
//! reordered; the driver runs a packed weight's whole groups by the packed
//! kernels for every token count, and the rows a weight leaves over
//! (`rows % LANES`) in place.
//!
//! Types: the 32-value block types here ([`q32`]), Q4_K and Q6_K in
//! `lanes_k`. Packing is portable code; the kernels run on the VNNI path
//! (`vnni_lanes`, `lanes_k`) and the AVX2 path (`avx2_packed`,
//! `avx2_packed_k`): [`runs_packed`] says which.

use super::act::Act;
use super::isa::Path;
use super::kernel::LANES;
use crate::ggml_type::GgmlType;

/// Whether `path` has packed kernels for `ty` (and so packs it at load and
/// reads its packed groups).
pub(super) fn runs_packed(path: Path, ty: GgmlType) -> bool {
    match path {
        Path::Portable => false,
        #[cfg(target_arch = "x86_64")]
        Path::Avx2 => group_bytes(ty, 256).is_some(),
        #[cfg(target_arch = "x86_64")]
        Path::Vnni => group_bytes(ty, 256).is_some(),
    }
}

/// Bytes of one packed group of `LANES` rows of `ty` with `cols` values;
/// `None` when `ty` has no packed kernel or `cols` does not fit it.
pub(super) fn group_bytes(ty: GgmlType, cols: usize) -> Option<usize> {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q8_0 => {
            q32::group_bytes(ty, cols)
        }
        #[cfg(target_arch = "x86_64")]
        GgmlType::Q4_K | GgmlType::Q6_K => super::lanes_k::group_bytes(ty, cols),
        _ => None,
    }
}

/// Packs `LANES` consecutive stored rows (`rows`: `LANES * rb` bytes) into
/// `out` (exactly [`group_bytes`] long). The lengths are checked once, by
/// `quant::pack`; here a mismatch only stops at the first access out of
/// range (`None`).
pub(super) fn pack(
    ty: GgmlType,
    rows: &[u8],
    rb: usize,
    cols: usize,
    out: &mut [u8],
) -> Option<()> {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q8_0 => {
            q32::pack(ty, rows, rb, cols, out)
        }
        #[cfg(target_arch = "x86_64")]
        GgmlType::Q4_K | GgmlType::Q6_K => super::lanes_k::pack(ty, rows, rb, out),
        _ => None,
    }
}

/// A packed group against `T` tokens: `out[t][r]`, the same summation order
/// for every `T`.
///
/// # Safety
/// The CPU has avx2, fma, f16c, avx512f/bw/vl and avx512vnni.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) unsafe fn dots<const T: usize>(
    ty: GgmlType,
    group: &[u8],
    a: &[Act<'_>; T],
    cols: usize,
) -> Option<[[f32; LANES]; T]> {
    match ty {
        // SAFETY: the caller's CPU features.
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q8_0 => unsafe {
            super::vnni_lanes::packed_dots::<T>(ty, group, a, cols)
        },
        // SAFETY: the caller's CPU features.
        GgmlType::Q4_K | GgmlType::Q6_K => unsafe { super::lanes_k::dots::<T>(ty, group, a, cols) },
        _ => None,
    }
}

/// The 32-value block types' group: all blocks' quants, then Q5_0's high
/// bits, then the scales, each block a fixed-size record:
///
/// - quants: register `g` of the lanes kernel, 64 bytes: row `r`'s four
///   bytes at `4r`. Q8_0: `g < 8`, bytes `4g..4g + 4` of the row's quants
///   with the sign bit flipped (the kernel's unsigned form); the nibble
///   types: `g < 4`, bytes `4g..4g + 4` of the row's 16 nibble bytes (the
///   kernel splits low and high nibbles).
/// - Q5_0's high bits: the 16 rows' `qh` dwords (64 bytes).
/// - scales: the 16 rows' f16 `d` (32 bytes); Q4_1 the 16 rows' `d | m << 16`
///   dwords (64 bytes).
pub(super) mod q32 {
    use super::{Act, LANES};
    use crate::ggml_type::GgmlType;

    /// The kernels' code of a 32-value type (`simd::q32_block_bytes`).
    pub(crate) fn code(ty: GgmlType) -> Option<u8> {
        match ty {
            GgmlType::Q4_0 => Some(0),
            GgmlType::Q4_1 => Some(1),
            GgmlType::Q5_0 => Some(2),
            GgmlType::Q8_0 => Some(4),
            _ => None,
        }
    }

    /// Quant bytes of a block's record.
    pub(crate) const fn quant_bytes(k: u8) -> usize {
        if k == 4 {
            32 * LANES
        } else {
            16 * LANES
        }
    }

    /// High-bit bytes of a block's record (Q5_0 only).
    pub(crate) const fn high_bytes(k: u8) -> usize {
        if k == 2 {
            4 * LANES
        } else {
            0
        }
    }

    /// Scale bytes of a block's record.
    pub(crate) const fn scale_bytes(k: u8) -> usize {
        if k == 1 {
            4 * LANES
        } else {
            2 * LANES
        }
    }

    /// The check every packed kernel of these types relies on: `group` is
    /// exactly one group of `ty` with `cols` values a row and each token holds
    /// `cols` quants and a scale, a sum and an integer sum per block; the
    /// blocks of a row when it passes.
    pub(crate) fn fits(ty: GgmlType, group: &[u8], a: &[Act<'_>], cols: usize) -> Option<usize> {
        if group_bytes(ty, cols)? != group.len() {
            return None;
        }
        let blocks = cols / 32;
        a.iter()
            .all(|a| {
                a.qs.len() >= cols
                    && a.d.len() >= blocks
                    && a.s.len() >= blocks
                    && a.bs.len() >= blocks
            })
            .then_some(blocks)
    }

    pub(crate) fn group_bytes(ty: GgmlType, cols: usize) -> Option<usize> {
        let k = code(ty)?;
        if cols == 0 || !cols.is_multiple_of(32) {
            return None;
        }
        (cols / 32).checked_mul(quant_bytes(k) + high_bytes(k) + scale_bytes(k))
    }

    pub(crate) fn pack(
        ty: GgmlType,
        rows: &[u8],
        rb: usize,
        cols: usize,
        out: &mut [u8],
    ) -> Option<()> {
        let k = code(ty)?;
        let blocks = cols / 32;
        let bb = rb / blocks;
        let (qb, hb, sb) = (quant_bytes(k), high_bytes(k), scale_bytes(k));
        let (quants, rest) = out.split_at_mut(blocks * qb);
        let (highs, scales) = rest.split_at_mut(blocks * hb);
        // Where a block's quants start: after d (2), Q4_1's m, Q5_0's qh.
        let qs_at = match k {
            0 | 4 => 2,
            1 => 4,
            _ => 6,
        };
        let dwords = quant_bytes(k) / (4 * LANES);
        for (r, row) in rows.chunks_exact(rb).enumerate() {
            for (b, blk) in row.chunks_exact(bb).enumerate() {
                let q = quants.get_mut(b * qb..(b + 1) * qb)?;
                for g in 0..dwords {
                    let src = blk.get(qs_at + 4 * g..qs_at + 4 * g + 4)?;
                    let dst = q.get_mut(64 * g + 4 * r..64 * g + 4 * r + 4)?;
                    for (d, &s) in dst.iter_mut().zip(src) {
                        *d = if k == 4 { s ^ 0x80 } else { s };
                    }
                }
                if k == 2 {
                    let dst = highs.get_mut(b * hb + 4 * r..b * hb + 4 * r + 4)?;
                    dst.copy_from_slice(blk.get(2..6)?);
                }
                let head = if k == 1 { 4 } else { 2 };
                let at = b * sb + head * r;
                scales
                    .get_mut(at..at + head)?
                    .copy_from_slice(blk.get(..head)?);
            }
        }
        Some(())
    }
}
