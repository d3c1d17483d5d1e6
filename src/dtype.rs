//! Storage types of the K/V pools and the one rounding each applies on write.
//!
//! * `Float32`: IEEE single, 4 bytes per value.
//! * `Float16`: IEEE half, rounded to nearest even from f32, 2 bytes.
//! * `Bfloat16`: the top half of an f32, rounded to nearest even, 2 bytes.
//! * `Q8_0`: GGML's `block_q8_0`, byte-compatible: per 32 consecutive values
//!   of a row, an fp16 scale `d = max|x| / 127` then 32 `i8` `q = round(x / d)`
//!   (half away from zero): 34 bytes per 32 values. A row is a whole number of
//!   blocks, so every row is self-contained.
//!
//! Codes ([`KvDtype::code`]) are append-only: snapshots store them.

use crate::error::{CacheError, Result};
// The half conversions' home is `crate::half`; their old paths here keep working.
use crate::half::f16_le;
pub use crate::half::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};

/// Values per q8_0 block.
pub const QK8_0: usize = 32;
/// Bytes per q8_0 block: the fp16 scale and 32 `i8`.
pub const Q8_0_BLOCK_BYTES: usize = 34;

/// How a pool stores its values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum KvDtype {
    #[default]
    Float32,
    Float16,
    Bfloat16,
    Q8_0,
}

impl KvDtype {
    /// Every dtype, in code order.
    pub const ALL: [KvDtype; 4] = [
        KvDtype::Float32,
        KvDtype::Float16,
        KvDtype::Bfloat16,
        KvDtype::Q8_0,
    ];

    /// Stable serialised discriminant: 0 float32, 1 float16, 2 bfloat16, 3 q8_0. Append-only.
    pub fn code(self) -> u8 {
        match self {
            KvDtype::Float32 => 0,
            KvDtype::Float16 => 1,
            KvDtype::Bfloat16 => 2,
            KvDtype::Q8_0 => 3,
        }
    }

    /// The dtype of a [`KvDtype::code`], `None` for an unknown code.
    pub fn from_code(code: u8) -> Option<KvDtype> {
        KvDtype::ALL.into_iter().find(|d| d.code() == code)
    }

    /// The name DESIGN.md and the Python surface use.
    pub fn name(self) -> &'static str {
        match self {
            KvDtype::Float32 => "float32",
            KvDtype::Float16 => "float16",
            KvDtype::Bfloat16 => "bfloat16",
            KvDtype::Q8_0 => "q8_0",
        }
    }

    /// Parses a name; an unknown one is `InvalidConfig` naming the choices.
    pub fn parse(name: &str) -> Result<KvDtype> {
        KvDtype::ALL
            .into_iter()
            .find(|d| d.name() == name)
            .ok_or_else(|| {
                CacheError::InvalidConfig(format!(
                    "dtype: expected one of \"float32\", \"float16\", \"bfloat16\", \"q8_0\", got {name:?}"
                ))
            })
    }

    /// Whether rows of `head_dim` values can be stored (q8_0 needs whole blocks).
    pub fn check_head_dim(self, head_dim: usize) -> Result<()> {
        if self == KvDtype::Q8_0 && !head_dim.is_multiple_of(QK8_0) {
            return Err(CacheError::InvalidConfig(format!(
                "dtype q8_0: expected a head_dim that is a multiple of {QK8_0}, got {head_dim}"
            )));
        }
        Ok(())
    }

    /// Bytes one row of `head_dim` values takes (for q8_0, `head_dim` is a
    /// multiple of 32; see [`KvDtype::check_head_dim`]). Saturates.
    pub fn row_bytes(self, head_dim: usize) -> usize {
        match self {
            KvDtype::Float32 => head_dim.saturating_mul(4),
            KvDtype::Float16 | KvDtype::Bfloat16 => head_dim.saturating_mul(2),
            KvDtype::Q8_0 => (head_dim / QK8_0).saturating_mul(Q8_0_BLOCK_BYTES),
        }
    }
}

/// New rows handed to the byte layer, in the caller's type (row-major
/// `[n_heads, n_tokens, head_dim]`). Each is widened exactly to f32 and then
/// rounded once into the pool's type.
#[derive(Debug, Clone, Copy)]
pub enum RowsIn<'a> {
    F32(&'a [f32]),
    /// IEEE half bits.
    F16(&'a [u16]),
    /// bfloat16 bits.
    Bf16(&'a [u16]),
}

impl RowsIn<'_> {
    /// Values held.
    pub fn len(&self) -> usize {
        match self {
            RowsIn::F32(s) => s.len(),
            RowsIn::F16(s) | RowsIn::Bf16(s) => s.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Widens values `[at, at + out.len())` to f32 (exact for every input type).
    /// Returns false when the range is out of bounds.
    pub fn widen(&self, at: usize, out: &mut [f32]) -> bool {
        let Some(end) = at.checked_add(out.len()) else {
            return false;
        };
        match self {
            RowsIn::F32(s) => s.get(at..end).map(|src| out.copy_from_slice(src)).is_some(),
            RowsIn::F16(s) => widen_with(s.get(at..end), out, f16_to_f32),
            RowsIn::Bf16(s) => widen_with(s.get(at..end), out, bf16_to_f32),
        }
    }
}

/// Widens `src` into `out` value by value with `f`; false when `src` is `None`
/// (the range was out of bounds).
fn widen_with(src: Option<&[u16]>, out: &mut [f32], f: impl Fn(u16) -> f32) -> bool {
    let Some(src) = src else {
        return false;
    };
    out.iter_mut().zip(src).for_each(|(o, &h)| *o = f(h));
    true
}

/// Stored rows of one pool (or part of one), borrowed: the bytes and their type.
///
/// A pool is `[n_heads, slots, row]` rows of `dtype.row_bytes(head_dim)` bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KvRows<'a> {
    pub dtype: KvDtype,
    pub bytes: &'a [u8],
}

impl<'a> KvRows<'a> {
    /// float32 rows (any f32 slice is valid bytes).
    pub fn from_f32(values: &'a [f32]) -> Self {
        // SAFETY: f32 has no padding or invalid bit patterns as bytes; the
        // byte length is exactly the slice's size in memory.
        let bytes = unsafe {
            std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), std::mem::size_of_val(values))
        };
        KvRows {
            dtype: KvDtype::Float32,
            bytes,
        }
    }

    /// Half or bfloat16 rows given as their bits.
    pub fn from_u16(dtype: KvDtype, bits: &'a [u16]) -> Self {
        // SAFETY: as in `from_f32`: u16 to bytes is always valid.
        let bytes = unsafe {
            std::slice::from_raw_parts(bits.as_ptr().cast::<u8>(), std::mem::size_of_val(bits))
        };
        KvRows { dtype, bytes }
    }

    /// The values as f32 when the rows are float32 (and 4-byte aligned, which
    /// pools always are); `None` otherwise.
    pub fn f32(&self) -> Option<&'a [f32]> {
        if self.dtype != KvDtype::Float32 || !self.bytes.len().is_multiple_of(4) {
            return None;
        }
        // SAFETY: every bit pattern is a valid f32; `align_to` only yields the
        // aligned middle, which we accept only when it is the whole slice.
        let (pre, mid, post) = unsafe { self.bytes.align_to::<f32>() };
        (pre.is_empty() && post.is_empty()).then_some(mid)
    }

    /// The values as u16 bits when the rows are float16 or bfloat16 (and aligned).
    pub fn u16(&self) -> Option<&'a [u16]> {
        if !matches!(self.dtype, KvDtype::Float16 | KvDtype::Bfloat16)
            || !self.bytes.len().is_multiple_of(2)
        {
            return None;
        }
        // SAFETY: every bit pattern is a valid u16; see `f32`.
        let (pre, mid, post) = unsafe { self.bytes.align_to::<u16>() };
        (pre.is_empty() && post.is_empty()).then_some(mid)
    }
}

/// Quantizes one block of 32 values into `out` (34 bytes) as GGML's
/// `quantize_row_q8_0_ref` does: `d = amax / 127`, `q = round(x / d)` with
/// `roundf` (half away from zero), the scale stored as fp16.
pub fn quantize_block_q8_0(x: &[f32; QK8_0], out: &mut [u8; Q8_0_BLOCK_BYTES]) {
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let [d0, d1] = f32_to_f16(d).to_le_bytes();
    out[0] = d0;
    out[1] = d1;
    for (o, v) in out[2..].iter_mut().zip(x) {
        // |v * id| <= 127 (up to rounding), so the cast cannot wrap; `as` saturates anyway.
        *o = ((v * id).round() as i8) as u8;
    }
}

/// Dequantizes one block (34 bytes) into 32 values: `d * q`.
pub fn dequantize_block_q8_0(b: &[u8; Q8_0_BLOCK_BYTES], out: &mut [f32; QK8_0]) {
    let d = f16_le([b[0], b[1]]);
    for (o, q) in out.iter_mut().zip(&b[2..]) {
        *o = d * (*q as i8) as f32;
    }
}

/// Encodes `src` (one or more whole rows, f32) into `dst` in `dtype`'s bytes.
/// `dst.len()` must be `dtype.row_bytes(src.len())` (for q8_0, `src.len()` a
/// multiple of 32); returns false otherwise and writes nothing.
pub fn encode(dtype: KvDtype, src: &[f32], dst: &mut [u8]) -> bool {
    if !holds(dtype, src.len(), dst.len()) {
        return false;
    }
    match dtype {
        KvDtype::Float32 => dst.copy_from_slice(KvRows::from_f32(src).bytes),
        KvDtype::Float16 => per_chunk(src, dst, |[s]: &[f32; 1], d: &mut [u8; 2]| {
            *d = f32_to_f16(*s).to_le_bytes();
        }),
        KvDtype::Bfloat16 => per_chunk(src, dst, |[s]: &[f32; 1], d: &mut [u8; 2]| {
            *d = f32_to_bf16(*s).to_le_bytes();
        }),
        KvDtype::Q8_0 => per_chunk(src, dst, quantize_block_q8_0),
    }
    true
}

/// Decodes `src` (whole rows of `dtype`) into `dst` f32 values.
/// `src.len()` must be `dtype.row_bytes(dst.len())`; returns false otherwise.
pub fn decode(dtype: KvDtype, src: &[u8], dst: &mut [f32]) -> bool {
    if !holds(dtype, dst.len(), src.len()) {
        return false;
    }
    match dtype {
        KvDtype::Float32 => per_chunk(src, dst, |s: &[u8; 4], [d]: &mut [f32; 1]| {
            *d = f32::from_le_bytes(*s);
        }),
        KvDtype::Float16 => per_chunk(src, dst, |s: &[u8; 2], [d]: &mut [f32; 1]| {
            *d = f16_le(*s);
        }),
        KvDtype::Bfloat16 => per_chunk(src, dst, |s: &[u8; 2], [d]: &mut [f32; 1]| {
            *d = bf16_to_f32(u16::from_le_bytes(*s));
        }),
        KvDtype::Q8_0 => per_chunk(src, dst, dequantize_block_q8_0),
    }
    true
}

/// Whether `n_bytes` are exactly `n_values` values in `dtype` (for q8_0,
/// whole blocks of 32).
fn holds(dtype: KvDtype, n_values: usize, n_bytes: usize) -> bool {
    (dtype != KvDtype::Q8_0 || n_values.is_multiple_of(QK8_0))
        && n_bytes == dtype.row_bytes(n_values)
}

/// Calls `f` on each whole `N`-item chunk of `src` with the `M`-item chunk of
/// `dst` at the same index (one value or block of a row and its encoding).
fn per_chunk<S, D, const N: usize, const M: usize>(
    src: &[S],
    dst: &mut [D],
    f: impl Fn(&[S; N], &mut [D; M]),
) {
    for (s, d) in src
        .as_chunks::<N>()
        .0
        .iter()
        .zip(dst.as_chunks_mut::<M>().0)
    {
        f(s, d);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    #[test]
    fn q8_0_block_matches_its_definition() {
        let mut x = [0.0f32; 32];
        for (i, v) in x.iter_mut().enumerate() {
            *v = (i as f32 - 15.5) * 0.1;
        }
        let mut b = [0u8; 34];
        quantize_block_q8_0(&x, &mut b);
        let d = f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
        assert_eq!(u16::from_le_bytes([b[0], b[1]]), f32_to_f16(1.55 / 127.0));
        assert_eq!(b[2] as i8, -127);
        assert_eq!(b[33] as i8, 127);
        let mut y = [0.0f32; 32];
        dequantize_block_q8_0(&b, &mut y);
        for (a, c) in x.iter().zip(&y) {
            assert!((a - c).abs() <= d * 0.51 + 1e-6);
        }
    }

    #[test]
    fn encode_and_decode_follow_the_per_value_conversions() {
        let x: Vec<f32> = (0..64).map(|i| (i as f32 - 31.5) * 0.37).collect();
        for d in KvDtype::ALL {
            let mut bytes = vec![0u8; d.row_bytes(x.len())];
            assert!(encode(d, &x, &mut bytes), "{d:?}");
            let mut y = vec![f32::NAN; x.len()];
            assert!(decode(d, &bytes, &mut y), "{d:?}");
            let want: Vec<f32> = match d {
                KvDtype::Float32 => x.clone(),
                KvDtype::Float16 => x.iter().map(|&v| f16_to_f32(f32_to_f16(v))).collect(),
                KvDtype::Bfloat16 => x.iter().map(|&v| bf16_to_f32(f32_to_bf16(v))).collect(),
                KvDtype::Q8_0 => x
                    .as_chunks::<QK8_0>()
                    .0
                    .iter()
                    .flat_map(|c| {
                        let (mut b, mut out) = ([0u8; Q8_0_BLOCK_BYTES], [0.0f32; QK8_0]);
                        quantize_block_q8_0(c, &mut b);
                        dequantize_block_q8_0(&b, &mut out);
                        out
                    })
                    .collect(),
            };
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&y), bits(&want), "{d:?}");
            if d == KvDtype::Float16 {
                assert_eq!(bytes[2..4], f32_to_f16(x[1]).to_le_bytes());
            }
            // Sizes that do not match are refused and write nothing.
            let (bytes_before, y_before) = (bytes.clone(), y.clone());
            assert!(!encode(d, &x[..31], &mut bytes), "{d:?}");
            assert!(!decode(d, &bytes[1..], &mut y), "{d:?}");
            assert_eq!(bytes, bytes_before);
            assert_eq!(bits(&y), bits(&y_before));
        }
    }

    #[test]
    fn rows_in_widen_is_exact_and_refuses_out_of_range() {
        let f: Vec<f32> = vec![1.5, -2.25, 3.0];
        let h: Vec<u16> = f.iter().map(|&v| f32_to_f16(v)).collect();
        let b: Vec<u16> = f.iter().map(|&v| f32_to_bf16(v)).collect();
        for rows in [RowsIn::F32(&f), RowsIn::F16(&h), RowsIn::Bf16(&b)] {
            let mut out = [0.0f32; 2];
            assert!(rows.widen(1, &mut out));
            assert_eq!(out, [-2.25, 3.0]);
            let mut out = [7.0f32; 2];
            assert!(!rows.widen(2, &mut out));
            assert!(!rows.widen(usize::MAX, &mut out));
            assert_eq!(out, [7.0, 7.0]);
        }
    }

    #[test]
    fn names_and_codes_are_stable() {
        for d in KvDtype::ALL {
            assert_eq!(KvDtype::parse(d.name()), Ok(d));
            assert_eq!(KvDtype::from_code(d.code()), Some(d));
        }
        assert!(KvDtype::parse("int4").is_err());
        assert_eq!(KvDtype::Q8_0.row_bytes(128), 136);
        assert!(KvDtype::Q8_0.check_head_dim(48).is_err());
    }
}
