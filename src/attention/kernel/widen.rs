//! Portable widening of stored float16, bfloat16 and q8_0 rows to f32 for the
//! kernels that read through a scratch tile.

use crate::dtype::KvDtype;
use crate::half::{bf16_to_f32, f16_le};

/// Portable widening of stored rows (bit arithmetic; see `crate::half`).
#[inline(always)]
pub(super) fn decode_portable(dtype: KvDtype, src: &[u8], dst: &mut [f32]) {
    match dtype {
        KvDtype::Float32 => {
            for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
            }
        }
        KvDtype::Bfloat16 => {
            for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = bf16_to_f32(u16::from_le_bytes([s[0], s[1]]));
            }
        }
        KvDtype::Float16 => {
            for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = f16_le([s[0], s[1]]);
            }
        }
        KvDtype::Q8_0 => {
            for (d, s) in dst.chunks_exact_mut(32).zip(src.chunks_exact(34)) {
                let scale = f16_le([s[0], s[1]]);
                for (x, q) in d.iter_mut().zip(&s[2..]) {
                    *x = scale * (*q as i8) as f32;
                }
            }
        }
    }
}

/// [`decode_portable`] over raw pointers: `n_rows` rows of `dtype` at `src`
/// into `n_rows * hd` floats at `dst`.
///
/// # Safety
/// `src` holds `n_rows * dtype.row_bytes(hd)` bytes, `dst` `n_rows * hd` floats.
#[inline(always)]
pub(super) unsafe fn decode_rows_portable(
    dtype: KvDtype,
    src: *const u8,
    n_rows: usize,
    hd: usize,
    dst: *mut f32,
) {
    let rb = dtype.row_bytes(hd);
    // SAFETY: sizes per the contract.
    let (src, dst) = unsafe {
        (
            std::slice::from_raw_parts(src, n_rows.saturating_mul(rb)),
            std::slice::from_raw_parts_mut(dst, n_rows.saturating_mul(hd)),
        )
    };
    decode_portable(dtype, src, dst);
}
