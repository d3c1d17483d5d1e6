//! The AVX-512 VNNI kernels: the 32-value block types in `vnni_wide` (two
//! blocks a 512-bit register: a matvec, and the rows a batch leaves over)
//! and `vnni_lanes` (16 rows a register: batched steps, and the groups
//! `repack` packed at load, which run there for every step), Q4_K and Q6_K in
//! `vnni_k`; Q5_1, Q5_K, Q8_K, Q2_K, Q3_K, the IQ4 types and the float
//! types run the AVX2 kernels, compiled here with the wider feature set.
//!
//! `vpdpbusd` multiplies unsigned weight bytes by signed activation bytes
//! and adds groups of four straight into int32 lanes, so there is no int16
//! step to saturate. Signed weights enter with an offset that makes them
//! unsigned (Q4_0 `q + 8`, Q5_0 `q + 16`, Q8_0 `q + 128` as `q ^ 0x80`);
//! the offset's product `o · Σy` is taken off by starting the block's int32
//! accumulator at `−o · Σy`, itself one `vpdpbusd` of the activations with a
//! constant, shared by all rows of the pass. The block's int32 dot then takes
//! its f32 scale in an FMA into a float accumulator per (row, token).
//!
//! All kernels are `#[inline(always)]` and only reached from
//! `driver::compute_vnni`, compiled with avx2, fma, f16c, avx512f/bw/vl and
//! avx512vnni.

use super::act::Act;
use super::avx2::Avx2;
use super::kernel::{Kernel, LANES};
use super::simd::check_rows;
use super::vnni_wide::q32x;
use crate::ggml_type::GgmlType;

/// The AVX-512 VNNI kernels (see the module docs for when they may run).
pub(super) struct Vnni;

impl Kernel for Vnni {
    #[inline(always)]
    fn dots_lanes<const T: usize>(
        ty: GgmlType,
        rows: &[u8],
        rb: usize,
        a: &[Act<'_>; T],
        cols: usize,
    ) -> Option<[[f32; LANES]; T]> {
        // SAFETY: only reached from `driver::compute_vnni` (module docs).
        unsafe { super::vnni_lanes::dots::<T>(ty, rows, rb, a, cols) }
    }

    #[inline(always)]
    fn dots_packed<const T: usize>(
        ty: GgmlType,
        group: &[u8],
        a: &[Act<'_>; T],
        cols: usize,
    ) -> Option<[[f32; LANES]; T]> {
        // SAFETY: only reached from `driver::compute_vnni` (module docs).
        unsafe { super::repack::dots::<T>(ty, group, a, cols) }
    }

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
        let cols = check_rows(ty, rows, a)?;
        // SAFETY: `check` verified every row holds exactly `cols` values of
        // `ty` and every token's views hold `cols` values, their scales and
        // sums; the CPU has the module's features (module docs).
        unsafe {
            Some(match ty {
                // Two blocks a register (`vnni_wide`), for every token count
                // this path takes (one summation order per row).
                GgmlType::Q4_0 => q32x::<R, T, 0>(rows, a, cols),
                GgmlType::Q4_1 => q32x::<R, T, 1>(rows, a, cols),
                GgmlType::Q5_0 => q32x::<R, T, 2>(rows, a, cols),
                GgmlType::Q8_0 => q32x::<R, T, 4>(rows, a, cols),
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
