//! Quantized weights: block formats, activation quantization and matmuls
//! that read the stored blocks in place.
//!
//! - [`QMatrix`]: a weight as the GGUF stores it (`rows` rows of `cols`
//!   values, each row a whole number of blocks).
//! - [`matmul`] / [`matmul_many`]: `out = W · x` for `n_tokens` inputs; the
//!   activations are quantized once per call into the block form each
//!   weight type's integer dot takes (`act`), every weight block is read
//!   once for all tokens of a tile (`driver`), and threads split the output
//!   rows over the core's worker pool.
//! - [`dequantize_row`]: one row widened to f32 (embedding lookups).
//! - [`packed_len`] / [`pack`] / [`QMatrix::with_packed`]: a copy of a
//!   weight's whole groups of 16 rows in the layout the lanes kernels load
//!   contiguously (`repack`), made once at load; the matmuls then read
//!   those groups from it (VNNI and AVX2 paths).
//!
//! Accuracy: the integer dots are exact for the quantized activations, so a
//! result differs from the f64 product of the dequantized weights and `x`
//! by at most `Σ_c |W[r,c]| · d(c) / 2` (`d = max|x| / 127` of the value's
//! activation block, 32 values or 256 for the K types) plus f32 summation
//! rounding; float weights (F32, F16, BF16) only have the rounding.
//!
//! The dots run on AVX-512 VNNI when the CPU has it (detected once, `isa`),
//! else AVX2, else the portable integer code; `*_with_isa` forces one (tests,
//! benches).

mod act;
#[cfg(target_arch = "x86_64")]
mod act_x86;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_k;
#[cfg(target_arch = "x86_64")]
mod avx2_lowbit;
#[cfg(target_arch = "x86_64")]
mod avx2_packed;
#[cfg(target_arch = "x86_64")]
mod avx2_packed_k;
mod dequant;
mod driver;
mod isa;
mod kernel;
#[cfg(target_arch = "x86_64")]
mod lanes_k;
mod lowbit;
mod portable;
mod repack;
#[cfg(target_arch = "x86_64")]
mod simd;
mod unpack;
#[cfg(target_arch = "x86_64")]
mod vnni;
#[cfg(target_arch = "x86_64")]
mod vnni_k;
#[cfg(target_arch = "x86_64")]
mod vnni_lanes;
#[cfg(target_arch = "x86_64")]
mod vnni_wide;

pub use dequant::dequantize_row;
pub use isa::{active_isa, QuantIsa};

use crate::error::{EngineError, Result};
use crate::ggml_type::GgmlType;

/// A stored weight: `rows` output rows of `cols` values each, row-major, in
/// `ty`'s blocks (GGUF dims `[cols, rows]`).
#[derive(Debug, Clone, Copy)]
pub struct QMatrix<'a> {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub data: &'a [u8],
    /// The whole groups of [`LANES`] rows packed by [`pack`], which the VNNI
    /// path reads instead of `data` for those rows, for every token count;
    /// other paths and the rows left over read `data`.
    pub packed: Option<&'a [u8]>,
}

/// Rows of a packed group.
pub const LANES: usize = kernel::LANES;

impl<'a> QMatrix<'a> {
    /// A weight over `data`: `Format` when `cols` is not a whole number of
    /// blocks, `InvalidArgument` when `data` is not exactly `rows` rows.
    pub fn new(ty: GgmlType, rows: usize, cols: usize, data: &'a [u8]) -> Result<Self> {
        let m = QMatrix {
            ty,
            rows,
            cols,
            data,
            packed: None,
        };
        m.row_bytes_checked()?;
        Ok(m)
    }

    /// This weight with its groups read from `packed` ([`pack`]'s output
    /// for it): `InvalidArgument` when the type has no packed layout or
    /// `packed` is not [`packed_len`]'s size.
    pub fn with_packed(self, packed: &'a [u8]) -> Result<Self> {
        let m = QMatrix {
            packed: Some(packed),
            ..self
        };
        m.packed_checked()?;
        Ok(m)
    }

    /// Bytes of one packed group when `packed` is set (checked against the
    /// shape: the fields are public).
    pub(crate) fn packed_checked(&self) -> Result<Option<usize>> {
        let Some(p) = self.packed else {
            return Ok(None);
        };
        let gb = repack::group_bytes(self.ty, self.cols).ok_or_else(|| {
            EngineError::InvalidArgument(format!(
                "{} weight of {} cols: no packed layout",
                self.ty.name(),
                self.cols
            ))
        })?;
        let want = (self.rows / LANES).checked_mul(gb);
        if want != Some(p.len()) {
            return Err(EngineError::InvalidArgument(format!(
                "{} weight of {} rows x {} cols: expected {} packed bytes, got {}",
                self.ty.name(),
                self.rows,
                self.cols,
                want.map_or_else(|| "too many".to_string(), |t| t.to_string()),
                p.len()
            )));
        }
        Ok(Some(gb))
    }

    /// Bytes of one row, after checking `data` holds exactly `rows` of them
    /// (the fields are public, so every matmul checks again).
    pub(crate) fn row_bytes_checked(&self) -> Result<usize> {
        let rb = self.ty.row_bytes(self.cols as u64)?;
        let total = rb.checked_mul(self.rows as u64);
        if total != Some(self.data.len() as u64) {
            return Err(EngineError::InvalidArgument(format!(
                "{} weight of {} rows x {} cols: expected {} bytes ({rb} a row), got {}",
                self.ty.name(),
                self.rows,
                self.cols,
                total.map_or_else(|| "too many".to_string(), |t| t.to_string()),
                self.data.len()
            )));
        }
        usize::try_from(rb).map_err(|_| EngineError::InvalidArgument(format!("row of {rb} bytes")))
    }

    /// Row `r`'s bytes.
    pub fn row(&self, r: usize) -> Result<&'a [u8]> {
        let rb = self.row_bytes_checked()?;
        let lo = r.checked_mul(rb);
        lo.and_then(|lo| self.data.get(lo..lo.checked_add(rb)?))
            .ok_or_else(|| {
                EngineError::InvalidArgument(format!("row {r} of a weight with {} rows", self.rows))
            })
    }
}

/// `out[t * w.rows + r] = Σ_c W[r, c] · x[t * w.cols + c]` for `t < n_tokens`.
///
/// `x` holds at least `n_tokens * w.cols` values and `out` at least
/// `n_tokens * w.rows` (only those prefixes are read and written); `threads`
/// parts split the rows (0 counts as 1). A refused call writes nothing.
pub fn matmul(
    w: &QMatrix,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
    threads: usize,
) -> Result<()> {
    matmul_with_isa(QuantIsa::Auto, w, x, n_tokens, out, threads)
}

/// Several weights sharing one input (q/k/v, gate/up), in one pass of the
/// worker pool: each activation form is quantized once for all of them.
/// `outs[i]` takes `ws[i]`'s output as [`matmul`] lays it out; all weights
/// must have the same `cols`.
pub fn matmul_many(
    ws: &[&QMatrix],
    x: &[f32],
    n_tokens: usize,
    outs: &mut [&mut [f32]],
    threads: usize,
) -> Result<()> {
    matmul_many_with_isa(QuantIsa::Auto, ws, x, n_tokens, outs, threads)
}

/// [`matmul`] with the dot kernels of `isa` (`Unsupported` when the CPU lacks it).
pub fn matmul_with_isa(
    isa: QuantIsa,
    w: &QMatrix,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
    threads: usize,
) -> Result<()> {
    driver::run(isa::select(isa)?, &[w], x, n_tokens, &mut [out], threads)
}

/// [`matmul_many`] with the dot kernels of `isa`.
pub fn matmul_many_with_isa(
    isa: QuantIsa,
    ws: &[&QMatrix],
    x: &[f32],
    n_tokens: usize,
    outs: &mut [&mut [f32]],
    threads: usize,
) -> Result<()> {
    driver::run(isa::select(isa)?, ws, x, n_tokens, outs, threads)
}

/// Bytes of the packed copy of a `rows` x `cols` weight of `ty` ([`pack`]),
/// when the active path runs `ty` by packed kernels (AVX-512 VNNI and AVX2:
/// Q4_0, Q4_1, Q5_0, Q8_0, Q4_K and Q6_K) and the
/// weight has at least one whole group of [`LANES`] rows; else `None`.
pub fn packed_len(ty: GgmlType, rows: usize, cols: usize) -> Option<usize> {
    if repack::runs_packed(isa::select(QuantIsa::Auto).ok()?, ty) && rows >= LANES {
        return repack::group_bytes(ty, cols)?.checked_mul(rows / LANES);
    }
    None
}

/// Writes `w`'s whole groups of [`LANES`] rows in the packed layout into
/// `out` (`rows / LANES` groups): `InvalidArgument` when the type has no
/// packed layout or `out` has another length (nothing written then).
pub fn pack(w: &QMatrix, out: &mut [u8]) -> Result<()> {
    let rb = w.row_bytes_checked()?;
    let bad = |what: &str| {
        EngineError::InvalidArgument(format!(
            "pack: {} weight of {} rows x {} cols: {what}",
            w.ty.name(),
            w.rows,
            w.cols
        ))
    };
    let gb = repack::group_bytes(w.ty, w.cols).ok_or_else(|| bad("no packed layout"))?;
    let groups = w.rows / LANES;
    if groups.checked_mul(gb) != Some(out.len()) {
        return Err(bad(&format!(
            "expected {} output bytes, got {}",
            groups.saturating_mul(gb),
            out.len()
        )));
    }
    for (rows, g) in w
        .data
        .chunks_exact(LANES * rb)
        .zip(out.chunks_exact_mut(gb))
    {
        repack::pack(w.ty, rows, rb, w.cols, g).ok_or_else(|| bad("inconsistent lengths"))?;
    }
    Ok(())
}
