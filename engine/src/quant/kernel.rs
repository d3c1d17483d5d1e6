//! The trait every matmul kernel implements, kept apart from the driver so
//! the kernels depend on it and the driver depends on the kernels, not back.

use super::act::Act;
use crate::ggml_type::GgmlType;

/// Rows a lanes kernel takes at once (one per int32 lane of 512 bits).
pub(super) const LANES: usize = 16;

/// One stored row against `T` tokens' activations.
pub(super) trait Kernel {
    fn dots<const T: usize>(ty: GgmlType, row: &[u8], a: &[Act<'_>; T]) -> Option<[f32; T]>;

    /// `R` rows against the same tokens; by default one row at a time.
    #[inline(always)]
    fn dots_rows<const R: usize, const T: usize>(
        ty: GgmlType,
        rows: &[&[u8]; R],
        a: &[Act<'_>; T],
    ) -> Option<[[f32; T]; R]> {
        row_by_row::<Self, R, T>(ty, rows, a)
    }

    /// `LANES` consecutive rows (`rows`: their bytes, `rb` a row) against
    /// `T` tokens, `out[t][r]`, by a kernel with rows in the lanes (batched
    /// steps; the driver asks only where `vnni_lanes::supports` the type);
    /// `None` for a type without one or a bad length.
    #[inline(always)]
    fn dots_lanes<const T: usize>(
        _ty: GgmlType,
        _rows: &[u8],
        _rb: usize,
        _a: &[Act<'_>; T],
        _cols: usize,
    ) -> Option<[[f32; LANES]; T]> {
        None
    }

    /// A group packed at load (`repack`) of `LANES` rows of `cols` values
    /// against `T` tokens, `out[t][r]`; `None` for a path without packed
    /// kernels (the driver asks only on the VNNI path) or a bad length.
    #[inline(always)]
    fn dots_packed<const T: usize>(
        _ty: GgmlType,
        _group: &[u8],
        _a: &[Act<'_>; T],
        _cols: usize,
    ) -> Option<[[f32; LANES]; T]> {
        None
    }
}

/// `R` rows one at a time by `K::dots`: the default `dots_rows`, and what a
/// kernel's own `dots_rows` falls back to where it has no many-row path.
#[inline(always)]
pub(super) fn row_by_row<K: Kernel + ?Sized, const R: usize, const T: usize>(
    ty: GgmlType,
    rows: &[&[u8]; R],
    a: &[Act<'_>; T],
) -> Option<[[f32; T]; R]> {
    let mut out = [[0f32; T]; R];
    for (o, row) in out.iter_mut().zip(rows) {
        *o = K::dots::<T>(ty, row, a)?;
    }
    Some(out)
}
