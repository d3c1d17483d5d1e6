//! The low-bit block types: Q2_K, Q3_K (2-bit quants in 16-value
//! sub-blocks, Q3_K with a third bit from a mask) and IQ4_NL, IQ4_XS (4-bit
//! indices into a fixed non-linear table). Their decoding (the reference
//! decoders' f32 operations, so bit-identical) and their portable dots with
//! the quantized activations (Q8 for IQ4_NL, Q8_K for the others).
//!
//! Layouts (little-endian), as GGML defines them:
//! - Q2_K, 84 bytes: 16 bytes of (scale | min << 4) per 16 values, 64 bytes
//!   of 2-bit quants, f16 d, f16 dmin. Value `d·sc·q − dmin·m`.
//! - Q3_K, 110 bytes: 32 bytes of high-bit mask, 64 bytes of 2-bit quants,
//!   12 bytes of sixteen 6-bit scales (offset 32), f16 d. Value
//!   `d·(s − 32)·(q − 4)` where a set mask bit cancels the `− 4`.
//! - IQ4_NL, 18 bytes: f16 d, 16 bytes of indices. Value `d·T[i]`.
//! - IQ4_XS, 136 bytes: f16 d, u16 of scale high bits, 4 bytes of scale low
//!   nibbles, 128 bytes of indices (32-value sub-blocks as IQ4_NL's).
//!   Value `d·(s − 32)·T[i]`.
//!
//! In both 2-bit layouts, value `v` of a super-block is in byte
//! `(v / 128) · 32 + v % 32` of the quants at bit `2 · ((v % 128) / 32)`.

use super::unpack::{at, unpack32};
use offgraph_kv::half::f16_le;

/// The non-linear 4-bit table of IQ4_NL and IQ4_XS.
pub(super) const IQ4_TABLE: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// The 2-bit quant of value `v` (0..256) of a Q2_K/Q3_K super-block.
#[inline(always)]
pub(super) fn q2(qs: &[u8], v: usize) -> u8 {
    (at(qs, (v / 128) * 32 + v % 32) >> (2 * ((v % 128) / 32))) & 3
}

/// The signed 3-bit quant (−4..4) of value `v` of a Q3_K super-block.
#[inline(always)]
pub(super) fn q3(hmask: &[u8], qs: &[u8], v: usize) -> i8 {
    let high = (at(hmask, v % 32) >> (v / 32)) & 1;
    q2(qs, v) as i8 - if high == 1 { 0 } else { 4 }
}

/// The sixteen Q3_K scales (offset removed) from their 12 packed bytes:
/// the low nibbles of bytes 0..8 then their high nibbles, each topped by a
/// 2-bit field of bytes 8..12 (byte `8 + i % 4`, field `i / 4`).
#[inline(always)]
pub(super) fn q3k_scales(s: &[u8]) -> [i8; 16] {
    core::array::from_fn(|i| {
        let lo = (at(s, i % 8) >> (4 * (i / 8))) & 0x0f;
        let hi = (at(s, 8 + i % 4) >> (2 * (i / 4))) & 3;
        (lo | (hi << 4)) as i8 - 32
    })
}

/// The eight IQ4_XS scales (offset removed) of a super-block.
#[inline(always)]
pub(super) fn iq4xs_scales(b: &[u8]) -> [i8; 8] {
    let high = u16::from_le_bytes([at(b, 2), at(b, 3)]);
    core::array::from_fn(|j| {
        let lo = (at(b, 4 + j / 2) >> (4 * (j % 2))) & 0x0f;
        let hi = ((high >> (2 * j)) & 3) as u8;
        (lo | (hi << 4)) as i8 - 32
    })
}

/// The 32 table values of a 32-value IQ4 sub-block from its 16 index bytes.
#[inline(always)]
pub(super) fn iq4_values(qs: &[u8]) -> [i8; 32] {
    unpack32(qs, 0).map(|i| IQ4_TABLE.get(usize::from(i)).copied().unwrap_or(0))
}

/// Decodes whole blocks of a low-bit type from `src` into `out`.
pub(super) fn dequant_q2k(src: &[u8], out: &mut [f32]) {
    for (b, o) in src
        .as_chunks::<84>()
        .0
        .iter()
        .zip(out.as_chunks_mut::<256>().0)
    {
        let (sc, qs) = (&b[..16], &b[16..80]);
        let d = f16_le([b[80], b[81]]);
        let dmin = f16_le([b[82], b[83]]);
        for (j, o) in o.chunks_exact_mut(16).enumerate() {
            let s = at(sc, j);
            let dl = d * f32::from(s & 0x0f);
            let ml = dmin * f32::from(s >> 4);
            for (l, o) in o.iter_mut().enumerate() {
                *o = dl * f32::from(q2(qs, j * 16 + l)) - ml;
            }
        }
    }
}

pub(super) fn dequant_q3k(src: &[u8], out: &mut [f32]) {
    for (b, o) in src
        .as_chunks::<110>()
        .0
        .iter()
        .zip(out.as_chunks_mut::<256>().0)
    {
        let (hm, qs) = (&b[..32], &b[32..96]);
        let sc = q3k_scales(&b[96..108]);
        let d = f16_le([b[108], b[109]]);
        for (j, (o, &s)) in o.chunks_exact_mut(16).zip(&sc).enumerate() {
            let dl = d * f32::from(s);
            for (l, o) in o.iter_mut().enumerate() {
                *o = dl * f32::from(q3(hm, qs, j * 16 + l));
            }
        }
    }
}

pub(super) fn dequant_iq4nl(src: &[u8], out: &mut [f32]) {
    for (b, o) in src
        .as_chunks::<18>()
        .0
        .iter()
        .zip(out.as_chunks_mut::<32>().0)
    {
        let d = f16_le([b[0], b[1]]);
        for (o, v) in o.iter_mut().zip(iq4_values(&b[2..])) {
            *o = d * f32::from(v);
        }
    }
}

pub(super) fn dequant_iq4xs(src: &[u8], out: &mut [f32]) {
    for (b, o) in src
        .as_chunks::<136>()
        .0
        .iter()
        .zip(out.as_chunks_mut::<256>().0)
    {
        let d = f16_le([b[0], b[1]]);
        let sc = iq4xs_scales(b);
        for ((o, &s), qs) in o.chunks_exact_mut(32).zip(&sc).zip(b[8..].chunks_exact(16)) {
            let dl = d * f32::from(s);
            for (o, v) in o.iter_mut().zip(iq4_values(qs)) {
                *o = dl * f32::from(v);
            }
        }
    }
}

/// A Q2_K super-block against its 256 activation quants (scale `da`, sums
/// of 16 `bs`): `d·da·Σ sc_j·(q·a)_j − dmin·da·Σ m_j·Σa_j`.
pub(super) fn dot_q2k(b: &[u8; 84], aq: &[i8], da: f32, bs: &[i16]) -> f32 {
    let (sc, qs) = (&b[..16], &b[16..80]);
    let (mut isum, mut msum) = (0i32, 0i32);
    for (j, a16) in aq.chunks_exact(16).enumerate() {
        let q: i32 = a16
            .iter()
            .enumerate()
            .map(|(l, &a)| i32::from(q2(qs, j * 16 + l)) * i32::from(a))
            .sum();
        let s = at(sc, j);
        isum += q * i32::from(s & 0x0f);
        msum += i32::from(bs.get(j).copied().unwrap_or(0)) * i32::from(s >> 4);
    }
    let d = f16_le([b[80], b[81]]);
    let dmin = f16_le([b[82], b[83]]);
    d * da * isum as f32 - dmin * da * msum as f32
}

/// A Q3_K super-block: `d·da·Σ s_j·(q·a)_j`.
pub(super) fn dot_q3k(b: &[u8; 110], aq: &[i8], da: f32) -> f32 {
    let (hm, qs) = (&b[..32], &b[32..96]);
    let sc = q3k_scales(&b[96..108]);
    let mut isum = 0i32;
    for (j, (a16, &s)) in aq.chunks_exact(16).zip(&sc).enumerate() {
        let q: i32 = a16
            .iter()
            .enumerate()
            .map(|(l, &a)| i32::from(q3(hm, qs, j * 16 + l)) * i32::from(a))
            .sum();
        isum += q * i32::from(s);
    }
    f16_le([b[108], b[109]]) * da * isum as f32
}

/// Σ T[i]·a over an IQ4 32-value sub-block (16 index bytes).
#[inline(always)]
pub(super) fn idot_iq4(qs: &[u8], a: &[i8]) -> i32 {
    iq4_values(qs)
        .iter()
        .zip(a)
        .map(|(&w, &a)| i32::from(w) * i32::from(a))
        .sum()
}

/// An IQ4_XS super-block: `d·da·Σ s_j·(T·a)_j`.
pub(super) fn dot_iq4xs(b: &[u8; 136], aq: &[i8], da: f32) -> f32 {
    let sc = iq4xs_scales(b);
    let mut isum = 0i32;
    for ((a32, &s), qs) in aq.chunks_exact(32).zip(&sc).zip(b[8..].chunks_exact(16)) {
        isum += idot_iq4(qs, a32) * i32::from(s);
    }
    f16_le([b[0], b[1]]) * da * isum as f32
}
