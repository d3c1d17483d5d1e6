//! Block decoding: a stored row of any supported type widened to f32, with
//! the same f32 operations (and order) as the reference decoders, so the
//! results are bit-identical to them.

use super::unpack::{at, q6, scale_min_k4, unpack32};
use crate::error::{EngineError, Result};
use crate::ggml_type::GgmlType;
use offgraph_kv::half::{bf16_to_f32, f16_le, f16_to_f32};

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
