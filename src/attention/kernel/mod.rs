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
//! the same step as `P · V` of tile t (two score buffers), and the x86 decode
//! path (≤ 4 rows, `stored`) interleaves the two in groups of 4 keys so the
//! K and V streams are in flight together, reading rows as stored.
//!
//! Scores live in the log2 domain: `q` is pre-scaled by `scale · log2(e)` and
//! the kernel uses `exp2`.
//!
//! Soft-capping: every ISA path leaves a tile's raw scores in the score
//! buffer before its softmax step (the register-widening decode step too), so
//! the cap is applied there, to whole rows of the tile, by one loop shared
//! by all ISAs (compiled under each one's target features). The driver is
//! monomorphised over that row transform: without a cap it is a no-op and
//! the uncapped kernel is the same code as before, with no per-tile test.
// Indices and arithmetic are bounded by the validated block geometry
// ("Arithmetic bounds" in validate.rs).
#![allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]

use super::geometry::Block;
use super::softmax::{exp2, fold_row, State};
use crate::dtype::{KvDtype, KvRows};
use portable::{softmax_row_portable, Portable};
pub(super) use select::{run_native, select_isa, IsaPath};
use widen::decode_rows_portable;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_int8;
/// Explicit AVX-512F micro-kernels (this machine's path).
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod hsum;
mod portable;
#[cfg(target_arch = "x86_64")]
mod q8_query;
mod select;
#[cfg(target_arch = "x86_64")]
mod simd;
#[cfg(target_arch = "x86_64")]
mod stored;
mod widen;

/// Query rows per block.
pub(crate) const RB: usize = 32;
/// Keys per tile. 64 vs 32: prefill 47 vs 48-49 ms, decode within noise.
pub(crate) const KT: usize = 64;

/// One pipelined step over rows as stored: scores of `nk` keys at `k` (rows
/// of `kd`) into `sc`, and `P · V` of `nkp` keys at `v` (rows of `vd`) with
/// the probabilities `p` into `acc`; `nk == 0` or `nkp == 0` skips that half.
#[derive(Clone, Copy)]
pub(crate) struct Step {
    /// Scaled query rows, `nr * hd` floats.
    pub qs: *const f32,
    pub nr: usize,
    pub k: *const u8,
    pub kd: KvDtype,
    pub nk: usize,
    /// `nr * KT` floats.
    pub sc: *mut f32,
    /// `nr * KT` floats, not overlapping `sc`.
    pub p: *const f32,
    pub v: *const u8,
    pub vd: KvDtype,
    pub nkp: usize,
    pub hd: usize,
    /// `nr * hd` floats.
    pub acc: *mut f32,
    /// The query rows quantized by [`Isa::quantize_q`] for integer dot
    /// products with q8_0 keys; null when the step widens K instead.
    pub q8: *const u8,
}

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

    /// Whether [`Isa::scores_pv_stored`] serves `nr` rows of `hd` values.
    #[inline(always)]
    fn stored_ok(_nr: usize, _hd: usize) -> bool {
        false
    }

    /// Whether blocks of more rows than [`Isa::stored_ok`] serves run the
    /// stored step 4 rows at a time (each group re-reading the tile from
    /// cache) instead of the scratch-tile micro-kernels.
    const STORED_GROUPS: bool = false;

    /// The pipelined step over K and V rows as stored, widened in registers
    /// instead of through a scratch tile.
    ///
    /// # Safety
    /// [`Isa::stored_ok`] returned true for `s.nr`, `s.hd`; the pointers of
    /// `s` hold what [`Step`] documents, `nk, nkp <= KT`; the CPU supports the ISA.
    #[inline(always)]
    unsafe fn scores_pv_stored(_s: Step) {}

    /// Quantizes the `nr` query rows for integer dot products with q8_0 keys
    /// into `out` (the ISA's layout) and returns it, or null where the ISA
    /// widens q8_0 keys to f32 instead.
    ///
    /// # Safety
    /// `qs` holds `nr * hd` floats, `out` `4 * nr * hd` bytes; the CPU supports the ISA.
    #[inline(always)]
    unsafe fn quantize_q(_qs: *const f32, _nr: usize, _hd: usize, _out: *mut u8) -> *const u8 {
        std::ptr::null()
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
        // SAFETY: the same contract.
        unsafe { decode_rows_portable(dtype, src, n_rows, hd, dst) }
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
    // The cap is chosen once per block; each arm is its own instance of the driver.
    match b.softcap {
        // SAFETY: forwarded contract.
        None => unsafe { run_block_with::<I>(b, st, |_| {}) },
        // SAFETY: forwarded contract.
        Some(cap) => unsafe { run_block_with::<I>(b, st, |row| cap.apply_row(row)) },
    }
}

/// [`run_block`] with `scores` applied to each visible row of a tile's raw
/// scores before its softmax step.
///
/// # Safety
/// As [`run_block`].
#[inline(always)]
unsafe fn run_block_with<I: Isa>(
    b: &Block<'_>,
    st: &mut State<'_>,
    scores: impl Fn(&mut [f32; KT]),
) {
    let (hd, nr) = (b.hd, b.nr);
    let Some((lo_all, hi_all)) = b.key_span() else {
        return;
    };
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
    let (sc0, sc1) = sc.split_at_mut(RB * KT);
    let mut bufs = [sc0, sc1];
    // Previous tile: (first pool row, keys to accumulate; 0 when no row saw it).
    let mut prev = (0usize, 0usize);
    let mut cur = 0usize;
    // q quantized once for the whole block (its conv tiles stay unused on the stored path).
    // Decode blocks only (rows in one stored group): a prefill's q8_0 keys
    // are widened, so its scores keep f32 queries.
    let q8 = if b.k.dtype == KvDtype::Q8_0 && I::stored_ok(nr, hd) && conv.len() >= nr * hd {
        // SAFETY: qs holds nr*hd floats, conv 4*nr*hd bytes (checked).
        unsafe { I::quantize_q(b.qs.as_ptr(), nr, hd, conv.as_mut_ptr().cast()) }
    } else {
        std::ptr::null()
    };
    for (row0, nk, j) in tiles {
        let [b0, b1] = &mut bufs;
        let (sc, p) = if cur == 0 { (b0, &*b1) } else { (b1, &*b0) };
        // SAFETY: the tiles lie inside the head's rows (validated runs); the
        // buffers are sized per the contract; nk, prev.1 <= KT.
        unsafe { step::<I>(b, (row0, nk), prev, sc, p, acc, conv, q8) };
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
            scores(row);
            let m_old = m[r];
            // SAFETY: lo < j + nk and hi > j, so va < vb <= nk <= KT; CPU per our contract.
            let (mn, sum) = unsafe { I::softmax_row(row, va, vb, m_old) };
            fold_row(m, l, acc, r, mn, sum, hd);
            any = true;
        }
        prev = (row0, if any { nk } else { 0 });
        cur ^= 1;
    }
    if prev.1 > 0 {
        let [b0, b1] = &mut bufs;
        let (sc, p) = if cur == 0 { (b0, &*b1) } else { (b1, &*b0) };
        // SAFETY: as in the loop; no keys for the scores half.
        unsafe { step::<I>(b, (0, 0), prev, sc, p, acc, conv, q8) };
    }
}

/// Whether the block's rows go through [`Isa::scores_pv_stored`] (whole or
/// in groups of 4).
#[inline(always)]
fn stored<I: Isa>(nr: usize, hd: usize) -> bool {
    I::stored_ok(nr, hd) || (I::STORED_GROUPS && I::stored_ok(4, hd))
}

/// One pipeline step: scores of the `kt = (first row, keys)` tile of K into
/// `sc`, `P · V` of the `vt` tile of V with `p` into `acc`; as stored where
/// the ISA widens in registers, else through the `conv` scratch tiles.
///
/// # Safety
/// The tiles lie inside the head's rows; `sc`, `p` hold `nr * KT` floats,
/// `acc` `nr * hd`, `conv` `2 * KT * hd`; keys <= KT; `q8` null or from
/// `I::quantize_q` of this block (and `conv` then unused); the CPU supports `I`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn step<I: Isa>(
    b: &Block<'_>,
    kt: (usize, usize),
    vt: (usize, usize),
    sc: &mut [f32],
    p: &[f32],
    acc: &mut [f32],
    conv: &mut [f32],
    q8: *const u8,
) {
    let (hd, nr) = (b.hd, b.nr);
    if stored::<I>(nr, hd) {
        let (krb, vrb) = (b.k.dtype.row_bytes(hd), b.v.dtype.row_bytes(hd));
        let (k, v) = (
            b.k.bytes[kt.0 * krb..(kt.0 + kt.1) * krb].as_ptr(),
            b.v.bytes[vt.0 * vrb..(vt.0 + vt.1) * vrb].as_ptr(),
        );
        let group = if I::stored_ok(nr, hd) { nr } else { 4 };
        let mut r = 0;
        while r < nr {
            let g = group.min(nr - r);
            let s = Step {
                qs: b.qs[r * hd..].as_ptr(),
                nr: g,
                k,
                kd: b.k.dtype,
                nk: kt.1,
                sc: sc[r * KT..].as_mut_ptr(),
                p: p[r * KT..].as_ptr(),
                v,
                vd: b.v.dtype,
                nkp: vt.1,
                hd,
                acc: acc[r * hd..].as_mut_ptr(),
                // Null unless the block is one group (run_block quantizes decode blocks only).
                q8,
            };
            // SAFETY: stored_ok held for g rows (g <= 4 in groups); the
            // slices above hold the tiles' rows and rows r..r + g of the
            // block's buffers; q8 covers the block when non-null.
            unsafe { I::scores_pv_stored(s) };
            r += g;
        }
        return;
    }
    let (kconv, vconv) = conv.split_at_mut(KT * hd);
    // SAFETY: each conversion buffer holds KT * hd >= keys * hd floats; qs has
    // nr*hd floats, sc / p nr*KT, acc nr*hd (contract).
    unsafe {
        if kt.1 > 0 {
            let k = tile::<I>(b.k, kt.0, kt.1, hd, kconv);
            I::scores(b.qs.as_ptr(), nr, k.as_ptr(), kt.1, hd, sc.as_mut_ptr());
        }
        if vt.1 > 0 {
            let v = tile::<I>(b.v, vt.0, vt.1, hd, vconv);
            I::pv(p.as_ptr(), nr, v.as_ptr(), vt.1, hd, acc.as_mut_ptr());
        }
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
