//! The register layer the x86 kernels share: one vector type per ISA with the
//! few operations the stored-row kernels need, and one loader per pool dtype
//! that widens `W` stored values of a row in registers (float16 by
//! `vcvtph2ps`, bfloat16 by a 16-bit shift, q8_0 by sign extension times the
//! block's scale).

use crate::dtype::KvDtype;

/// A vector ISA: `W` f32 lanes in `Self::R`.
///
/// # Safety (every method)
/// The CPU supports the ISA; pointers address the documented number of values.
pub(crate) trait Simd: Copy {
    type R: Copy;
    /// f32 lanes per register.
    const W: usize;
    /// Keys per score block (the block is 4 query rows × `KB` keys, `4 * KB`
    /// accumulators, sized to the register file).
    const KB: usize;
    unsafe fn zero() -> Self::R;
    unsafe fn loadu(p: *const f32) -> Self::R;
    unsafe fn storeu(p: *mut f32, x: Self::R);
    unsafe fn set1(x: f32) -> Self::R;
    /// `a * b + c`, fused.
    unsafe fn fmadd(a: Self::R, b: Self::R, c: Self::R) -> Self::R;
    /// Lane-wise horizontal sums of the first `4 * KB` registers into `out`.
    unsafe fn hsum(acc: &[Self::R; 16], out: &mut [f32; 16]);
    /// `W` float16 values at `p`.
    unsafe fn f16(p: *const u8) -> Self::R;
    /// `W` bfloat16 values at `p`.
    unsafe fn bf16(p: *const u8) -> Self::R;
    /// The float16 scale with bits `d` in every lane.
    unsafe fn q8_scale(d: u16) -> Self::R;
    /// `W` int8 values at `q` times `scale` (from [`Simd::q8_scale`]).
    unsafe fn q8_mul(scale: Self::R, q: *const u8) -> Self::R;
    /// `W` int8 values at `q` times the float16 scale with bits `d`.
    #[inline(always)]
    unsafe fn q8(d: u16, q: *const u8) -> Self::R {
        // SAFETY: the trait contract.
        unsafe { Self::q8_mul(Self::q8_scale(d), q) }
    }

    /// Whether [`Simd::q8_dots`] computes q8_0 key scores by integer dots.
    const INT8: bool = false;
    /// `out[i * KB + jj]` = score of query row `i < R` (quantized at `q8` by
    /// the ISA's `quantize_q`) with the q8_0 key row `kp[jj]`, `jj < KB`.
    ///
    /// # Safety
    /// `INT8`; `q8` from `quantize_q` for at least `R` rows of `hd`; each
    /// `kp[jj]` a whole q8_0 row of `hd`.
    #[inline(always)]
    unsafe fn q8_dots<const R: usize>(
        _q8: *const u8,
        _kp: &[*const u8; 4],
        _hd: usize,
        _out: &mut [f32; 16],
    ) {
    }
}

/// Widens `S::W` stored values of one row in registers.
pub(crate) trait Load: Copy {
    /// Rows are q8_0 blocks (integer dots may serve them).
    const Q8: bool = false;
    /// Values `[d, d + W)` of the row at `row`.
    ///
    /// # Safety
    /// `row` addresses a whole stored row; `d + W <= hd`, `d % W == 0`; the
    /// CPU supports `S`.
    unsafe fn load<S: Simd>(row: *const u8, d: usize) -> S::R;
    /// Values `[d, d + 2W)` of the row at `row`, as two registers.
    ///
    /// # Safety
    /// As [`Load::load`], with `d + 2W <= hd` and `d % 2W == 0`.
    #[inline(always)]
    unsafe fn load2<S: Simd>(row: *const u8, d: usize) -> (S::R, S::R) {
        // SAFETY: the contract above covers both halves.
        unsafe { (Self::load::<S>(row, d), Self::load::<S>(row, d + S::W)) }
    }
}

#[derive(Clone, Copy)]
pub(crate) struct LF32;
#[derive(Clone, Copy)]
pub(crate) struct LF16;
#[derive(Clone, Copy)]
pub(crate) struct LBf16;
#[derive(Clone, Copy)]
pub(crate) struct LQ8;

impl Load for LF32 {
    #[inline(always)]
    unsafe fn load<S: Simd>(row: *const u8, d: usize) -> S::R {
        // SAFETY: contract of `load`.
        unsafe { S::loadu(row.cast::<f32>().add(d)) }
    }
}

impl Load for LF16 {
    #[inline(always)]
    unsafe fn load<S: Simd>(row: *const u8, d: usize) -> S::R {
        // SAFETY: contract of `load` (2W bytes at 2d).
        unsafe { S::f16(row.add(2 * d)) }
    }
}

impl Load for LBf16 {
    #[inline(always)]
    unsafe fn load<S: Simd>(row: *const u8, d: usize) -> S::R {
        // SAFETY: contract of `load` (2W bytes at 2d).
        unsafe { S::bf16(row.add(2 * d)) }
    }
}

impl Load for LQ8 {
    const Q8: bool = true;
    #[inline(always)]
    unsafe fn load<S: Simd>(row: *const u8, d: usize) -> S::R {
        // SAFETY: contract of `load`: block d / 32 (34 bytes) lies in the row,
        // and its W values at d % 32 (W divides 32) follow the 2-byte scale.
        unsafe {
            let blk = row.add(d / 32 * 34);
            S::q8(blk.cast::<u16>().read_unaligned(), blk.add(2 + d % 32))
        }
    }
    /// One scale widening for both halves: `2W` divides 32 (AVX2 16, AVX-512
    /// 32) and `d % 2W == 0`, so both lie in block `d / 32`.
    #[inline(always)]
    unsafe fn load2<S: Simd>(row: *const u8, d: usize) -> (S::R, S::R) {
        // SAFETY: contract of `load2`: block d / 32 holds values d..d + 2W.
        unsafe {
            let blk = row.add(d / 32 * 34);
            let scale = S::q8_scale(blk.cast::<u16>().read_unaligned());
            let q = blk.add(2 + d % 32);
            (S::q8_mul(scale, q), S::q8_mul(scale, q.add(S::W)))
        }
    }
}

/// Widens `n_rows` stored rows of `dtype` into `dst`: in registers when `hd`
/// is whole vectors, else by the portable bit arithmetic.
///
/// # Safety
/// `src` holds `n_rows` rows of `dtype.row_bytes(hd)` bytes, `dst` `n_rows *
/// hd` floats; the CPU supports `S`.
#[inline(always)]
pub(crate) unsafe fn widen_rows<S: Simd>(
    dtype: KvDtype,
    src: *const u8,
    n_rows: usize,
    hd: usize,
    dst: *mut f32,
) {
    // SAFETY: forwarded contract; the register loaders only for hd % W == 0.
    unsafe {
        if !hd.is_multiple_of(S::W) {
            return super::widen::decode_rows_portable(dtype, src, n_rows, hd, dst);
        }
        match dtype {
            KvDtype::Float32 => widen::<S, LF32>(src, dtype.row_bytes(hd), n_rows, hd, dst),
            KvDtype::Float16 => widen::<S, LF16>(src, dtype.row_bytes(hd), n_rows, hd, dst),
            KvDtype::Bfloat16 => widen::<S, LBf16>(src, dtype.row_bytes(hd), n_rows, hd, dst),
            KvDtype::Q8_0 => widen::<S, LQ8>(src, dtype.row_bytes(hd), n_rows, hd, dst),
        }
    }
}

#[inline(always)]
unsafe fn widen<S: Simd, L: Load>(
    src: *const u8,
    rb: usize,
    n_rows: usize,
    hd: usize,
    dst: *mut f32,
) {
    for r in 0..n_rows {
        let mut d = 0;
        while d < hd {
            // SAFETY: row r of src and of dst, W values at d < hd.
            unsafe { S::storeu(dst.add(r * hd + d), L::load::<S>(src.add(r * rb), d)) };
            d += S::W;
        }
    }
}
