//! AVX-512 VNNI dots of the 32-value block types (Q4_0, Q4_1, Q5_0, Q8_0)
//! for batched steps, with rows in the lanes: one 512-bit register holds
//! four weights of each of 16 consecutive rows, and one `vpdpbusd` against
//! four activation bytes broadcast to every lane adds four products into each
//! row's int32 lane. A block of 16 rows is unpacked once (8 registers) for
//! all the chunk's tokens; each (block, token) then costs 8 `vpdpbusd`, one
//! convert and one FMA for 16 rows, where the per-row kernels (`vnni_wide`)
//! spend a convert, a multiply and an FMA per row and block pair. No lane
//! ever needs a horizontal sum: lane `r` is row `r`'s result.
//!
//! Two sources of the same registers: the weights in place (each row's
//! block by plain loads moved into lanes by `vpermt2d`, the f16 scales by one
//! `vpgatherdd`), or a group packed at load (`repack`), where each register
//! is one contiguous 64-byte load and the 16 scales one 32-byte load. Both
//! then run the same arithmetic in the same order ([`accumulate`]), so their
//! results are bit-identical.
//!
//! Unsigned weights, as `vnni` explains: Q4_0 `q + 8`, Q5_0 `q + 16`, Q8_0
//! `q + 128`, whose offset product `o · Σy` starts each block's int32 lane
//! (the activations' integer block sums); Q4_1's nibbles are unsigned and its
//! min adds `m · d·Σy` per block. Per (row, token) the blocks' scaled dots are
//! summed in block order, whatever the chunk's token count.
//!
//! Only reached from `driver::compute_vnni` (compiled with avx2, fma, f16c,
//! avx512f/bw/vl and avx512vnni) through `vnni::Vnni::dots_lanes`.

use super::act::Act;
use super::kernel::LANES;
use super::simd::{q32_block_bytes, q32_offset};
use crate::ggml_type::GgmlType;
use std::arch::x86_64::*;

/// The types with a lanes kernel.
pub(super) fn supports(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q8_0
    )
}

/// `LANES` consecutive rows (`rows`: their bytes, `rb` each) against `T`
/// tokens: `out[t][r]`. `None` when a length does not fit `ty` and `cols`.
///
/// # Safety
/// The CPU has the module's features.
#[inline(always)]
pub(super) unsafe fn dots<const T: usize>(
    ty: GgmlType,
    rows: &[u8],
    rb: usize,
    a: &[Act<'_>; T],
    cols: usize,
) -> Option<[[f32; LANES]; T]> {
    if ty.row_bytes(cols as u64).ok()? != rb as u64 || rows.len() != LANES * rb {
        return None;
    }
    // The gather's row offsets are int32.
    i32::try_from(rb.checked_mul(LANES)?).ok()?;
    let blocks = cols / 32;
    let ok = a.iter().all(|a| {
        a.qs.len() >= cols && a.d.len() >= blocks && a.s.len() >= blocks && a.bs.len() >= blocks
    });
    if !ok {
        return None;
    }
    let base = rows.as_ptr();
    // SAFETY: every row holds `blocks` blocks of `ty` (checked), each token
    // `cols` quants and `blocks` scales and sums; the caller's CPU features.
    unsafe {
        Some(match ty {
            GgmlType::Q4_0 => lanes::<T, 0>(base, rb, a, blocks),
            GgmlType::Q4_1 => lanes::<T, 1>(base, rb, a, blocks),
            GgmlType::Q5_0 => lanes::<T, 2>(base, rb, a, blocks),
            GgmlType::Q8_0 => lanes::<T, 4>(base, rb, a, blocks),
            _ => return None,
        })
    }
}

/// Bit `i` of a 4-bit index as 0x10 in byte `i` of the entry: Q5_0's fifth
/// bits of four values, in the bytes those values take.
const FIFTH_BITS: [i32; 16] = [
    0x0000_0000,
    0x0000_0010,
    0x0000_1000,
    0x0000_1010,
    0x0010_0000,
    0x0010_0010,
    0x0010_1000,
    0x0010_1010,
    0x1000_0000,
    0x1000_0010,
    0x1000_1000,
    0x1000_1010,
    0x1010_0000,
    0x1010_0010,
    0x1010_1000,
    0x1010_1010,
];

// `vpermt2d` indices of the transposes in `unpack`: lane `L` of an output
// takes lane `i % 16` of the first source (`i < 16`) or of the second.

/// 32 bytes of two rows (2k, 2k + 1) → four rows' groups 4h..4h + 4, lane
/// `4g' + r'`: row `4j + r'` is in source `r' / 2` at `8 (r' % 2) + 4h + g'`.
const Q8_S1: [[i32; 16]; 2] = [
    [0, 8, 16, 24, 1, 9, 17, 25, 2, 10, 18, 26, 3, 11, 19, 27],
    [4, 12, 20, 28, 5, 13, 21, 29, 6, 14, 22, 30, 7, 15, 23, 31],
];
/// Four rows' four groups (lane `4g + r`) → eight rows' groups 2q, 2q + 1,
/// lane `8g'' + r''`: row `r''` is in source `r'' / 4` at `4 (2q + g'') + r'' % 4`.
const Q8_S2: [[i32; 16]; 2] = [
    [0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23],
    [8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31],
];
/// Eight rows' two groups (lane `8g + r`) → sixteen rows' group `g''`, lane
/// `r`: row `r` is in source `r / 8` at `8g'' + r % 8`. Also the nibble
/// types' second stage.
const LANE_ROWS: [[i32; 16]; 2] = [
    [0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23],
    [8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31],
];
/// 16 bytes of four rows (lane `4 (r % 4) + m`) → eight rows' dwords 2p,
/// 2p + 1, lane `8m' + r'`: row `r'` is in source `r' / 4` at
/// `4 (r' % 4) + 2p + m'`.
const NIB_S1: [[i32; 16]; 2] = [
    [0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29],
    [2, 6, 10, 14, 18, 22, 26, 30, 3, 7, 11, 15, 19, 23, 27, 31],
];

#[inline(always)]
unsafe fn load_idx(t: &[[i32; 16]; 2]) -> [__m512i; 2] {
    // SAFETY: 64 bytes of each row of `t`.
    unsafe {
        [
            _mm512_loadu_si512(t[0].as_ptr().cast()),
            _mm512_loadu_si512(t[1].as_ptr().cast()),
        ]
    }
}

/// `a`, `b` permuted by each of `ix`'s two index vectors.
#[inline(always)]
unsafe fn mix(a: __m512i, b: __m512i, ix: &[__m512i; 2]) -> [__m512i; 2] {
    // SAFETY: register-only AVX-512 arithmetic.
    unsafe {
        [
            _mm512_permutex2var_epi32(a, ix[0], b),
            _mm512_permutex2var_epi32(a, ix[1], b),
        ]
    }
}

/// Q8_0: the 32 quants of rows `2k` and `2k + 1` (`p`: row `2k`'s), one row
/// a 256-bit half.
#[inline(always)]
unsafe fn two_rows(p: *const u8, rb: usize) -> __m512i {
    // SAFETY: the caller's 32 bytes at `p` and at `p + rb`.
    unsafe {
        let lo = _mm256_loadu_si256(p.cast());
        let hi = _mm256_loadu_si256(p.add(rb).cast());
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
    }
}

/// The nibble types: the 16 quant bytes of rows `4k..4k + 4` (`p`: row
/// `4k`'s), one row a 128-bit quarter.
#[inline(always)]
unsafe fn four_rows(p: *const u8, rb: usize) -> __m512i {
    // SAFETY: the caller's 16 bytes at `p + i * rb`, `i < 4`.
    unsafe {
        let v = _mm512_castsi128_si512(_mm_loadu_si128(p.cast()));
        let v = _mm512_inserti32x4::<1>(v, _mm_loadu_si128(p.add(rb).cast()));
        let v = _mm512_inserti32x4::<2>(v, _mm_loadu_si128(p.add(2 * rb).cast()));
        _mm512_inserti32x4::<3>(v, _mm_loadu_si128(p.add(3 * rb).cast()))
    }
}

/// Block `blk`'s 32 weights of the 16 rows (`rb` bytes apart) as 8
/// registers of unsigned bytes: register `g` holds values `4g..4g + 4` of
/// each row, lane by row. Each row's block is read by plain loads and its
/// dwords moved into lanes by `vpermt2d` (three stages for Q8_0's 32 bytes,
/// two for the 16 bytes of nibbles): measured faster than gathering them.
///
/// Plain loops, no closures: a closure that fails to inline would call the
/// intrinsics out of line, without the caller's target features.
#[inline(always)]
unsafe fn unpack<const K: u8>(blk: *const u8, rb: usize, ridx: __m512i) -> [__m512i; 8] {
    // SAFETY: the caller's 16 blocks at `blk + r * rb`; every load reads
    // inside a block (quants from `qs` on, the fifth bits at 2).
    unsafe {
        let last = load_idx(&LANE_ROWS);
        if K == 4 {
            let s1 = load_idx(&Q8_S1);
            let s2 = load_idx(&Q8_S2);
            let q = blk.add(2);
            // a_j_h: rows 4j.., groups 4h..4h + 4 (lane 4g + r).
            let [a00, a01] = mix(two_rows(q, rb), two_rows(q.add(2 * rb), rb), &s1);
            let [a10, a11] = mix(
                two_rows(q.add(4 * rb), rb),
                two_rows(q.add(6 * rb), rb),
                &s1,
            );
            let [a20, a21] = mix(
                two_rows(q.add(8 * rb), rb),
                two_rows(q.add(10 * rb), rb),
                &s1,
            );
            let [a30, a31] = mix(
                two_rows(q.add(12 * rb), rb),
                two_rows(q.add(14 * rb), rb),
                &s1,
            );
            // b_j_h: rows 8j.., groups 4h + 2q.. (lane 8g + r), q = 0, 1.
            let [b000, b001] = mix(a00, a10, &s2);
            let [b100, b101] = mix(a20, a30, &s2);
            let [b010, b011] = mix(a01, a11, &s2);
            let [b110, b111] = mix(a21, a31, &s2);
            let [w0, w1] = mix(b000, b100, &last);
            let [w2, w3] = mix(b001, b101, &last);
            let [w4, w5] = mix(b010, b110, &last);
            let [w6, w7] = mix(b011, b111, &last);
            let sign = _mm512_set1_epi8(-128);
            let mut w = [w0, w1, w2, w3, w4, w5, w6, w7];
            for wg in &mut w {
                *wg = _mm512_xor_si512(*wg, sign);
            }
            return w;
        }
        let qs = match K {
            0 => 2,
            1 => 4,
            _ => 6,
        };
        let q = blk.add(qs);
        let s1 = load_idx(&NIB_S1);
        // c_j_p: rows 8j.., dwords 2p, 2p + 1 (lane 8m + r).
        let [c00, c01] = mix(four_rows(q, rb), four_rows(q.add(4 * rb), rb), &s1);
        let [c10, c11] = mix(
            four_rows(q.add(8 * rb), rb),
            four_rows(q.add(12 * rb), rb),
            &s1,
        );
        let [n0, n1] = mix(c00, c10, &last);
        let [n2, n3] = mix(c01, c11, &last);
        // Byte j holds value j (low nibble) and value j + 16 (high nibble).
        let low = _mm512_set1_epi8(0x0f);
        let quads = [n0, n1, n2, n3];
        let mut w = [_mm512_setzero_si512(); 8];
        for (m, v) in quads.into_iter().enumerate() {
            *w.get_unchecked_mut(m) = _mm512_and_si512(v, low);
            *w.get_unchecked_mut(m + 4) = _mm512_and_si512(_mm512_srli_epi16::<4>(v), low);
        }
        if K == 2 {
            let table = _mm512_loadu_si512(FIFTH_BITS.as_ptr().cast());
            let mut qh = _mm512_i32gather_epi32::<1>(ridx, blk.add(2).cast());
            for wg in &mut w {
                // The low 4 bits of each lane index the table.
                *wg = _mm512_or_si512(*wg, _mm512_permutexvar_epi32(qh, table));
                qh = _mm512_srli_epi32::<4>(qh);
            }
        }
        w
    }
}

/// The lanes kernel of one type: `K` 0 Q4_0, 1 Q4_1, 2 Q5_0, 4 Q8_0.
#[inline(always)]
unsafe fn lanes<const T: usize, const K: u8>(
    base: *const u8,
    rb: usize,
    a: &[Act<'_>; T],
    blocks: usize,
) -> [[f32; LANES]; T] {
    let (bb, off) = (q32_block_bytes(K), q32_offset(K));
    // SAFETY (whole fn): `dots` checked the 16 rows' blocks and the tokens'
    // quants, scales and sums; block `b` of row `r` is at `r * rb + b * bb`.
    unsafe {
        let ridx = _mm512_mullo_epi32(
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            _mm512_set1_epi32(rb as i32),
        );
        let mut acc = [_mm512_setzero_ps(); T];
        // The next 16 rows, a block's share of their bytes per block: the
        // gathers read 16 rows at once, which the hardware prefetcher does
        // not follow (the rows are contiguous in a matrix).
        let next = base.wrapping_add(LANES * rb);
        let share = LANES * bb;
        for b in 0..blocks {
            let blk = base.add(b * bb);
            let ahead = next.wrapping_add(b * share);
            let mut l = 0;
            while l < share {
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(l).cast());
                l += 64;
            }
            // The scale (and Q4_1's min) of each row's block: its first dword.
            let head = _mm512_i32gather_epi32::<1>(ridx, blk.cast());
            let dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(head));
            let mw = if K == 1 {
                _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(head)))
            } else {
                _mm512_setzero_ps()
            };
            let w = unpack::<K>(blk, rb, ridx);
            accumulate::<T, K>(&mut acc, &w, dw, mw, a, b, off);
        }
        store(&acc)
    }
}

/// Block `b`'s 16 rows (`w`: unsigned weight bytes, `dw` scales, `mw`
/// Q4_1's mins) into every token's accumulators, in block order.
///
/// # Safety
/// Every token holds block `b`'s quants, scale and sums; the module's features.
#[inline(always)]
unsafe fn accumulate<const T: usize, const K: u8>(
    acc: &mut [__m512; T],
    w: &[__m512i; 8],
    dw: __m512,
    mw: __m512,
    a: &[Act<'_>; T],
    b: usize,
    off: i32,
) {
    // SAFETY: the caller's token bounds and CPU features.
    unsafe {
        for (t, acc_t) in acc.iter_mut().enumerate() {
            let at = a.get_unchecked(t);
            let y = at.qs.as_ptr().add(b * 32).cast::<i32>();
            let mut dot = _mm512_set1_epi32(-off * i32::from(*at.bs.get_unchecked(b)));
            for (g, wg) in w.iter().enumerate() {
                dot = _mm512_dpbusd_epi32(dot, *wg, _mm512_set1_epi32(y.add(g).read_unaligned()));
            }
            let sc = _mm512_mul_ps(dw, _mm512_set1_ps(*at.d.get_unchecked(b)));
            *acc_t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), sc, *acc_t);
            if K == 1 {
                *acc_t = _mm512_fmadd_ps(mw, _mm512_set1_ps(*at.s.get_unchecked(b)), *acc_t);
            }
        }
    }
}

#[inline(always)]
unsafe fn store<const T: usize>(acc: &[__m512; T]) -> [[f32; LANES]; T] {
    let mut out = [[0f32; LANES]; T];
    for (o, acc_t) in out.iter_mut().zip(acc) {
        // SAFETY: 16 floats of `o`.
        unsafe { _mm512_storeu_ps(o.as_mut_ptr(), *acc_t) };
    }
    out
}

/// A packed group (`repack::q32`'s layout) of `cols` values a row against
/// `T` tokens: `out[t][r]`, bit-identical to [`dots`] on the rows it packs.
/// `None` when a length does not fit `ty` and `cols`.
///
/// # Safety
/// The CPU has the module's features.
#[inline(always)]
pub(super) unsafe fn packed_dots<const T: usize>(
    ty: GgmlType,
    group: &[u8],
    a: &[Act<'_>; T],
    cols: usize,
) -> Option<[[f32; LANES]; T]> {
    let blocks = super::repack::q32::fits(ty, group, a, cols)?;
    let base = group.as_ptr();
    // SAFETY: `group` is exactly one packed group of `blocks` blocks of `ty`
    // (checked), each token holds `cols` quants and `blocks` scales and
    // sums; the caller's CPU features.
    unsafe {
        Some(match ty {
            GgmlType::Q4_0 => packed::<T, 0>(base, a, blocks),
            GgmlType::Q4_1 => packed::<T, 1>(base, a, blocks),
            GgmlType::Q5_0 => packed::<T, 2>(base, a, blocks),
            GgmlType::Q8_0 => packed::<T, 4>(base, a, blocks),
            _ => return None,
        })
    }
}

/// Bytes ahead of the quants being read that each block prefetches: the
/// group streams from DRAM at real sizes, so the distance covers its latency.
const PACKED_AHEAD: usize = 2048;

/// The packed kernel of one type (`K` as in [`lanes`]).
#[inline(always)]
unsafe fn packed<const T: usize, const K: u8>(
    base: *const u8,
    a: &[Act<'_>; T],
    blocks: usize,
) -> [[f32; LANES]; T] {
    use super::repack::q32;
    let off = q32_offset(K);
    let (qb, hb, sb) = (q32::quant_bytes(K), q32::high_bytes(K), q32::scale_bytes(K));
    // SAFETY (whole fn): `packed_dots` checked the group's length, which
    // holds `blocks` quant, high-bit and scale records at these offsets.
    unsafe {
        let highs = base.add(blocks * qb);
        let scales = highs.add(blocks * hb);
        let mut acc = [_mm512_setzero_ps(); T];
        for b in 0..blocks {
            let q = base.add(b * qb);
            let mut l = 0;
            while l < qb {
                // Past the group's end this reads the next group (or nothing:
                // a prefetch never faults).
                _mm_prefetch::<_MM_HINT_T0>(q.wrapping_add(PACKED_AHEAD + l).cast());
                l += 64;
            }
            let s = scales.add(b * sb);
            let (dw, mw) = if K == 1 {
                let head = _mm512_loadu_si512(s.cast());
                (
                    _mm512_cvtph_ps(_mm512_cvtepi32_epi16(head)),
                    _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(head))),
                )
            } else {
                (
                    _mm512_cvtph_ps(_mm256_loadu_si256(s.cast())),
                    _mm512_setzero_ps(),
                )
            };
            let mut w = [_mm512_setzero_si512(); 8];
            if K == 4 {
                for (g, wg) in w.iter_mut().enumerate() {
                    *wg = _mm512_loadu_si512(q.add(64 * g).cast());
                }
            } else {
                let low = _mm512_set1_epi8(0x0f);
                for m in 0..4 {
                    let v = _mm512_loadu_si512(q.add(64 * m).cast());
                    *w.get_unchecked_mut(m) = _mm512_and_si512(v, low);
                    *w.get_unchecked_mut(m + 4) = _mm512_and_si512(_mm512_srli_epi16::<4>(v), low);
                }
                if K == 2 {
                    let table = _mm512_loadu_si512(FIFTH_BITS.as_ptr().cast());
                    let mut qh = _mm512_loadu_si512(highs.add(b * hb).cast());
                    for wg in &mut w {
                        *wg = _mm512_or_si512(*wg, _mm512_permutexvar_epi32(qh, table));
                        qh = _mm512_srli_epi32::<4>(qh);
                    }
                }
            }
            accumulate::<T, K>(&mut acc, &w, dw, mw, a, b, off);
        }
        store(&acc)
    }
}
