//! AVX2 dots of the 32-value block types' groups packed at load
//! (`repack::q32`'s layout, the one the VNNI lanes kernels read), rows in
//! the lanes: each 64-byte record holds four weights of each of 16 rows, so
//! its two 32-byte halves are four weights of rows 0..8 and of rows 8..16.
//! Against four activation bytes broadcast to every lane, one `vpmaddubsw`
//! gives each row's two pair sums in int16, and the block's eight of them
//! add up before one `vpmaddwd` widens them: a (block, token) costs about
//! 30 operations for eight rows, where the per-row kernels (`avx2`) spend
//! 15 to 18 on each row, and no lane needs a horizontal sum.
//!
//! Overflow: a pair is at most 2 · 31 · 127 (Q5_0's `q + 16`), so four
//! `vpmaddubsw` sums stay inside int16 (31,496); Q4_0's `q + 8` and Q4_1's
//! nibbles (at most 15) allow all eight (30,480). Q8_0's `q + 128` would not
//! fit a pair: it enters as `|q|` with the activation taking `q`'s sign, as
//! in `avx2`, each product widened on its own.
//!
//! Per (row, token) the blocks' scaled dots are summed in block order by
//! one FMA each, whatever the token count: a token's result does not depend
//! on the step it ran in. Only reached from `driver::compute_avx2` (compiled
//! with avx2, fma and f16c) through `avx2::Avx2::dots_packed`.

use super::act::Act;
use super::kernel::LANES;
use super::repack::q32;
use super::simd::q32_offset;
use crate::ggml_type::GgmlType;
use std::arch::x86_64::*;

/// Rows of a half record (one 256-bit register of int32 lanes).
const HALF: usize = LANES / 2;

/// Bytes ahead of the quants being read that each block prefetches (the
/// group streams from DRAM at real sizes; as the VNNI packed kernel).
const AHEAD: usize = 2048;

/// A packed group of `cols` values a row against `T` tokens: `out[t][r]`;
/// `None` when a length does not fit `ty` and `cols`.
///
/// # Safety
/// The CPU has avx2, fma and f16c.
#[inline(always)]
pub(super) unsafe fn dots<const T: usize>(
    ty: GgmlType,
    group: &[u8],
    a: &[Act<'_>; T],
    cols: usize,
) -> Option<[[f32; LANES]; T]> {
    let blocks = q32::fits(ty, group, a, cols)?;
    let base = group.as_ptr();
    // SAFETY: `group` is exactly one packed group of `blocks` blocks of `ty`
    // (checked), each token holds `cols` quants and `blocks` scales and
    // sums; the caller's CPU features.
    unsafe {
        Some(match ty {
            GgmlType::Q4_0 => run(&Q32::<0> { base, blocks }, a, blocks),
            GgmlType::Q4_1 => run(&Q32::<1> { base, blocks }, a, blocks),
            GgmlType::Q5_0 => run(&Q32::<2> { base, blocks }, a, blocks),
            GgmlType::Q8_0 => run(&Q32::<4> { base, blocks }, a, blocks),
            _ => return None,
        })
    }
}

/// Tokens a pass over a half record takes: their accumulators and the
/// eight weight registers fit the sixteen (more spill every FMA to the stack;
/// a pass unpacks the half again, from L1).
const CHUNK: usize = 4;

/// One unit of a packed group (a block, or a K type's super-block) for rows
/// `8h..8h + 8` against `C` tokens, added into their accumulators: what a
/// packed kernel of this path does between [`run`]'s loops.
pub(super) trait HalfStep {
    /// `first`: the first pass over the group (tokens `0..C`), the one that
    /// streams it from memory.
    ///
    /// # Safety
    /// `unit` and the tokens' views are inside what the kernel's `dots`
    /// checked; the CPU has avx2, fma and f16c.
    unsafe fn step<const C: usize>(
        &self,
        a: &[Act<'_>; C],
        unit: usize,
        h: usize,
        first: bool,
        acc: &mut [__m256; C],
    );
}

/// The group's `units` against `T` tokens: `out[t][r]`. The tokens in
/// passes of at most [`CHUNK`]; each pass goes unit by unit, both halves of
/// a record one after the other, so each line is used whole while in L1 (a
/// pass per half over the group has twice the lines in flight from DRAM:
/// it decoded a 1.7B Q8_0 at half the rate, and Q4_K_M slower than in place).
///
/// # Safety
/// As [`HalfStep::step`] for every unit below `units`.
#[inline(always)]
pub(super) unsafe fn run<const T: usize, S: HalfStep>(
    s: &S,
    a: &[Act<'_>; T],
    units: usize,
) -> [[f32; LANES]; T] {
    let mut out = [[0f32; LANES]; T];
    let mut t = 0;
    while t < T {
        let n = (T - t).min(CHUNK);
        // SAFETY: the caller's units and tokens.
        unsafe {
            match n {
                1 => pass::<1, S>(s, a, units, t, &mut out),
                2 => pass::<2, S>(s, a, units, t, &mut out),
                3 => pass::<3, S>(s, a, units, t, &mut out),
                _ => pass::<CHUNK, S>(s, a, units, t, &mut out),
            }
        }
        t += n;
    }
    out
}

/// The `C` tokens from `t` into `out` (see [`run`]).
#[inline(always)]
unsafe fn pass<const C: usize, S: HalfStep>(
    s: &S,
    a: &[Act<'_>],
    units: usize,
    t: usize,
    out: &mut [[f32; LANES]],
) {
    let Some(chunk) = a.get(t..t + C).and_then(|c| <&[Act; C]>::try_from(c).ok()) else {
        return;
    };
    let mut acc = [[_mm256_setzero_ps(); C]; 2];
    for u in 0..units {
        for (h, acc_h) in acc.iter_mut().enumerate() {
            // SAFETY: the caller's units and tokens.
            unsafe { s.step::<C>(chunk, u, h, t == 0, acc_h) };
        }
    }
    for (h, acc_h) in acc.iter().enumerate() {
        for (o, acc_t) in out.iter_mut().skip(t).zip(acc_h) {
            if let Some(o) = o.get_mut(h * HALF..(h + 1) * HALF) {
                // SAFETY: eight floats of `o`.
                unsafe { _mm256_storeu_ps(o.as_mut_ptr(), *acc_t) };
            }
        }
    }
}

/// A 32-value type's packed group (`K` 0 Q4_0, 1 Q4_1, 2 Q5_0, 4 Q8_0):
/// its base and blocks a row.
struct Q32<const K: u8> {
    base: *const u8,
    blocks: usize,
}

impl<const K: u8> HalfStep for Q32<K> {
    #[inline(always)]
    unsafe fn step<const C: usize>(
        &self,
        a: &[Act<'_>; C],
        b: usize,
        h: usize,
        first: bool,
        acc: &mut [__m256; C],
    ) {
        // SAFETY: the caller's block and tokens.
        unsafe { block_half::<C, K>(self.base, a, self.blocks, b, h, first, acc) }
    }
}

/// Block `b`'s rows `8h..8h + 8` against the tokens, into `acc`; `K` 0
/// Q4_0, 1 Q4_1, 2 Q5_0, 4 Q8_0. `fetch`: the first pass over the group,
/// which prefetches ahead.
#[inline(always)]
unsafe fn block_half<const T: usize, const K: u8>(
    base: *const u8,
    a: &[Act<'_>; T],
    blocks: usize,
    b: usize,
    h: usize,
    fetch: bool,
    acc: &mut [__m256; T],
) {
    let (qb, hb, sb) = (q32::quant_bytes(K), q32::high_bytes(K), q32::scale_bytes(K));
    let off = q32_offset(K);
    // SAFETY (whole fn): `dots` checked the group's length, which holds
    // `blocks` quant, high-bit and scale records at these offsets; half `h`
    // is bytes `32h..32h + 32` of each 64-byte register of a record.
    unsafe {
        let highs = base.add(blocks * qb);
        let scales = highs.add(blocks * hb);
        let ones = _mm256_set1_epi16(1);
        let q = base.add(b * qb + 32 * h);
        if fetch && h == 0 {
            let mut l = 0;
            while l < qb {
                // Past the group's end this reads the next group (or
                // nothing: a prefetch never faults).
                _mm_prefetch::<_MM_HINT_T0>(q.wrapping_add(AHEAD + l).cast());
                l += 64;
            }
        }
        let s = scales.add(b * sb);
        let (dw, mw) = if K == 1 {
            let head = _mm256_loadu_si256(s.add(32 * h).cast());
            let (d, m) = halves(head);
            (_mm256_cvtph_ps(d), _mm256_cvtph_ps(m))
        } else {
            let d = _mm_loadu_si128(s.add(16 * h).cast());
            (_mm256_cvtph_ps(d), _mm256_setzero_ps())
        };
        let w = weights::<K>(q, highs.add(b * hb + 32 * h));
        for (t, acc_t) in acc.iter_mut().enumerate() {
            let at = a.get_unchecked(t);
            let y = at.qs.as_ptr().add(b * 32).cast::<i32>();
            let dot = if K == 4 {
                q8_dot(&w, y)
            } else {
                nibble_dot::<K>(&w, y, ones, off * i32::from(*at.bs.get_unchecked(b)))
            };
            let sc = _mm256_mul_ps(dw, _mm256_set1_ps(*at.d.get_unchecked(b)));
            *acc_t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), sc, *acc_t);
            if K == 1 {
                *acc_t = _mm256_fmadd_ps(mw, _mm256_set1_ps(*at.s.get_unchecked(b)), *acc_t);
            }
        }
    }
}

/// Eight `d | m << 16` dwords as their eight `d` and eight `m` f16s.
#[inline(always)]
unsafe fn halves(v: __m256i) -> (__m128i, __m128i) {
    // SAFETY: register-only AVX2 arithmetic.
    unsafe {
        let lo = _mm256_and_si256(v, _mm256_set1_epi32(0xffff));
        let hi = _mm256_srli_epi32::<16>(v);
        // Per 128-bit lane: four d, then four m; then the lanes' quarters in order.
        let p = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi32(lo, hi));
        (_mm256_castsi256_si128(p), _mm256_extracti128_si256::<1>(p))
    }
}

/// The half record's eight registers: register `g` holds values `4g..4g + 4`
/// of each of the eight rows. The nibble types as unsigned bytes (Q5_0 with
/// its fifth bits from `qh`, the eight rows' dwords); Q8_0 as signed bytes.
#[inline(always)]
unsafe fn weights<const K: u8>(q: *const u8, qh: *const u8) -> [__m256i; 8] {
    // SAFETY: the caller's half record: 32 bytes at `q + 64 g` for each
    // register `g` it holds, and for Q5_0 32 bytes at `qh`.
    unsafe {
        let mut w = [_mm256_setzero_si256(); 8];
        if K == 4 {
            let sign = _mm256_set1_epi8(-128);
            for (g, wg) in w.iter_mut().enumerate() {
                *wg = _mm256_xor_si256(_mm256_loadu_si256(q.add(64 * g).cast()), sign);
            }
            return w;
        }
        let low = _mm256_set1_epi8(0x0f);
        for m in 0..4 {
            let v = _mm256_loadu_si256(q.add(64 * m).cast());
            *w.get_unchecked_mut(m) = _mm256_and_si256(v, low);
            *w.get_unchecked_mut(m + 4) = _mm256_and_si256(_mm256_srli_epi16::<4>(v), low);
        }
        if K == 2 {
            // Bits 4g..4g + 4 of a row's qh as 0x10 in the bytes of values
            // 4g..4g + 4: the nibble times 2^4 + 2^11 + 2^18 + 2^25 puts bit
            // j at 8j + 4 with no carries (the four copies' bits never meet).
            let qh = _mm256_loadu_si256(qh.cast());
            let spread = _mm256_set1_epi32(0x0204_0810);
            let (nib, bit) = (_mm256_set1_epi32(0x0f), _mm256_set1_epi32(0x1010_1010));
            for (g, wg) in w.iter_mut().enumerate() {
                let x =
                    _mm256_and_si256(_mm256_srl_epi32(qh, _mm_cvtsi32_si128(4 * g as i32)), nib);
                let hi = _mm256_and_si256(_mm256_mullo_epi32(x, spread), bit);
                *wg = _mm256_or_si256(*wg, hi);
            }
        }
        w
    }
}

/// Σ over the block of unsigned weight × activation per row, less the
/// offset's `corr = o · Σy`: four int16 sums at a time (the module's bound).
#[inline(always)]
unsafe fn nibble_dot<const K: u8>(
    w: &[__m256i; 8],
    y: *const i32,
    ones: __m256i,
    corr: i32,
) -> __m256i {
    // SAFETY: the caller's 32 activation bytes at `y`.
    unsafe {
        // Plain loops, no closure: one that failed to inline would run the
        // intrinsics without the caller's target features.
        let mut p = [_mm256_setzero_si256(); 8];
        for (g, pg) in p.iter_mut().enumerate() {
            let yg = _mm256_set1_epi32(y.add(g).read_unaligned());
            *pg = _mm256_maddubs_epi16(*w.get_unchecked(g), yg);
        }
        let lo = _mm256_add_epi16(_mm256_add_epi16(p[0], p[1]), _mm256_add_epi16(p[2], p[3]));
        let hi = _mm256_add_epi16(_mm256_add_epi16(p[4], p[5]), _mm256_add_epi16(p[6], p[7]));
        let dot = if K == 2 {
            _mm256_add_epi32(_mm256_madd_epi16(lo, ones), _mm256_madd_epi16(hi, ones))
        } else {
            _mm256_madd_epi16(_mm256_add_epi16(lo, hi), ones)
        };
        _mm256_sub_epi32(dot, _mm256_set1_epi32(corr))
    }
}

/// Σ over the block of signed weight × activation per row (Q8_0): `|q|`
/// against the activation with `q`'s sign, each pair sum widened on its own.
#[inline(always)]
unsafe fn q8_dot(w: &[__m256i; 8], y: *const i32) -> __m256i {
    // SAFETY: the caller's 32 activation bytes at `y`.
    unsafe {
        let ones = _mm256_set1_epi16(1);
        let mut dot = _mm256_setzero_si256();
        for (g, wg) in w.iter().enumerate() {
            let ys = _mm256_sign_epi8(_mm256_set1_epi32(y.add(g).read_unaligned()), *wg);
            let p = _mm256_maddubs_epi16(_mm256_abs_epi8(*wg), ys);
            dot = _mm256_add_epi32(dot, _mm256_madd_epi16(p, ones));
        }
        dot
    }
}
