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
use portable::{softmax_row_portable, Portable};
pub(super) use select::{run_native, select_isa, IsaPath};
use widen::decode_portable;

#[cfg(target_arch = "x86_64")]
mod avx2;
/// Explicit AVX-512F micro-kernels (this machine's path).
#[cfg(target_arch = "x86_64")]
mod avx512;
mod portable;
mod select;
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
