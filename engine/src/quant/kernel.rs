//! The trait every matmul kernel implements, kept apart from the driver so
//! the kernels depend on it and the driver depends on the kernels, not back.

use super::act::Act;
use crate::ggml_type::GgmlType;

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
        let mut out = [[0f32; T]; R];
        for (o, row) in out.iter_mut().zip(rows) {
            *o = Self::dots::<T>(ty, row, a)?;
        }
        Some(out)
    }
}
