//! Q4_K and Q6_K with rows in the lanes, on weights packed at load: one
//! 512-bit register holds four weights of each of `LANES` (16) rows, and one
//! `vpdpbusd` against four activation bytes broadcast adds four products
//! into each row's int32 lane (as `vnni_lanes` does for the 32-value types).
//! Every register the kernel needs is one contiguous, 64-byte aligned load of
//! the packed group: no gathers, no per-row loads, and no horizontal sums
//! (lane `r` is row `r`'s result).
//!
//! A group is its super-blocks (256 values of the 16 rows) one after the
//! other, each a fixed-size record:
//!
//! - Q4_K, 2368 bytes: the rows' f16 `d` (32 bytes) and `dmin` (32); the
//!   six-bit scales and mins unpacked to bytes, `[sub-block j][row]` (128
//!   each); the quants, 512 bytes per pair of sub-blocks `2k, 2k + 1`:
//!   register `g` (64 bytes) holds row `r`'s byte `4g + i` of the pair at
//!   `4r + i`, as the file stores it (low nibble: value `4g + i` of
//!   sub-block `2k`; high nibble: the same of `2k + 1`). Stored: 2304 bytes
//!   (16 x 144); packed +2.8%, the unpacked scales and mins.
//! - Q6_K, 3392 bytes: the rows' `d` widened to f32 (64 bytes); the int8
//!   scales as pairs, `[k][row][2k, 2k + 1]` (256: `vpmovsxbw` makes the
//!   int16 pairs `vpdpwssd` takes); then per sub-block `j` of 16 values,
//!   192 bytes: two registers of low nibbles (row `r`'s values
//!   `16j + i` | `16j + 4 + i` << 4 at `4r + i`, then `16j + 8 + i` |
//!   `16j + 12 + i` << 4) and one of the high two bits (value `16j + 4k + i`
//!   at bits `2k` of byte `4r + i`). Stored: 3360 bytes (16 x 210); packed
//!   +0.95%, the f32 scales, which keep every record 64-byte aligned.
//!
//! Per super-block and token, each sub-block's int32 dot (8 `vpdpbusd` for
//! Q4_K's 32 values, 4 for Q6_K's 16) takes its scale by `vpmulld` into one
//! int32 accumulator (exact: at most 30.7M for Q4_K, 396M for Q6_K). Q4_K's
//! mins and Q6_K's `−32` offset come from the activations' 16-value sums by
//! `vpdpwssd` (8 a super-block): Q4_K's into a second int32 lane as
//! `Σ mn_j · (s_2j + s_2j+1)`, Q6_K's into the same one as `−32 · sc_j`
//! pairs against `(s_2k, s_2k+1)`. The super-block then adds
//! `d·da · I − dmin·da · M` to the token's f32 lanes, in super-block order.
//! No step of a token's sum looks at another token, so its result is the
//! same bits whatever else shares the call.
//!
//! `dots` is `#[inline(always)]`: its callers are compiled with avx2, fma,
//! f16c, avx512f/bw/vl and avx512vnni. `pack` is portable.

use super::act::Act;
use super::kernel::LANES;
use super::unpack::{q6, scale_min_k4};
use crate::ggml_type::GgmlType;
use std::arch::x86_64::*;

/// Packed bytes of one Q4_K super-block of the group's rows.
pub(super) const Q4K_SB: usize = 2368;
/// Where a Q4_K record's parts start.
pub(super) const Q4K_DMIN: usize = 32;
pub(super) const Q4K_SC: usize = 64;
pub(super) const Q4K_MN: usize = 192;
pub(super) const Q4K_QS: usize = 320;
/// Packed bytes of one Q6_K super-block of the group's rows.
pub(super) const Q6K_SB: usize = 3392;
/// Where a Q6_K record's scale pairs and quants start.
pub(super) const Q6K_SC: usize = 64;
pub(super) const Q6K_QS: usize = 320;
/// A Q6_K sub-block's quants: two low-nibble registers and one of high bits.
pub(super) const Q6K_SUB: usize = 192;

/// Packed bytes of one super-block of the group's rows.
fn record_bytes(ty: GgmlType) -> Option<usize> {
    match ty {
        GgmlType::Q4_K => Some(Q4K_SB),
        GgmlType::Q6_K => Some(Q6K_SB),
        _ => None,
    }
}

/// Bytes of one packed group of [`LANES`] rows of `ty` with `cols` values;
/// `None` when `ty` is not Q4_K/Q6_K or `cols` not a positive multiple of 256.
pub(super) fn group_bytes(ty: GgmlType, cols: usize) -> Option<usize> {
    if cols == 0 || !cols.is_multiple_of(256) {
        return None;
    }
    (cols / 256).checked_mul(record_bytes(ty)?)
}

/// Packs [`LANES`] consecutive stored rows (`rows`: `LANES * rb` bytes, `rb`
/// one row's) into `out` (exactly [`group_bytes`] long). The lengths are
/// checked once, by `quant::pack`; here a mismatch only stops at the first
/// access out of range (`None`).
pub(super) fn pack(ty: GgmlType, rows: &[u8], rb: usize, out: &mut [u8]) -> Option<()> {
    let (rec_bytes, bb) = (record_bytes(ty)?, ty.block_bytes());
    for (r, row) in rows.chunks_exact(rb).enumerate() {
        for (blk, rec) in row.chunks_exact(bb).zip(out.chunks_exact_mut(rec_bytes)) {
            if ty == GgmlType::Q4_K {
                pack_q4k(blk, r, rec)?;
            } else {
                pack_q6k(blk, r, rec)?;
            }
        }
    }
    Some(())
}

/// Row `r`'s Q4_K super-block `blk` (144 bytes) into its record.
fn pack_q4k(blk: &[u8], r: usize, rec: &mut [u8]) -> Option<()> {
    rec.get_mut(2 * r..2 * r + 2)?
        .copy_from_slice(blk.get(..2)?);
    let dmin = Q4K_DMIN + 2 * r;
    rec.get_mut(dmin..dmin + 2)?.copy_from_slice(blk.get(2..4)?);
    let (sc, mn) = scale_min_k4(blk.get(4..16)?.try_into().ok()?);
    for j in 0..8 {
        *rec.get_mut(Q4K_SC + 16 * j + r)? = *sc.get(j)?;
        *rec.get_mut(Q4K_MN + 16 * j + r)? = *mn.get(j)?;
    }
    for k in 0..4 {
        for g in 0..8 {
            let src = 16 + 32 * k + 4 * g;
            let dst = Q4K_QS + 512 * k + 64 * g + 4 * r;
            rec.get_mut(dst..dst + 4)?
                .copy_from_slice(blk.get(src..src + 4)?);
        }
    }
    Some(())
}

/// Row `r`'s Q6_K super-block `blk` (210 bytes) into its record.
fn pack_q6k(blk: &[u8], r: usize, rec: &mut [u8]) -> Option<()> {
    let d = offgraph_kv::half::f16_le([*blk.get(208)?, *blk.get(209)?]);
    rec.get_mut(4 * r..4 * r + 4)?
        .copy_from_slice(&d.to_le_bytes());
    let scales = blk.get(192..208)?;
    for k in 0..8 {
        let at = Q6K_SC + 32 * k + 2 * r;
        rec.get_mut(at..at + 2)?
            .copy_from_slice(scales.get(2 * k..2 * k + 2)?);
    }
    let (ql, qh) = (blk.get(..128)?, blk.get(128..192)?);
    // Value `v` (0..256) of the super-block, six bits.
    let q = |v: usize| q6(ql, qh, v / 128, v % 128);
    for j in 0..16 {
        let sub = Q6K_QS + Q6K_SUB * j + 4 * r;
        for i in 0..4 {
            let v = 16 * j + i;
            *rec.get_mut(sub + i)? = (q(v) & 15) | ((q(v + 4) & 15) << 4);
            *rec.get_mut(sub + 64 + i)? = (q(v + 8) & 15) | ((q(v + 12) & 15) << 4);
            *rec.get_mut(sub + 128 + i)? =
                (0..4).fold(0, |h, k| h | ((q(v + 4 * k) >> 4) << (2 * k)));
        }
    }
    Some(())
}

/// The check every packed Q4_K/Q6_K kernel relies on: `group` is exactly one
/// group of `ty` with `cols` values a row and each token holds `cols`
/// quants, a scale per super-block and a sum per 16 values; the super-blocks
/// of a row when it passes.
pub(super) fn fits(ty: GgmlType, group: &[u8], a: &[Act<'_>], cols: usize) -> Option<usize> {
    if group_bytes(ty, cols)? != group.len() {
        return None;
    }
    let sbs = cols / 256;
    a.iter()
        .all(|a| a.qs.len() >= cols && a.d.len() >= sbs && a.bs.len() >= cols / 16)
        .then_some(sbs)
}

/// [`LANES`] packed rows (`group`, one [`group_bytes`] record set) against
/// `T` tokens' Q8_K activations: `out[t][r]`; `None` when a length does not
/// fit `ty` and `cols`. A token's result does not depend on `T` or on the
/// other tokens.
///
/// # Safety
/// The CPU has avx2, fma, f16c, avx512f/bw/vl and avx512vnni.
#[inline(always)]
pub(super) unsafe fn dots<const T: usize>(
    ty: GgmlType,
    group: &[u8],
    a: &[Act<'_>; T],
    cols: usize,
) -> Option<[[f32; LANES]; T]> {
    let sbs = fits(ty, group, a, cols)?;
    // SAFETY: the group holds `sbs` records of `ty` and every token `cols`
    // quants, `sbs` scales and `cols / 16` sums (checked); the caller's CPU.
    unsafe {
        Some(if ty == GgmlType::Q4_K {
            kernel::<T, 4>(group.as_ptr(), a, sbs)
        } else {
            kernel::<T, 6>(group.as_ptr(), a, sbs)
        })
    }
}

/// Token `a`'s four quants at `at` broadcast to every lane.
#[inline(always)]
unsafe fn quad(a: &Act<'_>, at: usize) -> __m512i {
    // SAFETY: the caller's `at + 4 <= a.qs.len()`.
    unsafe { _mm512_set1_epi32(a.qs.as_ptr().add(at).cast::<i32>().read_unaligned()) }
}

/// Token `a`'s 16-value sums `2k, 2k + 1` of super-block `b` (an int16 pair)
/// broadcast to every lane.
#[inline(always)]
unsafe fn sum_pair(a: &Act<'_>, b: usize, k: usize) -> __m512i {
    // SAFETY: the caller's `16 b + 2k + 2 <= a.bs.len()`.
    unsafe {
        _mm512_set1_epi32(
            a.bs.as_ptr()
                .add(16 * b + 2 * k)
                .cast::<i32>()
                .read_unaligned(),
        )
    }
}

/// Tokens a super-block pass takes at once: their int32 accumulators and a
/// sub-block's weights then stay in registers (measured 5-12% faster than
/// tiles of 4 or 16).
const TILE: usize = 8;
// `kernel` takes the tokens a tile leaves over (fewer than `TILE`) by a
// match up to 7.
const _: () = assert!(TILE <= 8);

/// The kernel of `ty` (`K`: 4 Q4_K, 6 Q6_K) over `sbs` records from `g`:
/// super-block by super-block, each for the tokens a tile at a time (the
/// record stays in L1 between tiles).
#[inline(always)]
unsafe fn kernel<const T: usize, const K: u8>(
    g: *const u8,
    a: &[Act<'_>; T],
    sbs: usize,
) -> [[f32; LANES]; T] {
    let mut acc = [_mm512_setzero_ps(); T];
    for b in 0..sbs {
        let mut t0 = 0;
        while t0 + TILE <= T {
            // SAFETY: the caller's records and views.
            unsafe { tile::<TILE, K>(g, a, &mut acc, t0, b) };
            t0 += TILE;
        }
        // SAFETY: as above.
        unsafe {
            match T - t0 {
                1 => tile::<1, K>(g, a, &mut acc, t0, b),
                2 => tile::<2, K>(g, a, &mut acc, t0, b),
                3 => tile::<3, K>(g, a, &mut acc, t0, b),
                4 => tile::<4, K>(g, a, &mut acc, t0, b),
                5 => tile::<5, K>(g, a, &mut acc, t0, b),
                6 => tile::<6, K>(g, a, &mut acc, t0, b),
                7 => tile::<7, K>(g, a, &mut acc, t0, b),
                _ => {}
            }
        }
    }
    // SAFETY: register stores into arrays.
    unsafe { store(&acc) }
}

/// Super-block `b` for the `N` tokens from `t0`.
#[inline(always)]
unsafe fn tile<const N: usize, const K: u8>(
    g: *const u8,
    a: &[Act<'_>],
    acc: &mut [__m512],
    t0: usize,
    b: usize,
) {
    let a = a.get(t0..).and_then(|a| a.first_chunk::<N>());
    let acc = acc.get_mut(t0..).and_then(|c| c.first_chunk_mut::<N>());
    if let (Some(a), Some(acc)) = (a, acc) {
        // SAFETY: the caller's records and views.
        unsafe {
            if K == 4 {
                q4k_sb::<N>(g.add(b * Q4K_SB), a, b, acc);
            } else {
                q6k_sb::<N>(g.add(b * Q6K_SB), a, b, acc);
            }
        }
    }
}

/// One sub-block's int32 dot of the weights `w` (four values a register)
/// with token `at`'s quants from `y`. Few tokens leave the `vpdpbusd`
/// latency exposed, so they take two chains (integer sums: the same value).
#[inline(always)]
unsafe fn dot<const N: usize, const G: usize>(w: &[__m512i; G], at: &Act<'_>, y: usize) -> __m512i {
    // SAFETY: the caller's `y + 4 G <= at.qs.len()`.
    unsafe {
        let (mut d0, mut d1) = (_mm512_setzero_si512(), _mm512_setzero_si512());
        for (i, wi) in w.iter().enumerate() {
            if N < 4 && i % 2 == 1 {
                d1 = _mm512_dpbusd_epi32(d1, *wi, quad(at, y + 4 * i));
            } else {
                d0 = _mm512_dpbusd_epi32(d0, *wi, quad(at, y + 4 * i));
            }
        }
        if N < 4 {
            _mm512_add_epi32(d0, d1)
        } else {
            d0
        }
    }
}

/// Q4_K super-block `b` (record `p`) for `N` tokens.
#[inline(always)]
unsafe fn q4k_sb<const N: usize>(p: *const u8, a: &[Act<'_>; N], b: usize, acc: &mut [__m512; N]) {
    // SAFETY (whole fn): `dots` checked the records and the tokens' views;
    // every load below reads inside record `b`.
    unsafe {
        let low = _mm512_set1_epi8(0x0f);
        let mut iacc = [_mm512_setzero_si512(); N];
        for j in 0..8 {
            let sc = _mm512_cvtepu8_epi32(_mm_loadu_si128(p.add(Q4K_SC + 16 * j).cast()));
            let q = p.add(Q4K_QS + 512 * (j / 2));
            let mut w = [_mm512_setzero_si512(); 8];
            for (i, wi) in w.iter_mut().enumerate() {
                let v = _mm512_loadu_si512(q.add(64 * i).cast());
                let v = if j % 2 == 0 {
                    v
                } else {
                    _mm512_srli_epi16::<4>(v)
                };
                *wi = _mm512_and_si512(v, low);
            }
            for (at, ia) in a.iter().zip(iacc.iter_mut()) {
                let d = dot::<N, 8>(&w, at, 256 * b + 32 * j);
                *ia = _mm512_add_epi32(*ia, _mm512_mullo_epi32(d, sc));
            }
        }
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()));
        let dmin = _mm512_cvtph_ps(_mm256_loadu_si256(p.add(Q4K_DMIN).cast()));
        // Each min twice, an int16 pair against a pair of 16-value sums.
        let mut mn = [_mm512_setzero_si512(); 8];
        for (j, m) in mn.iter_mut().enumerate() {
            let v = _mm512_cvtepu8_epi32(_mm_loadu_si128(p.add(Q4K_MN + 16 * j).cast()));
            *m = _mm512_or_si512(v, _mm512_slli_epi32::<16>(v));
        }
        for ((at, ia), acc_t) in a.iter().zip(&iacc).zip(acc.iter_mut()) {
            let mut m = _mm512_setzero_si512();
            for (j, mj) in mn.iter().enumerate() {
                m = _mm512_dpwssd_epi32(m, *mj, sum_pair(at, b, j));
            }
            let da = _mm512_set1_ps(*at.d.get_unchecked(b));
            *acc_t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(*ia), _mm512_mul_ps(d, da), *acc_t);
            *acc_t = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(m), _mm512_mul_ps(dmin, da), *acc_t);
        }
    }
}

/// Q6_K super-block `b` (record `p`) for `N` tokens.
#[inline(always)]
unsafe fn q6k_sb<const N: usize>(p: *const u8, a: &[Act<'_>; N], b: usize, acc: &mut [__m512; N]) {
    // SAFETY (whole fn): as `q4k_sb`.
    unsafe {
        let low = _mm512_set1_epi8(0x0f);
        let high = _mm512_set1_epi8(0x30);
        let mut iacc = [_mm512_setzero_si512(); N];
        for k in 0..8 {
            // Row r's dword: scales 2k, 2k + 1 as int16.
            let pair = _mm512_cvtepi8_epi16(_mm256_loadu_si256(p.add(Q6K_SC + 32 * k).cast()));
            let off = _mm512_mullo_epi16(pair, _mm512_set1_epi16(-32));
            for (at, ia) in a.iter().zip(iacc.iter_mut()) {
                *ia = _mm512_dpwssd_epi32(*ia, off, sum_pair(at, b, k));
            }
            for h in 0..2 {
                let j = 2 * k + h;
                let sc = if h == 0 {
                    _mm512_srai_epi32::<16>(_mm512_slli_epi32::<16>(pair))
                } else {
                    _mm512_srai_epi32::<16>(pair)
                };
                let q = p.add(Q6K_QS + Q6K_SUB * j);
                let lo0 = _mm512_loadu_si512(q.cast());
                let lo1 = _mm512_loadu_si512(q.add(64).cast());
                let hi = _mm512_loadu_si512(q.add(128).cast());
                let w = [
                    join(lo0, _mm512_slli_epi16::<4>(hi), low, high),
                    join(
                        _mm512_srli_epi16::<4>(lo0),
                        _mm512_slli_epi16::<2>(hi),
                        low,
                        high,
                    ),
                    join(lo1, hi, low, high),
                    join(
                        _mm512_srli_epi16::<4>(lo1),
                        _mm512_srli_epi16::<2>(hi),
                        low,
                        high,
                    ),
                ];
                for (at, ia) in a.iter().zip(iacc.iter_mut()) {
                    let d = dot::<N, 4>(&w, at, 256 * b + 16 * j);
                    *ia = _mm512_add_epi32(*ia, _mm512_mullo_epi32(d, sc));
                }
            }
        }
        let d = _mm512_loadu_ps(p.cast());
        for ((at, ia), acc_t) in a.iter().zip(&iacc).zip(acc.iter_mut()) {
            let da = _mm512_set1_ps(*at.d.get_unchecked(b));
            *acc_t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(*ia), _mm512_mul_ps(d, da), *acc_t);
        }
    }
}

/// Six-bit Q6_K quants: `l`'s low nibbles and `h`'s bits 4 and 5. A plain
/// function, not a closure: one that failed to inline would run the
/// intrinsics without the caller's target features.
#[inline(always)]
unsafe fn join(l: __m512i, h: __m512i, low: __m512i, high: __m512i) -> __m512i {
    // SAFETY: register-only AVX-512 arithmetic.
    unsafe { _mm512_or_si512(_mm512_and_si512(l, low), _mm512_and_si512(h, high)) }
}

/// The tokens' f32 lanes as arrays.
#[inline(always)]
unsafe fn store<const T: usize>(acc: &[__m512; T]) -> [[f32; LANES]; T] {
    let mut out = [[0f32; LANES]; T];
    for (o, v) in out.iter_mut().zip(acc) {
        // SAFETY: 16 f32 of `o`.
        unsafe { _mm512_storeu_ps(o.as_mut_ptr(), *v) };
    }
    out
}

#[cfg(test)]
// Test code: a panic at a bad index or value is the failure report.
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use crate::quant::act::{ActBuf, ActKind};
    use offgraph_kv::half::{f16_le, f32_to_f16};

    /// Whether this CPU runs the kernels. Where it does not, the engine
    /// never packs for them (checked here: its quantized path is another),
    /// so a test's kernel half has nothing to run.
    fn cpu_runs_them() -> bool {
        let vnni = offgraph_kv::cpu::features().avx512_vnni();
        if !vnni {
            assert_ne!(
                crate::quant::active_isa(),
                crate::quant::QuantIsa::Avx512Vnni
            );
        }
        vnni
    }

    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }
        fn unit(&mut self) -> f32 {
            (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        }
    }

    fn f16_bytes(v: f32) -> [u8; 2] {
        f32_to_f16(v).to_le_bytes()
    }

    /// `LANES` random stored rows of `ty` with finite, modest scales.
    fn rows(ty: GgmlType, cols: usize, seed: u64) -> Vec<u8> {
        let mut r = Rng(seed);
        let rb = ty.row_bytes(cols as u64).unwrap() as usize;
        let mut data: Vec<u8> = (0..LANES * rb).map(|_| r.next() as u8).collect();
        for blk in data.chunks_exact_mut(ty.block_bytes()) {
            if ty == GgmlType::Q4_K {
                blk[..2].copy_from_slice(&f16_bytes(0.01 + 0.02 * r.unit().abs()));
                blk[2..4].copy_from_slice(&f16_bytes(0.02 * r.unit()));
            } else {
                blk[208..].copy_from_slice(&f16_bytes(0.001 + 0.002 * r.unit().abs()));
            }
        }
        data
    }

    /// `n` tokens' inputs, mostly small with a few large values.
    fn input(n: usize, cols: usize, seed: u64) -> Vec<f32> {
        let mut r = Rng(seed);
        (0..n * cols)
            .map(|i| {
                if i % 97 == 5 {
                    8.0 * r.unit()
                } else {
                    r.unit()
                }
            })
            .collect()
    }

    /// Row `row`'s weights in f64 from the stored bytes (exact).
    fn weights(ty: GgmlType, row: &[u8]) -> Vec<f64> {
        let mut w = Vec::new();
        for blk in row.chunks_exact(ty.block_bytes()) {
            if ty == GgmlType::Q4_K {
                let d = f64::from(f16_le([blk[0], blk[1]]));
                let dmin = f64::from(f16_le([blk[2], blk[3]]));
                let (sc, mn) = scale_min_k4(blk[4..16].try_into().unwrap());
                for v in 0..256 {
                    let (j, l) = (v / 32, v % 32);
                    let byte = blk[16 + 32 * (j / 2) + l];
                    let q = if j % 2 == 0 { byte & 15 } else { byte >> 4 };
                    w.push(d * f64::from(sc[j]) * f64::from(q) - dmin * f64::from(mn[j]));
                }
            } else {
                let d = f64::from(f16_le([blk[208], blk[209]]));
                for v in 0..256 {
                    let q = i32::from(q6(&blk[..128], &blk[128..192], v / 128, v % 128)) - 32;
                    let s = f64::from(blk[192 + v / 16] as i8);
                    w.push(d * s * f64::from(q));
                }
            }
        }
        w
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn packed<const T: usize>(
        ty: GgmlType,
        group: &[u8],
        a: &[Act<'_>; T],
        cols: usize,
    ) -> Option<[[f32; LANES]; T]> {
        // SAFETY: the caller checked the CPU (`cpu_runs_them`).
        unsafe { dots::<T>(ty, group, a, cols) }
    }

    /// The per-row VNNI kernel's result for one stored row and token.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn per_row(ty: GgmlType, row: &[u8], a: &Act<'_>, cols: usize) -> f32 {
        // SAFETY: `row` holds `cols` values of `ty`, `a` their activations;
        // the caller checked the CPU.
        unsafe {
            if ty == GgmlType::Q4_K {
                super::super::vnni_k::q4k::<1>(row, &[*a], cols)[0]
            } else {
                super::super::vnni_k::q6k::<1>(row, &[*a], cols)[0]
            }
        }
    }

    fn packed_group(ty: GgmlType, stored: &[u8], cols: usize) -> Vec<u8> {
        let rb = stored.len() / LANES;
        let mut g = vec![0u8; group_bytes(ty, cols).unwrap()];
        pack(ty, stored, rb, &mut g).unwrap();
        g
    }

    /// `dots` against the f64 product of the exact weights and the quantized
    /// activations (the integer dots are exact; only f32 rounding differs),
    /// and against the per-row kernel.
    #[test]
    fn dots_match_the_exact_product_and_the_per_row_kernel() {
        if !cpu_runs_them() {
            return;
        }
        let mut worst = (0f64, 0f64);
        for (case, ty) in [GgmlType::Q4_K, GgmlType::Q6_K].into_iter().enumerate() {
            for cols in [256, 2048] {
                let seed = 17 * case as u64 + cols as u64;
                let stored = rows(ty, cols, seed);
                let group = packed_group(ty, &stored, cols);
                let x = input(4, cols, seed + 1);
                let mut buf = ActBuf::default();
                buf.fill(ActKind::Q8K, &x, cols, 4);
                let a: [Act; 4] = core::array::from_fn(|t| buf.token(&x, t).unwrap());
                // SAFETY: the CPU was checked.
                let got = unsafe { packed::<4>(ty, &group, &a, cols) }.unwrap();
                let rb = stored.len() / LANES;
                for (r, row) in stored.chunks_exact(rb).enumerate() {
                    let w = weights(ty, row);
                    for (t, at) in a.iter().enumerate() {
                        let (mut exact, mut mag) = (0f64, 0f64);
                        for (c, wc) in w.iter().enumerate() {
                            let y = f64::from(at.qs[c]) * f64::from(at.d[c / 256]);
                            exact += wc * y;
                            mag += (wc * y).abs();
                        }
                        let v = f64::from(got[t][r]);
                        // f32 rounding of the scaled super-block sums.
                        let err = (v - exact).abs() / mag;
                        assert!(
                            err < 1e-6,
                            "{ty:?} cols {cols} row {r} token {t}: {v} vs {exact}"
                        );
                        // SAFETY: as above.
                        let old = f64::from(unsafe { per_row(ty, row, at, cols) });
                        let rel = (v - old).abs() / old.abs().max(mag * 1e-2);
                        assert!(
                            rel < 1e-5,
                            "{ty:?} cols {cols} row {r} token {t}: {v} vs per-row {old}"
                        );
                        worst = (worst.0.max(err), worst.1.max(rel));
                    }
                }
            }
        }
        println!(
            "worst error / Σ|w·y|: {:.2e}; worst relative gap to the per-row kernel: {:.2e}",
            worst.0, worst.1
        );
    }

    /// Checks every token of windows of `T` against its `T = 1` bits.
    fn same_bits<const T: usize>(
        ty: GgmlType,
        group: &[u8],
        a: &[Act<'_>],
        cols: usize,
        alone: &[[f32; LANES]],
    ) {
        for s in [0, a.len() - T] {
            let w: [Act; T] = core::array::from_fn(|i| a[s + i]);
            // SAFETY: the caller checked the CPU.
            let got = unsafe { packed::<T>(ty, group, &w, cols) }.unwrap();
            for (i, g) in got.iter().enumerate() {
                let bits = |v: &[f32; LANES]| v.map(f32::to_bits);
                assert_eq!(bits(g), bits(&alone[s + i]), "{ty:?} T {T} token {}", s + i);
            }
        }
    }

    /// A token's outputs are the same bits whatever else shares the call.
    #[test]
    fn every_token_count_gives_the_same_bits() {
        if !cpu_runs_them() {
            return;
        }
        let cols = 512;
        for ty in [GgmlType::Q4_K, GgmlType::Q6_K] {
            let stored = rows(ty, cols, 5);
            let group = packed_group(ty, &stored, cols);
            let n = 19;
            let x = input(n, cols, 6);
            let mut buf = ActBuf::default();
            buf.fill(ActKind::Q8K, &x, cols, n);
            let a: Vec<Act> = (0..n).map(|t| buf.token(&x, t).unwrap()).collect();
            // SAFETY: the CPU was checked.
            let alone: Vec<[f32; LANES]> = a
                .iter()
                .map(|at| unsafe { packed::<1>(ty, &group, &[*at], cols) }.unwrap()[0])
                .collect();
            same_bits::<2>(ty, &group, &a, cols, &alone);
            same_bits::<3>(ty, &group, &a, cols, &alone);
            same_bits::<4>(ty, &group, &a, cols, &alone);
            same_bits::<5>(ty, &group, &a, cols, &alone);
            same_bits::<6>(ty, &group, &a, cols, &alone);
            same_bits::<7>(ty, &group, &a, cols, &alone);
            same_bits::<8>(ty, &group, &a, cols, &alone);
            same_bits::<9>(ty, &group, &a, cols, &alone);
            same_bits::<10>(ty, &group, &a, cols, &alone);
            same_bits::<11>(ty, &group, &a, cols, &alone);
            same_bits::<12>(ty, &group, &a, cols, &alone);
            same_bits::<13>(ty, &group, &a, cols, &alone);
            same_bits::<14>(ty, &group, &a, cols, &alone);
            same_bits::<15>(ty, &group, &a, cols, &alone);
            same_bits::<16>(ty, &group, &a, cols, &alone);
        }
    }

    /// Wrong types, shapes and lengths are refused (a pack's lengths are
    /// checked by `quant::pack`, tested in `tests/quant_packed.rs`).
    #[test]
    fn bad_lengths_are_refused() {
        assert_eq!(group_bytes(GgmlType::Q4_K, 512), Some(2 * Q4K_SB));
        assert_eq!(group_bytes(GgmlType::Q6_K, 256), Some(Q6K_SB));
        for (ty, cols) in [
            (GgmlType::Q4_0, 256),
            (GgmlType::Q5_K, 256),
            (GgmlType::Q4_K, 0),
            (GgmlType::Q4_K, 128),
            (GgmlType::Q6_K, 384),
        ] {
            assert_eq!(group_bytes(ty, cols), None, "{ty:?} {cols}");
        }
        let (ty, cols) = (GgmlType::Q4_K, 512);
        let stored = rows(ty, cols, 9);
        let group = packed_group(ty, &stored, cols);
        if !cpu_runs_them() {
            return;
        }
        let x = input(1, cols, 3);
        let mut buf = ActBuf::default();
        buf.fill(ActKind::Q8K, &x, cols, 1);
        let a = [buf.token(&x, 0).unwrap()];
        // SAFETY: the CPU was checked.
        unsafe {
            assert!(packed::<1>(ty, &group[1..], &a, cols).is_none());
            assert!(packed::<1>(ty, &group, &a, cols + 256).is_none());
            assert!(packed::<1>(GgmlType::Q6_K, &group, &a, cols).is_none());
            assert!(packed::<1>(GgmlType::Q4_0, &group, &a, cols).is_none());
            let short = Act {
                qs: &a[0].qs[..cols - 1],
                ..a[0]
            };
            assert!(packed::<1>(ty, &group, &[short], cols).is_none());
            let short = Act {
                bs: &a[0].bs[..cols / 16 - 1],
                ..a[0]
            };
            assert!(packed::<1>(ty, &group, &[short], cols).is_none());
            assert!(packed::<1>(ty, &group, &a, cols).is_some());
        }
    }
}
