//! The portable dots: one stored row with one token's activations, in plain
//! integer arithmetic per block (the reference the SIMD kernels match).

use super::act::Act;
use super::lowbit;
use super::unpack::{at, q6, scale_min_k4, unpack32};
use crate::ggml_type::GgmlType;
use offgraph_kv::half::{bf16_to_f32, f16_le, f16_to_f32};

/// Σ q[j] · a[j] over a 32-block, the weights offset by `off`.
#[inline(always)]
fn idot32(q: [u8; 32], off: i32, a: &[i8]) -> i32 {
    q.iter()
        .zip(a)
        .map(|(&q, &a)| (i32::from(q) - off) * i32::from(a))
        .sum()
}

/// `row · act` for a row of `ty` (the caller checked the row holds whole
/// blocks for the activation's length).
pub(super) fn dot(ty: GgmlType, row: &[u8], a: &Act<'_>) -> f32 {
    match ty {
        GgmlType::F32 => row
            .as_chunks::<4>()
            .0
            .iter()
            .zip(a.x)
            .map(|(w, x)| f32::from_le_bytes(*w) * x)
            .sum(),
        GgmlType::F16 => row
            .as_chunks::<2>()
            .0
            .iter()
            .zip(a.x)
            .map(|(w, x)| f16_to_f32(u16::from_le_bytes(*w)) * x)
            .sum(),
        GgmlType::BF16 => row
            .as_chunks::<2>()
            .0
            .iter()
            .zip(a.x)
            .map(|(w, x)| bf16_to_f32(u16::from_le_bytes(*w)) * x)
            .sum(),
        GgmlType::Q4_0 => blocks32::<18>(row, a, |b, aq, d, _| {
            f16_le([b[0], b[1]]) * d * idot32(unpack32(&b[2..], 0), 8, aq) as f32
        }),
        GgmlType::Q4_1 => blocks32::<20>(row, a, |b, aq, d, s| {
            f16_le([b[0], b[1]]) * d * idot32(unpack32(&b[4..], 0), 0, aq) as f32
                + f16_le([b[2], b[3]]) * s
        }),
        GgmlType::Q5_0 => blocks32::<22>(row, a, |b, aq, d, _| {
            let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
            f16_le([b[0], b[1]]) * d * idot32(unpack32(&b[6..], qh), 16, aq) as f32
        }),
        GgmlType::Q5_1 => blocks32::<24>(row, a, |b, aq, d, s| {
            let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
            f16_le([b[0], b[1]]) * d * idot32(unpack32(&b[8..], qh), 0, aq) as f32
                + f16_le([b[2], b[3]]) * s
        }),
        GgmlType::Q8_0 => blocks32::<34>(row, a, |b, aq, d, _| {
            let i: i32 = b[2..]
                .iter()
                .zip(aq)
                .map(|(&w, &a)| i32::from(w as i8) * i32::from(a))
                .sum();
            f16_le([b[0], b[1]]) * d * i as f32
        }),
        GgmlType::Q8_K => blocks256::<292>(row, a, |b, aq, d, _| {
            let i: i32 = b[4..260]
                .iter()
                .zip(aq)
                .map(|(&w, &a)| i32::from(w as i8) * i32::from(a))
                .sum();
            f32::from_le_bytes([b[0], b[1], b[2], b[3]]) * d * i as f32
        }),
        GgmlType::Q4_K => {
            blocks256::<144>(row, a, |b, aq, d, bs| k45(b, None, &b[16..], aq, d, bs))
        }
        GgmlType::Q5_K => blocks256::<176>(row, a, |b, aq, d, bs| {
            k45(b, Some(&b[16..48]), &b[48..], aq, d, bs)
        }),
        GgmlType::Q2_K => blocks256::<84>(row, a, lowbit::dot_q2k),
        GgmlType::Q3_K => blocks256::<110>(row, a, |b, aq, d, _| lowbit::dot_q3k(b, aq, d)),
        GgmlType::IQ4_XS => blocks256::<136>(row, a, |b, aq, d, _| lowbit::dot_iq4xs(b, aq, d)),
        GgmlType::IQ4_NL => blocks32::<18>(row, a, |b, aq, d, _| {
            f16_le([b[0], b[1]]) * d * lowbit::idot_iq4(&b[2..], aq) as f32
        }),
        GgmlType::Q6_K => blocks256::<210>(row, a, |b, aq, d, _| {
            let (ql, qh, sc) = (&b[..128], &b[128..192], &b[192..208]);
            let mut isum = 0i32;
            for (i, a16) in aq.chunks_exact(16).enumerate() {
                let s: i32 = a16
                    .iter()
                    .enumerate()
                    .map(|(l, &a)| {
                        let r = i * 16 + l;
                        (i32::from(q6(ql, qh, r / 128, r % 128)) - 32) * i32::from(a)
                    })
                    .sum();
                isum += s * i32::from(at(sc, i) as i8);
            }
            f16_le([b[208], b[209]]) * d * isum as f32
        }),
    }
}

/// Sums `f(block, its 32 activation quants, d, s)` over 32-value blocks of `N` bytes.
#[inline(always)]
fn blocks32<const N: usize>(
    row: &[u8],
    a: &Act<'_>,
    f: impl Fn(&[u8; N], &[i8], f32, f32) -> f32,
) -> f32 {
    let it = row
        .as_chunks::<N>()
        .0
        .iter()
        .zip(a.qs.chunks_exact(32))
        .zip(a.d.iter().zip(a.s));
    it.map(|((b, aq), (&d, &s))| f(b, aq, d, s)).sum()
}

/// Sums `f(block, its 256 activation quants, d, its 16 partial sums)` over
/// 256-value blocks of `N` bytes.
#[inline(always)]
fn blocks256<const N: usize>(
    row: &[u8],
    a: &Act<'_>,
    f: impl Fn(&[u8; N], &[i8], f32, &[i16]) -> f32,
) -> f32 {
    let it = row
        .as_chunks::<N>()
        .0
        .iter()
        .zip(a.qs.chunks_exact(256))
        .zip(a.d.iter().zip(a.bs.chunks_exact(16)));
    it.map(|((b, aq), (&d, bs))| f(b, aq, d, bs)).sum()
}

/// A Q4_K (no `qh`) or Q5_K super-block: `d·da·Σ sc_j·(q·a)_j − dmin·da·Σ m_j·Σa_j`.
fn k45(b: &[u8], qh: Option<&[u8]>, qs: &[u8], aq: &[i8], da: f32, bs: &[i16]) -> f32 {
    let d = f16_le([at(b, 0), at(b, 1)]);
    let dmin = f16_le([at(b, 2), at(b, 3)]);
    let mut sb = [0u8; 12];
    for (o, i) in sb.iter_mut().zip(4..16) {
        *o = at(b, i);
    }
    let (sc, mn) = scale_min_k4(&sb);
    let (mut isum, mut msum) = (0i32, 0i32);
    for (j, a32) in aq.chunks_exact(32).enumerate() {
        let q: i32 = a32
            .iter()
            .enumerate()
            .map(|(l, &a)| {
                let byte = at(qs, (j / 2) * 32 + l);
                let lo = if j % 2 == 0 { byte & 0x0f } else { byte >> 4 };
                let hi = qh.map_or(0, |h| ((at(h, l) >> j) & 1) << 4);
                i32::from(lo | hi) * i32::from(a)
            })
            .sum();
        isum += q * i32::from(at(&sc, j));
        let asum = i32::from(bs.get(2 * j).copied().unwrap_or(0))
            + i32::from(bs.get(2 * j + 1).copied().unwrap_or(0));
        msum += asum * i32::from(at(&mn, j));
    }
    d * da * isum as f32 - dmin * da * msum as f32
}
