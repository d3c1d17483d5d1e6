//! Block decoding: a stored row of any supported type widened to f32, with
//! the same f32 operations (and order) as the reference decoders, so the
//! results are bit-identical to them.

use crate::error::{EngineError, Result};
use crate::ggml_type::GgmlType;
use offgraph_kv::half::{bf16_to_f32, f16_le, f16_to_f32};

/// Byte `i` of `a`, 0 past its end (only used with in-range constants).
#[inline(always)]
pub(super) fn at(a: &[u8], i: usize) -> u8 {
    a.get(i).copied().unwrap_or(0)
}

/// The eight 6-bit scales and mins of a Q4_K/Q5_K super-block, from its 12
/// packed bytes: sub-blocks 0..4 keep their low 6 bits in bytes 0..4 (scale)
/// and 4..8 (min); sub-blocks 4..8 take a nibble of bytes 8..12 and the top
/// two bits of bytes 0..8.
#[inline(always)]
pub(super) fn scale_min_k4(s: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    let sc = core::array::from_fn(|j| {
        if j < 4 {
            at(s, j) & 63
        } else {
            (at(s, j + 4) & 0x0f) | ((at(s, j - 4) >> 6) << 4)
        }
    });
    let mn = core::array::from_fn(|j| {
        if j < 4 {
            at(s, j + 4) & 63
        } else {
            (at(s, j + 4) >> 4) | ((at(s, j) >> 6) << 4)
        }
    });
    (sc, mn)
}

/// Low nibbles of `qs` (16 bytes) are values 0..16 of a 32-block, high
/// nibbles values 16..32; `hbits` supplies bit 4 of each value (0 for 4-bit
/// types). Returns the 32 unsigned quants.
#[inline(always)]
pub(super) fn unpack32(qs: &[u8], hbits: u32) -> [u8; 32] {
    core::array::from_fn(|j| {
        let b = at(qs, j % 16);
        let lo = if j < 16 { b & 0x0f } else { b >> 4 };
        lo | ((((hbits >> j) & 1) as u8) << 4)
    })
}

/// Decodes one row of `out.len()` values stored as `ty` in `src`.
///
/// `Format` when `out.len()` is not a whole number of `ty` blocks;
/// `InvalidArgument` when `src` is not exactly that row's bytes. `out` is
/// untouched on error.
pub fn dequantize_row(ty: GgmlType, src: &[u8], out: &mut [f32]) -> Result<()> {
    let need = ty.row_bytes(out.len() as u64)?;
    if src.len() as u64 != need {
        return Err(EngineError::InvalidArgument(format!(
            "dequantize_row: a {} row of {} values is {need} bytes, got {}",
            ty.name(),
            out.len(),
            src.len()
        )));
    }
    match ty {
        GgmlType::F32 => {
            for (o, b) in out.iter_mut().zip(src.as_chunks::<4>().0) {
                *o = f32::from_le_bytes(*b);
            }
        }
        GgmlType::F16 => {
            for (o, b) in out.iter_mut().zip(src.as_chunks::<2>().0) {
                *o = f16_to_f32(u16::from_le_bytes(*b));
            }
        }
        GgmlType::BF16 => {
            for (o, b) in out.iter_mut().zip(src.as_chunks::<2>().0) {
                *o = bf16_to_f32(u16::from_le_bytes(*b));
            }
        }
        GgmlType::Q4_0 => {
            for (b, o) in src
                .as_chunks::<18>()
                .0
                .iter()
                .zip(out.as_chunks_mut::<32>().0)
            {
                let d = f16_le([b[0], b[1]]);
                for (o, q) in o.iter_mut().zip(unpack32(&b[2..], 0)) {
                    *o = d * f32::from(q as i8 - 8);
                }
            }
        }
        GgmlType::Q4_1 => {
            for (b, o) in src
                .as_chunks::<20>()
                .0
                .iter()
                .zip(out.as_chunks_mut::<32>().0)
            {
                let (d, m) = (f16_le([b[0], b[1]]), f16_le([b[2], b[3]]));
                for (o, q) in o.iter_mut().zip(unpack32(&b[4..], 0)) {
                    *o = d * f32::from(q) + m;
                }
            }
        }
        GgmlType::Q5_0 => {
            for (b, o) in src
                .as_chunks::<22>()
                .0
                .iter()
                .zip(out.as_chunks_mut::<32>().0)
            {
                let d = f16_le([b[0], b[1]]);
                let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
                for (o, q) in o.iter_mut().zip(unpack32(&b[6..], qh)) {
                    *o = d * f32::from(q as i8 - 16);
                }
            }
        }
        GgmlType::Q5_1 => {
            for (b, o) in src
                .as_chunks::<24>()
                .0
                .iter()
                .zip(out.as_chunks_mut::<32>().0)
            {
                let (d, m) = (f16_le([b[0], b[1]]), f16_le([b[2], b[3]]));
                let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
                for (o, q) in o.iter_mut().zip(unpack32(&b[8..], qh)) {
                    *o = d * f32::from(q) + m;
                }
            }
        }
        GgmlType::Q8_0 => {
            for (b, o) in src
                .as_chunks::<34>()
                .0
                .iter()
                .zip(out.as_chunks_mut::<32>().0)
            {
                let d = f16_le([b[0], b[1]]);
                for (o, q) in o.iter_mut().zip(&b[2..]) {
                    *o = f32::from(*q as i8) * d;
                }
            }
        }
        GgmlType::Q8_K => {
            for (b, o) in src
                .as_chunks::<292>()
                .0
                .iter()
                .zip(out.as_chunks_mut::<256>().0)
            {
                let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                for (o, q) in o.iter_mut().zip(&b[4..260]) {
                    *o = d * f32::from(*q as i8);
                }
            }
        }
        GgmlType::Q4_K | GgmlType::Q5_K => dequant_k45(ty, src, out),
        GgmlType::Q2_K => super::lowbit::dequant_q2k(src, out),
        GgmlType::Q3_K => super::lowbit::dequant_q3k(src, out),
        GgmlType::IQ4_NL => super::lowbit::dequant_iq4nl(src, out),
        GgmlType::IQ4_XS => super::lowbit::dequant_iq4xs(src, out),
        GgmlType::Q6_K => {
            for (b, o) in src
                .as_chunks::<210>()
                .0
                .iter()
                .zip(out.as_chunks_mut::<256>().0)
            {
                let d = f16_le([b[208], b[209]]);
                let (ql, qh, sc) = (&b[..128], &b[128..192], &b[192..208]);
                for (h, o) in o.chunks_exact_mut(128).enumerate() {
                    for (r, o) in o.iter_mut().enumerate() {
                        let q = q6(ql, qh, h, r);
                        let s = f32::from(at(sc, h * 8 + r / 16) as i8);
                        *o = (d * s) * f32::from(q as i8 - 32);
                    }
                }
            }
        }
    }
    Ok(())
}

/// Value `r` (0..128) of half `h` of a Q6_K super-block: 4 low bits from
/// `ql` (bytes 0..64 of the half, low nibbles then high nibbles), 2 high bits
/// from `qh` (32 bytes of the half, four 2-bit fields).
#[inline(always)]
pub(super) fn q6(ql: &[u8], qh: &[u8], h: usize, r: usize) -> u8 {
    let lo = (at(ql, h * 64 + r % 64) >> (4 * (r / 64))) & 0x0f;
    let hi = (at(qh, h * 32 + r % 32) >> (2 * (r / 32))) & 3;
    lo | (hi << 4)
}

fn dequant_k45(ty: GgmlType, src: &[u8], out: &mut [f32]) {
    let five = ty == GgmlType::Q5_K;
    let bb = ty.block_bytes();
    for (b, o) in src.chunks_exact(bb).zip(out.as_chunks_mut::<256>().0) {
        let Some((head, rest)) = b.split_first_chunk::<16>() else {
            continue;
        };
        let d = f16_le([head[0], head[1]]);
        let dmin = f16_le([head[2], head[3]]);
        let mut sb = [0u8; 12];
        sb.copy_from_slice(&head[4..16]);
        let (sc, mn) = scale_min_k4(&sb);
        let (qh, qs) = if five {
            rest.split_at_checked(32).unwrap_or((&[], &[]))
        } else {
            (&[][..], rest)
        };
        for (j, o) in o.chunks_exact_mut(32).enumerate() {
            let d1 = d * f32::from(at(&sc, j));
            let m1 = dmin * f32::from(at(&mn, j));
            for (l, o) in o.iter_mut().enumerate() {
                let b = at(qs, (j / 2) * 32 + l);
                let lo = if j % 2 == 0 { b & 0x0f } else { b >> 4 };
                let hi = ((at(qh, l) >> j) & 1) << 4;
                *o = d1 * f32::from(lo | hi) - m1;
            }
        }
    }
}
