//! The fused single-pass kernel shared by every ISA: blocked online softmax.
//!
//! One call handles one [`Block`]: up to `RB` query rows of one KV head (the
//! GQA query heads of one or more tokens) against a list of key segments. Keys
//! are visited in tiles of `KT` rows; for each tile the ISA computes the
//! `rows × KT` score block (each K row loaded once per block and reused by
//! every query row of it), the mask is applied in index space, the online
//! softmax state is updated, and the ISA accumulates `P · V` (each V row loaded
//! once per block). Only rows inside the segments are ever addressed.
//!
//! The tiles are software-pipelined: the scores of tile t+1 are computed in
//! the same step as `P · V` of tile t (`Isa::scores_pv`, two score buffers),
//! and the AVX-512 decode path (≤ 4 rows) interleaves the two in groups of 4
//! keys so the K and V streams are in flight together.
//!
//! Scores live in the log2 domain: `q` is pre-scaled by `scale · log2(e)` and
//! the kernel uses `exp2`.
// Indices and arithmetic are bounded by the validated block geometry
// ("Arithmetic bounds" in validate.rs).
#![allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]

use super::geometry::Block;
use super::softmax::{exp2, fold_row, State};
use crate::dtype::{KvDtype, KvRows};
use portable::softmax_row_portable;
pub(super) use portable::Portable;
use widen::decode_portable;

mod portable;
mod widen;

/// Query rows per block.
pub(crate) const RB: usize = 32;
/// Keys per tile. 64 vs 32: prefill 47 vs 48-49 ms, decode within noise.
pub(crate) const KT: usize = 64;

/// The ISA-specific micro-kernels.
pub(crate) trait Isa: Copy {
    /// `sc[r * KT + j] = dot(qs[r * hd ..], k[j * hd ..])` for `r < nr`, `j < nk`.
    ///
    /// # Safety
    /// `qs` holds `nr * hd` floats, `k` holds `nk * hd` floats, `sc` holds
    /// `nr * KT` floats, `nk <= KT`, and the CPU supports the ISA.
    unsafe fn scores(qs: *const f32, nr: usize, k: *const f32, nk: usize, hd: usize, sc: *mut f32);

    /// `acc[r * hd + d] += Σ_j p[r * KT + j] · v[j * hd + d]` for `r < nr`.
    ///
    /// # Safety
    /// `p` holds `nr * KT` floats, `v` holds `nk * hd` floats, `acc` holds
    /// `nr * hd` floats, `nk <= KT`, and the CPU supports the ISA.
    unsafe fn pv(p: *const f32, nr: usize, v: *const f32, nk: usize, hd: usize, acc: *mut f32);

    /// `scores` of the next tile (`k`, `nk` keys, into `sc`) and `pv` of the
    /// previous one (`p`, `v`, `nkp` keys, into `acc`); `nk == 0` or `nkp == 0`
    /// skips that half. ISAs may interleave the two so K and V loads are in
    /// flight together; the default runs them one after the other.
    ///
    /// # Safety
    /// The contracts of `scores` (for `nk > 0`) and `pv` (for `nkp > 0`), and
    /// `sc` does not overlap `p`.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn scores_pv(
        qs: *const f32,
        nr: usize,
        k: *const f32,
        nk: usize,
        sc: *mut f32,
        p: *const f32,
        v: *const f32,
        nkp: usize,
        hd: usize,
        acc: *mut f32,
    ) {
        // SAFETY: forwarded contracts.
        unsafe {
            if nk > 0 {
                Self::scores(qs, nr, k, nk, hd, sc);
            }
            if nkp > 0 {
                Self::pv(p, nr, v, nkp, hd, acc);
            }
        }
    }

    /// Whether [`Isa::scores_pv_stored`] serves `nr` rows of `hd` values.
    #[inline(always)]
    fn stored_ok(_nr: usize, _hd: usize) -> bool {
        false
    }

    /// [`Isa::scores_pv`] reading K and V tiles as stored (`k`: `nk` rows of
    /// `kd`, `v`: `nkp` rows of `vd`), widening 16 values at a time in
    /// registers instead of through a scratch tile.
    ///
    /// # Safety
    /// [`Isa::stored_ok`] returned true for `nr`, `hd`; the contracts of
    /// `scores_pv` with rows of the dtypes' sizes; the CPU supports the ISA.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn scores_pv_stored(
        _qs: *const f32,
        _nr: usize,
        _k: *const u8,
        _kd: KvDtype,
        _nk: usize,
        _sc: *mut f32,
        _p: *const f32,
        _v: *const u8,
        _vd: KvDtype,
        _nkp: usize,
        _hd: usize,
        _acc: *mut f32,
    ) {
    }

    /// Widens `n_rows` stored rows of `dtype` (`src`, `dtype.row_bytes(hd)`
    /// bytes each) into `dst` (`n_rows * hd` floats). Float32 rows are never
    /// passed here (the kernels read them in place).
    ///
    /// # Safety
    /// `src` holds `n_rows` whole rows, `dst` `n_rows * hd` floats; for q8_0
    /// `hd % 32 == 0`; the CPU supports the ISA.
    #[inline(always)]
    unsafe fn decode_rows(dtype: KvDtype, src: *const u8, n_rows: usize, hd: usize, dst: *mut f32) {
        let rb = dtype.row_bytes(hd);
        // SAFETY: sizes per the contract.
        let (src, dst) = unsafe {
            (
                std::slice::from_raw_parts(src, n_rows * rb),
                std::slice::from_raw_parts_mut(dst, n_rows * hd),
            )
        };
        decode_portable(dtype, src, dst);
    }

    /// One row's softmax step over a score tile: lanes outside `[va, vb)`
    /// become 0, the others `exp2(s - mn)` with `mn = max(m_old, max of the
    /// visible lanes)`; returns `(mn, Σ p)`.
    ///
    /// # Safety
    /// `va < vb <= KT`, and the CPU supports the ISA.
    #[inline(always)]
    unsafe fn softmax_row(row: &mut [f32; KT], va: usize, vb: usize, m_old: f32) -> (f32, f32) {
        softmax_row_portable(row, va, vb, m_old)
    }
}

/// Runs the block through all its keys, updating `st`.
///
/// # Safety
/// The CPU supports `I`; the block geometry is consistent (segments inside
/// `k`/`v`, `nr <= RB`, slices sized as documented on [`Block`] / [`State`]).
#[inline(always)]
pub(crate) unsafe fn run_block<I: Isa>(b: &Block<'_>, st: &mut State<'_>) {
    let hd = b.hd;
    let nr = b.nr;
    let (mut ulo, mut uhi) = (usize::MAX, 0usize);
    for r in 0..nr {
        if b.lo[r] < b.hi[r] {
            ulo = ulo.min(b.lo[r]);
            uhi = uhi.max(b.hi[r]);
        }
    }
    let lo_all = ulo.max(b.k0);
    let hi_all = uhi.min(b.k1);
    if lo_all >= hi_all {
        return;
    }
    // Tiles as (first pool row, keys, concatenated index of the first key).
    let tiles = b.segs.iter().scan(0usize, |base, seg| {
        let seg_lo = *base;
        *base += seg.len;
        Some((seg, seg_lo))
    });
    let tiles = tiles.flat_map(|(seg, seg_lo)| {
        let a = seg_lo.max(lo_all);
        let e = (seg_lo + seg.len).min(hi_all);
        (a..e)
            .step_by(KT)
            .map(move |j| (seg.start + (j - seg_lo), KT.min(e - j), j))
    });
    // Software pipeline: the scores of tile t+1 go with P·V of tile t (two
    // score buffers), so K and V loads of neighbouring tiles overlap.
    let State {
        m,
        l,
        acc,
        sc,
        conv,
    } = st;
    let (kconv, vconv) = conv.split_at_mut(KT * hd);
    let (sc0, sc1) = sc.split_at_mut(RB * KT);
    let mut bufs = [sc0, sc1];
    // Previous tile: (first pool row, keys to accumulate; 0 when no row saw it).
    let mut prev = (0usize, 0usize);
    let mut cur = 0usize;
    // Low-precision pools are read as stored where the ISA widens in registers.
    let stored =
        (b.k.dtype, b.v.dtype) != (KvDtype::Float32, KvDtype::Float32) && I::stored_ok(nr, hd);
    let (krb, vrb) = (b.k.dtype.row_bytes(hd), b.v.dtype.row_bytes(hd));
    for (row0, nk, j) in tiles {
        let [b0, b1] = &mut bufs;
        let (sc, p) = if cur == 0 { (b0, &*b1) } else { (b1, &*b0) };
        if stored {
            let kt = &b.k.bytes[row0 * krb..(row0 + nk) * krb];
            let vp = &b.v.bytes[prev.0 * vrb..(prev.0 + prev.1) * vrb];
            // SAFETY: kt holds nk rows of K, vp prev.1 rows of V, as stored;
            // buffers as below; stored_ok held.
            unsafe {
                I::scores_pv_stored(
                    b.qs.as_ptr(),
                    nr,
                    kt.as_ptr(),
                    b.k.dtype,
                    nk,
                    sc.as_mut_ptr(),
                    p.as_ptr(),
                    vp.as_ptr(),
                    b.v.dtype,
                    prev.1,
                    hd,
                    acc.as_mut_ptr(),
                )
            };
        } else {
            // SAFETY: the tile's rows lie inside the head's rows (validated runs),
            // each conversion buffer holds KT * hd >= nk * hd floats.
            let kt = unsafe { tile::<I>(b.k, row0, nk, hd, kconv) };
            let vp = unsafe { tile::<I>(b.v, prev.0, prev.1, hd, vconv) };
            // SAFETY: qs has nr*hd floats, kt nk*hd, each score buffer RB*KT >= nr*KT
            // (distinct buffers), vp prev.1*hd, acc nr*hd; nk, prev.1 <= KT.
            unsafe {
                I::scores_pv(
                    b.qs.as_ptr(),
                    nr,
                    kt.as_ptr(),
                    nk,
                    sc.as_mut_ptr(),
                    p.as_ptr(),
                    vp.as_ptr(),
                    prev.1,
                    hd,
                    acc.as_mut_ptr(),
                )
            };
        }
        let mut any = false;
        for r in 0..nr {
            let (lo, hi) = (b.lo[r], b.hi[r]);
            let Some(row) = sc[r * KT..(r + 1) * KT].first_chunk_mut::<KT>() else {
                continue;
            };
            if lo >= j + nk || hi <= j || lo >= hi {
                row.fill(0.0);
                continue;
            }
            // Visible keys of this tile, as lanes [va, vb) of the row.
            let va = lo.saturating_sub(j);
            let vb = (hi - j).min(nk);
            let m_old = m[r];
            // SAFETY: lo < j + nk and hi > j, so va < vb <= nk <= KT; CPU per our contract.
            let (mn, sum) = unsafe { I::softmax_row(row, va, vb, m_old) };
            fold_row(m, l, acc, r, mn, sum, hd);
            any = true;
        }
        prev = (row0, if any { nk } else { 0 });
        cur ^= 1;
    }
    if prev.1 > 0 && stored {
        let vp = &b.v.bytes[prev.0 * vrb..(prev.0 + prev.1) * vrb];
        let p = &bufs[cur ^ 1];
        let sc = std::ptr::null_mut();
        // SAFETY: nk = 0 skips the scores half; p, vp, acc as in the loop.
        unsafe {
            I::scores_pv_stored(
                b.qs.as_ptr(),
                nr,
                std::ptr::null(),
                b.k.dtype,
                0,
                sc,
                p.as_ptr(),
                vp.as_ptr(),
                b.v.dtype,
                prev.1,
                hd,
                acc.as_mut_ptr(),
            )
        };
    } else if prev.1 > 0 {
        // SAFETY: as in the loop.
        let vp = unsafe { tile::<I>(b.v, prev.0, prev.1, hd, vconv) };
        let p = &bufs[cur ^ 1];
        // SAFETY: p has nr*KT floats, vp prev.1*hd, acc nr*hd; prev.1 <= KT.
        unsafe { I::pv(p.as_ptr(), nr, vp.as_ptr(), prev.1, hd, acc.as_mut_ptr()) };
    }
}

/// Rows `[row0, row0 + n)` of a head as f32: in place for a float32 pool,
/// widened into `conv` otherwise.
///
/// # Safety
/// The rows lie inside `rows`; `conv` holds `n * hd` floats; the CPU supports `I`.
#[inline(always)]
unsafe fn tile<'c, 'r: 'c, I: Isa>(
    rows: KvRows<'r>,
    row0: usize,
    n: usize,
    hd: usize,
    conv: &'c mut [f32],
) -> &'c [f32] {
    if n == 0 {
        return &[];
    }
    if let Some(f) = rows.f32() {
        return &f[row0 * hd..(row0 + n) * hd];
    }
    let rb = rows.dtype.row_bytes(hd);
    let src = &rows.bytes[row0 * rb..(row0 + n) * rb];
    let dst = &mut conv[..n * hd];
    // SAFETY: src holds n whole rows, dst n * hd floats; ISA per the contract.
    unsafe { I::decode_rows(rows.dtype, src.as_ptr(), n, hd, dst.as_mut_ptr()) };
    dst
}

/// Explicit AVX-512F micro-kernels (this machine's path).
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512 {
    use super::{Isa, KT};
    use crate::dtype::KvDtype;
    use std::arch::x86_64::*;

    #[derive(Clone, Copy)]
    pub(crate) struct Avx512;

    /// Lane `i` of the result is the horizontal sum of `v[i]`: a transpose-add
    /// tree (30 shuffles, 30 adds for 16 vectors instead of 16 full reductions).
    #[inline(always)]
    unsafe fn hsum16(v: &[__m512; 16]) -> __m512 {
        // SAFETY (whole fn): register-only AVX-512F ops; the caller runs with AVX-512F.
        unsafe {
            let mut s = [_mm512_setzero_ps(); 8];
            for (i, si) in s.iter_mut().enumerate() {
                let (a, b) = (v[2 * i], v[2 * i + 1]);
                *si = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
            }
            let mut u = [_mm512_setzero_ps(); 4];
            for (i, ui) in u.iter_mut().enumerate() {
                let a = _mm512_castps_pd(s[2 * i]);
                let b = _mm512_castps_pd(s[2 * i + 1]);
                *ui = _mm512_add_ps(
                    _mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                    _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)),
                );
            }
            // 0b10_00_10_00 picks 128-bit blocks [0, 2 | 0, 2]; 0b11_01_11_01 picks [1, 3 | 1, 3].
            let w0 = _mm512_add_ps(
                _mm512_shuffle_f32x4::<0b1000_1000>(u[0], u[1]),
                _mm512_shuffle_f32x4::<0b1101_1101>(u[0], u[1]),
            );
            let w1 = _mm512_add_ps(
                _mm512_shuffle_f32x4::<0b1000_1000>(u[2], u[3]),
                _mm512_shuffle_f32x4::<0b1101_1101>(u[2], u[3]),
            );
            _mm512_add_ps(
                _mm512_shuffle_f32x4::<0b1000_1000>(w0, w1),
                _mm512_shuffle_f32x4::<0b1101_1101>(w0, w1),
            )
        }
    }

    #[inline(always)]
    fn tail_mask(n: usize) -> __mmask16 {
        if n >= 16 {
            0xFFFF
        } else {
            ((1u32 << n) - 1) as __mmask16
        }
    }

    /// Bytes ahead of the current K / V line that the kernels prefetch (one
    /// line per line consumed, issued inside the FMA loops), into L2 (T1).
    /// Measured with 32-key tiles (decode ctx 8192, 1 thread, cold): T0 at 16,
    /// 32 or 64 KiB ahead 6.8-7.0 ms, NTA 7.0 ms; T1 at 16-32 KiB 4.4-4.5 ms,
    /// 48 KiB 4.8 ms; T2 4.6 ms (read floor 3.0 ms). Prefetching into L1 fills
    /// its few miss buffers; adding a second, short-distance T0 prefetch (1 or
    /// 4 KiB) on top of T1 made no measurable difference. With 64-key tiles
    /// this is one tile (32 KiB) ahead; in the pipelined decode step
    /// (`scores_pv_rows`) K of tile t+1 and V of tile t are read together, so
    /// both streams prefetch one pipeline step ahead (a V distance of 2 tiles
    /// measured no better).
    const PF_BYTES: usize = 4 * KT * 128;

    #[inline(always)]
    unsafe fn prefetch(p: *const f32) {
        // SAFETY: a prefetch is a hint that never faults; the address is only computed.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(p.cast::<i8>().wrapping_add(PF_BYTES)) };
    }

    /// `2^x` lane-wise, like `super::exp2`: NaN and x below -150 give 0 (between
    /// -150 and -126 a denormal instead of 0).
    #[inline(always)]
    unsafe fn exp2_ps(x: __m512) -> __m512 {
        // SAFETY (whole fn): register-only AVX-512F ops; the caller runs with AVX-512F.
        unsafe {
            // max_ps returns the second operand when x is NaN.
            let x = _mm512_max_ps(x, _mm512_set1_ps(-160.0));
            let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x);
            let f = _mm512_mul_ps(_mm512_sub_ps(x, n), _mm512_set1_ps(std::f32::consts::LN_2));
            let mut p = _mm512_set1_ps(1.0 / 5040.0);
            for c in [
                1.0 / 720.0,
                1.0 / 120.0,
                1.0 / 24.0,
                1.0 / 6.0,
                0.5,
                1.0,
                1.0,
            ] {
                p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c));
            }
            _mm512_scalef_ps(p, n)
        }
    }

    /// Dot products of 4 query rows with 4 key rows (`out[i * 4 + jj]`), K
    /// prefetched ahead when `pf`.
    ///
    /// # Safety
    /// Every pointer addresses a whole row of `hd` floats; AVX-512F.
    #[inline(always)]
    unsafe fn block4x4(
        qp: &[*const f32; 4],
        kp: &[*const f32; 4],
        hd: usize,
        pf: bool,
    ) -> [f32; 16] {
        let full = hd / 16;
        let tm = tail_mask(hd % 16);
        // SAFETY (whole fn): offsets stay below hd; the tail uses masked loads
        // that touch only the row's own elements.
        unsafe {
            let mut acc = [_mm512_setzero_ps(); 16];
            for c in 0..full {
                let o = c * 16;
                let q = [
                    _mm512_loadu_ps(qp[0].add(o)),
                    _mm512_loadu_ps(qp[1].add(o)),
                    _mm512_loadu_ps(qp[2].add(o)),
                    _mm512_loadu_ps(qp[3].add(o)),
                ];
                for jj in 0..4 {
                    let kv = _mm512_loadu_ps(kp[jj].add(o));
                    if pf {
                        prefetch(kp[jj].add(o));
                    }
                    for i in 0..4 {
                        acc[i * 4 + jj] = _mm512_fmadd_ps(q[i], kv, acc[i * 4 + jj]);
                    }
                }
            }
            if tm != 0 {
                let o = full * 16;
                let q = [
                    _mm512_maskz_loadu_ps(tm, qp[0].add(o)),
                    _mm512_maskz_loadu_ps(tm, qp[1].add(o)),
                    _mm512_maskz_loadu_ps(tm, qp[2].add(o)),
                    _mm512_maskz_loadu_ps(tm, qp[3].add(o)),
                ];
                for jj in 0..4 {
                    let kv = _mm512_maskz_loadu_ps(tm, kp[jj].add(o));
                    for i in 0..4 {
                        acc[i * 4 + jj] = _mm512_fmadd_ps(q[i], kv, acc[i * 4 + jj]);
                    }
                }
            }
            let mut out = [0.0f32; 16];
            _mm512_storeu_ps(out.as_mut_ptr(), hsum16(&acc));
            out
        }
    }

    /// Keys per group of the pipelined decode step. Decode ctx 8192, 1 thread,
    /// cold (alternating runs, medians): 4 keys 3.2-3.5 ms, 8 keys 3.4-3.8 ms,
    /// 16 keys 3.2-3.9 ms, unpipelined 3.6-4.2 ms (read floor 2.5-3.0 ms).
    const PG: usize = 4;

    /// The pipelined decode step for `R <= 4` rows: groups of 8 keys, the
    /// scores of the next tile's group (two 4×4 blocks) then P·V of the
    /// previous tile's group with the accumulator rows in L1 (loaded and
    /// stored per 16-column chunk), so the K and V streams are read side by side.
    ///
    /// # Safety
    /// As [`Isa::scores_pv`] with `nr == R`, `hd % 16 == 0`; AVX-512F.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn scores_pv_rows<const R: usize>(
        qs: *const f32,
        k: *const f32,
        nk: usize,
        sc: *mut f32,
        p: *const f32,
        v: *const f32,
        nkp: usize,
        hd: usize,
        acc: *mut f32,
    ) {
        let qp: [*const f32; 4] = core::array::from_fn(|i| qs.wrapping_add(i.min(R - 1) * hd));
        let mut g = 0;
        while g < nk.max(nkp) {
            let mut j0 = g;
            while j0 < nk.min(g + PG) {
                let kp: [*const f32; 4] =
                    core::array::from_fn(|i| k.wrapping_add((j0 + i).min(nk - 1) * hd));
                // SAFETY: rows clamped into qs / k (contract of `scores`).
                let sums = unsafe { block4x4(&qp, &kp, hd, true) };
                for i in 0..R {
                    for jj in 0..4.min(nk - j0) {
                        // SAFETY: i < R = nr and j0+jj < nk <= KT: inside sc's nr*KT floats.
                        unsafe { *sc.add(i * KT + j0 + jj) = sums[i * 4 + jj] };
                    }
                }
                j0 += 4;
            }
            if g < nkp {
                let n = (nkp - g).min(PG);
                // SAFETY: rows g..g+n < nkp of v, R rows of p and acc, offsets < hd
                // (contract of `pv`).
                unsafe {
                    let mut d = 0;
                    while d < hd {
                        let mut a: [__m512; R] =
                            core::array::from_fn(|i| _mm512_loadu_ps(acc.add(i * hd + d)));
                        for j in g..g + n {
                            let vr = v.add(j * hd + d);
                            let x = _mm512_loadu_ps(vr);
                            prefetch(vr);
                            for (i, ai) in a.iter_mut().enumerate() {
                                *ai = _mm512_fmadd_ps(_mm512_set1_ps(*p.add(i * KT + j)), x, *ai);
                            }
                        }
                        for (i, ai) in a.iter().enumerate() {
                            _mm512_storeu_ps(acc.add(i * hd + d), *ai);
                        }
                        d += 16;
                    }
                }
            }
            g += PG;
        }
    }

    /// Widens 16 stored values of one row in registers.
    pub(crate) trait Load: Copy {
        /// Values `[d, d + 16)` of the row at `row`.
        ///
        /// # Safety
        /// `row` addresses a whole stored row; `d + 16 <= hd`, `d % 16 == 0`; AVX-512F.
        unsafe fn load16(row: *const u8, d: usize) -> __m512;
    }

    #[derive(Clone, Copy)]
    struct LF32;
    #[derive(Clone, Copy)]
    struct LF16;
    #[derive(Clone, Copy)]
    struct LBf16;
    #[derive(Clone, Copy)]
    struct LQ8;

    impl Load for LF32 {
        #[inline(always)]
        unsafe fn load16(row: *const u8, d: usize) -> __m512 {
            // SAFETY: contract of `load16`.
            unsafe { _mm512_loadu_ps(row.cast::<f32>().add(d)) }
        }
    }

    impl Load for LF16 {
        #[inline(always)]
        unsafe fn load16(row: *const u8, d: usize) -> __m512 {
            // SAFETY: contract of `load16` (32 bytes at 2d).
            unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(row.add(2 * d).cast())) }
        }
    }

    impl Load for LBf16 {
        #[inline(always)]
        unsafe fn load16(row: *const u8, d: usize) -> __m512 {
            // SAFETY: contract of `load16`; bfloat16 widens by a 16-bit shift.
            unsafe {
                let h = _mm512_cvtepu16_epi32(_mm256_loadu_si256(row.add(2 * d).cast()));
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(h))
            }
        }
    }

    impl Load for LQ8 {
        #[inline(always)]
        unsafe fn load16(row: *const u8, d: usize) -> __m512 {
            // SAFETY: contract of `load16`: block d / 32 (34 bytes) lies in the row,
            // and its 16 values at d % 32 follow the 2-byte scale.
            unsafe {
                let blk = row.add(d / 32 * 34);
                let bits = blk.cast::<u16>().read_unaligned();
                let scale = _mm512_cvtph_ps(_mm256_set1_epi16(bits as i16));
                let q = _mm_loadu_si128(blk.add(2 + d % 32).cast());
                _mm512_mul_ps(scale, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)))
            }
        }
    }

    /// Prefetches one stored row a tile (`KT` rows) ahead, into L2.
    #[inline(always)]
    unsafe fn prefetch_row(row: *const u8, rb: usize) {
        let ahead = row.wrapping_add(KT * rb);
        let mut o = 0;
        while o < rb {
            // SAFETY: a prefetch never faults; the address is only computed.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(o).cast::<i8>()) };
            o += 64;
        }
    }

    /// The pipelined decode step (as `scores_pv_rows`) over stored K/V rows:
    /// each 16-value chunk is widened in registers right where it is used.
    ///
    /// # Safety
    /// As [`Isa::scores_pv_stored`] with `nr == R <= 4`, `hd % 16 == 0`; AVX-512F.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn stored_rows<const R: usize, K: Load, V: Load>(
        qs: *const f32,
        k: *const u8,
        krb: usize,
        nk: usize,
        sc: *mut f32,
        p: *const f32,
        v: *const u8,
        vrb: usize,
        nkp: usize,
        hd: usize,
        acc: *mut f32,
    ) {
        let qp: [*const f32; 4] = core::array::from_fn(|i| qs.wrapping_add(i.min(R - 1) * hd));
        let mut g = 0;
        // SAFETY (whole loop): rows clamped into k / v, offsets < hd, R rows of
        // p / acc / sc (contract of `scores_pv_stored`).
        unsafe {
            while g < nk.max(nkp) {
                let mut j0 = g;
                while j0 < nk.min(g + PG) {
                    let kp: [*const u8; 4] =
                        core::array::from_fn(|i| k.wrapping_add((j0 + i).min(nk - 1) * krb));
                    let mut a = [_mm512_setzero_ps(); 16];
                    let mut d = 0;
                    while d < hd {
                        let q: [__m512; 4] =
                            core::array::from_fn(|i| _mm512_loadu_ps(qp[i].add(d)));
                        for jj in 0..4 {
                            let kv = K::load16(kp[jj], d);
                            for i in 0..4 {
                                a[i * 4 + jj] = _mm512_fmadd_ps(q[i], kv, a[i * 4 + jj]);
                            }
                        }
                        d += 16;
                    }
                    for r in kp {
                        prefetch_row(r, krb);
                    }
                    let mut sums = [0.0f32; 16];
                    _mm512_storeu_ps(sums.as_mut_ptr(), hsum16(&a));
                    for i in 0..R {
                        for jj in 0..4.min(nk - j0) {
                            *sc.add(i * KT + j0 + jj) = sums[i * 4 + jj];
                        }
                    }
                    j0 += 4;
                }
                if g < nkp {
                    let n = (nkp - g).min(PG);
                    for j in g..g + n {
                        prefetch_row(v.add(j * vrb), vrb);
                    }
                    let mut d = 0;
                    while d < hd {
                        let mut a: [__m512; R] =
                            core::array::from_fn(|i| _mm512_loadu_ps(acc.add(i * hd + d)));
                        for j in g..g + n {
                            let x = V::load16(v.add(j * vrb), d);
                            for (i, ai) in a.iter_mut().enumerate() {
                                *ai = _mm512_fmadd_ps(_mm512_set1_ps(*p.add(i * KT + j)), x, *ai);
                            }
                        }
                        for (i, ai) in a.iter().enumerate() {
                            _mm512_storeu_ps(acc.add(i * hd + d), *ai);
                        }
                        d += 16;
                    }
                }
                g += PG;
            }
        }
    }

    /// `stored_rows` for the runtime row count.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn stored_r<K: Load, V: Load>(
        qs: *const f32,
        nr: usize,
        k: *const u8,
        krb: usize,
        nk: usize,
        sc: *mut f32,
        p: *const f32,
        v: *const u8,
        vrb: usize,
        nkp: usize,
        hd: usize,
        acc: *mut f32,
    ) {
        // SAFETY: forwarded contract (nr <= 4).
        unsafe {
            match nr {
                1 => stored_rows::<1, K, V>(qs, k, krb, nk, sc, p, v, vrb, nkp, hd, acc),
                2 => stored_rows::<2, K, V>(qs, k, krb, nk, sc, p, v, vrb, nkp, hd, acc),
                3 => stored_rows::<3, K, V>(qs, k, krb, nk, sc, p, v, vrb, nkp, hd, acc),
                _ => stored_rows::<4, K, V>(qs, k, krb, nk, sc, p, v, vrb, nkp, hd, acc),
            }
        }
    }

    /// `stored_r` with V's loader chosen at run time.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn stored_v<K: Load>(
        qs: *const f32,
        nr: usize,
        k: *const u8,
        krb: usize,
        nk: usize,
        sc: *mut f32,
        p: *const f32,
        v: *const u8,
        vd: KvDtype,
        nkp: usize,
        hd: usize,
        acc: *mut f32,
    ) {
        let vrb = vd.row_bytes(hd);
        // SAFETY: forwarded contract.
        unsafe {
            match vd {
                KvDtype::Float32 => {
                    stored_r::<K, LF32>(qs, nr, k, krb, nk, sc, p, v, vrb, nkp, hd, acc)
                }
                KvDtype::Float16 => {
                    stored_r::<K, LF16>(qs, nr, k, krb, nk, sc, p, v, vrb, nkp, hd, acc)
                }
                KvDtype::Bfloat16 => {
                    stored_r::<K, LBf16>(qs, nr, k, krb, nk, sc, p, v, vrb, nkp, hd, acc)
                }
                KvDtype::Q8_0 => {
                    stored_r::<K, LQ8>(qs, nr, k, krb, nk, sc, p, v, vrb, nkp, hd, acc)
                }
            }
        }
    }

    /// Widens `n_rows` stored rows into `dst` with `L`'s register loads.
    ///
    /// # Safety
    /// `src` holds `n_rows` rows of `rb` bytes, `dst` `n_rows * hd` floats,
    /// `hd % 16 == 0`; AVX-512F.
    #[inline(always)]
    unsafe fn widen_rows<L: Load>(
        src: *const u8,
        rb: usize,
        n_rows: usize,
        hd: usize,
        dst: *mut f32,
    ) {
        for r in 0..n_rows {
            let mut d = 0;
            while d < hd {
                // SAFETY: row r of src and of dst, 16 values at d < hd.
                unsafe { _mm512_storeu_ps(dst.add(r * hd + d), L::load16(src.add(r * rb), d)) };
                d += 16;
            }
        }
    }

    impl Isa for Avx512 {
        #[inline(always)]
        unsafe fn decode_rows(
            dtype: KvDtype,
            src: *const u8,
            n_rows: usize,
            hd: usize,
            dst: *mut f32,
        ) {
            let rb = dtype.row_bytes(hd);
            if !hd.is_multiple_of(16) {
                // SAFETY: sizes per the trait contract.
                let (src, dst) = unsafe {
                    (
                        std::slice::from_raw_parts(src, n_rows * rb),
                        std::slice::from_raw_parts_mut(dst, n_rows * hd),
                    )
                };
                super::widen::decode_portable(dtype, src, dst);
                return;
            }
            // SAFETY: sizes per the trait contract; hd % 16 == 0.
            unsafe {
                match dtype {
                    KvDtype::Float32 => widen_rows::<LF32>(src, rb, n_rows, hd, dst),
                    KvDtype::Float16 => widen_rows::<LF16>(src, rb, n_rows, hd, dst),
                    KvDtype::Bfloat16 => widen_rows::<LBf16>(src, rb, n_rows, hd, dst),
                    KvDtype::Q8_0 => widen_rows::<LQ8>(src, rb, n_rows, hd, dst),
                }
            }
        }

        #[inline(always)]
        fn stored_ok(nr: usize, hd: usize) -> bool {
            nr <= 4 && hd.is_multiple_of(16)
        }

        #[inline(always)]
        #[allow(clippy::too_many_arguments)]
        unsafe fn scores_pv_stored(
            qs: *const f32,
            nr: usize,
            k: *const u8,
            kd: KvDtype,
            nk: usize,
            sc: *mut f32,
            p: *const f32,
            v: *const u8,
            vd: KvDtype,
            nkp: usize,
            hd: usize,
            acc: *mut f32,
        ) {
            let krb = kd.row_bytes(hd);
            // SAFETY: forwarded contract (stored_ok held: nr <= 4, hd % 16 == 0).
            unsafe {
                match kd {
                    KvDtype::Float32 => {
                        stored_v::<LF32>(qs, nr, k, krb, nk, sc, p, v, vd, nkp, hd, acc)
                    }
                    KvDtype::Float16 => {
                        stored_v::<LF16>(qs, nr, k, krb, nk, sc, p, v, vd, nkp, hd, acc)
                    }
                    KvDtype::Bfloat16 => {
                        stored_v::<LBf16>(qs, nr, k, krb, nk, sc, p, v, vd, nkp, hd, acc)
                    }
                    KvDtype::Q8_0 => {
                        stored_v::<LQ8>(qs, nr, k, krb, nk, sc, p, v, vd, nkp, hd, acc)
                    }
                }
            }
        }
        #[inline(always)]
        #[allow(clippy::too_many_arguments)]
        unsafe fn scores_pv(
            qs: *const f32,
            nr: usize,
            k: *const f32,
            nk: usize,
            sc: *mut f32,
            p: *const f32,
            v: *const f32,
            nkp: usize,
            hd: usize,
            acc: *mut f32,
        ) {
            // SAFETY: forwarded contract; the fused path only for nr <= 4 and
            // whole 16-float chunks.
            unsafe {
                if !hd.is_multiple_of(16) || nr > 4 {
                    if nk > 0 {
                        Self::scores(qs, nr, k, nk, hd, sc);
                    }
                    if nkp > 0 {
                        Self::pv(p, nr, v, nkp, hd, acc);
                    }
                    return;
                }
                match nr {
                    1 => scores_pv_rows::<1>(qs, k, nk, sc, p, v, nkp, hd, acc),
                    2 => scores_pv_rows::<2>(qs, k, nk, sc, p, v, nkp, hd, acc),
                    3 => scores_pv_rows::<3>(qs, k, nk, sc, p, v, nkp, hd, acc),
                    _ => scores_pv_rows::<4>(qs, k, nk, sc, p, v, nkp, hd, acc),
                }
            }
        }

        #[inline(always)]
        unsafe fn scores(
            qs: *const f32,
            nr: usize,
            k: *const f32,
            nk: usize,
            hd: usize,
            sc: *mut f32,
        ) {
            let mut r0 = 0;
            while r0 < nr {
                // The first row block streams the tile: it prefetches ahead.
                let pf = r0 == 0;
                // Rows/keys past the edge repeat the last valid one (valid memory,
                // results dropped), so the 4×4 block shape is fixed.
                let qp: [*const f32; 4] =
                    core::array::from_fn(|i| qs.wrapping_add((r0 + i).min(nr - 1) * hd));
                let mut j0 = 0;
                while j0 < nk {
                    let kp: [*const f32; 4] =
                        core::array::from_fn(|i| k.wrapping_add((j0 + i).min(nk - 1) * hd));
                    // SAFETY: every pointer addresses a whole row of hd floats inside
                    // qs / k (contract of `scores`).
                    let sums = unsafe { block4x4(&qp, &kp, hd, pf) };
                    for i in 0..4.min(nr - r0) {
                        for jj in 0..4.min(nk - j0) {
                            // SAFETY: r0+i < nr and j0+jj < nk <= KT: inside sc's nr*KT floats.
                            unsafe { *sc.add((r0 + i) * KT + j0 + jj) = sums[i * 4 + jj] };
                        }
                    }
                    j0 += 4;
                }
                r0 += 4;
            }
        }

        #[inline(always)]
        unsafe fn pv(p: *const f32, nr: usize, v: *const f32, nk: usize, hd: usize, acc: *mut f32) {
            let mut r0 = 0;
            while r0 < nr {
                let pr = p.wrapping_add(r0 * KT);
                let ar = acc.wrapping_add(r0 * hd);
                // SAFETY: rows r0..r0+R (R <= nr - r0) of p and acc, all nk rows of v,
                // per the contract of `pv`.
                unsafe {
                    match nr - r0 {
                        1 => pv_rows::<1>(pr, v, nk, hd, ar, r0 == 0),
                        2 => pv_rows::<2>(pr, v, nk, hd, ar, r0 == 0),
                        3 => pv_rows::<3>(pr, v, nk, hd, ar, r0 == 0),
                        _ => pv_rows::<4>(pr, v, nk, hd, ar, r0 == 0),
                    }
                }
                r0 += 4;
            }
        }

        #[inline(always)]
        unsafe fn softmax_row(row: &mut [f32; KT], va: usize, vb: usize, m_old: f32) -> (f32, f32) {
            const NV: usize = KT / 16;
            // Lanes [va, vb) of the KT-lane row (KT <= 64).
            let bits: u64 = (u64::MAX >> (64 - vb)) & !((1u64 << va) - 1);
            let rp = row.as_mut_ptr();
            // SAFETY: row holds KT = 16·NV floats; register ops otherwise; the
            // caller runs with AVX-512F (trait contract).
            unsafe {
                let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
                let mut s = [ninf; NV];
                let mut mx = ninf;
                for (v, sv) in s.iter_mut().enumerate() {
                    let k = (bits >> (16 * v)) as __mmask16;
                    *sv = _mm512_mask_loadu_ps(ninf, k, rp.add(16 * v));
                    mx = _mm512_max_ps(mx, *sv);
                }
                let mn = m_old.max(_mm512_reduce_max_ps(mx));
                let mb = _mm512_set1_ps(mn);
                let mut sum = _mm512_setzero_ps();
                for (v, sv) in s.iter().enumerate() {
                    let p = exp2_ps(_mm512_sub_ps(*sv, mb));
                    sum = _mm512_add_ps(sum, p);
                    _mm512_storeu_ps(rp.add(16 * v), p);
                }
                (mn, _mm512_reduce_add_ps(sum))
            }
        }
    }

    /// `acc[i] += Σ_j p[i*KT + j] · v[j]` for `R <= 4` rows, 64 columns per
    /// pass held in 4·R registers, so each V line is loaded once for all R rows
    /// (and, for R = 4, a decode GQA group of 4 reads V from L2 exactly once);
    /// masked 16-column tail. `pf`: prefetch ahead of V.
    #[inline(always)]
    unsafe fn pv_rows<const R: usize>(
        p: *const f32,
        v: *const f32,
        nk: usize,
        hd: usize,
        acc: *mut f32,
        pf: bool,
    ) {
        // SAFETY (whole fn): p has R rows of KT floats, v has nk rows of hd floats,
        // acc has R rows of hd floats; every offset below is < those bounds, the
        // tail uses masked loads/stores.
        unsafe {
            let mut d = 0;
            while d + 64 <= hd {
                let mut a = [[_mm512_setzero_ps(); 4]; R];
                for (i, ai) in a.iter_mut().enumerate() {
                    for (c, x) in ai.iter_mut().enumerate() {
                        *x = _mm512_loadu_ps(acc.add(i * hd + d + 16 * c));
                    }
                }
                for j in 0..nk {
                    let vr = v.add(j * hd + d);
                    let x: [__m512; 4] = core::array::from_fn(|c| _mm512_loadu_ps(vr.add(16 * c)));
                    if pf {
                        for c in 0..4 {
                            prefetch(vr.add(16 * c));
                        }
                    }
                    for (i, ai) in a.iter_mut().enumerate() {
                        let pb = _mm512_set1_ps(*p.add(i * KT + j));
                        for c in 0..4 {
                            ai[c] = _mm512_fmadd_ps(pb, x[c], ai[c]);
                        }
                    }
                }
                for (i, ai) in a.iter().enumerate() {
                    for (c, x) in ai.iter().enumerate() {
                        _mm512_storeu_ps(acc.add(i * hd + d + 16 * c), *x);
                    }
                }
                d += 64;
            }
            while d < hd {
                let m = tail_mask(hd - d);
                let mut a = [_mm512_setzero_ps(); R];
                for (i, x) in a.iter_mut().enumerate() {
                    *x = _mm512_maskz_loadu_ps(m, acc.add(i * hd + d));
                }
                for j in 0..nk {
                    let x = _mm512_maskz_loadu_ps(m, v.add(j * hd + d));
                    for (i, ai) in a.iter_mut().enumerate() {
                        *ai = _mm512_fmadd_ps(_mm512_set1_ps(*p.add(i * KT + j)), x, *ai);
                    }
                }
                for (i, x) in a.iter().enumerate() {
                    _mm512_mask_storeu_ps(acc.add(i * hd + d), m, *x);
                }
                d += 16;
            }
        }
    }
}
