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
//! Invariance: a row's keys are visited in tiles of a fixed grid (a key's
//! lane is its index, plus the block's anchor, modulo `KT`) gathered from
//! however many segments hold them; a score, its softmax lane sums and its
//! `P · V` FMA chain then follow from the row and its keys alone. Other
//! rows of the block only add keys the row does not see (probability 0,
//! an exact no-op on finite values), and the path a row takes depends on
//! the ISA and `head_dim`, not on the block's row count (see [`stored`]).
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
    /// `(nr - 1) * KT + nk` floats (a tile's lanes from a piece's first),
    /// `nk <= KT`, and the CPU supports the ISA.
    unsafe fn scores(qs: *const f32, nr: usize, k: *const f32, nk: usize, hd: usize, sc: *mut f32);

    /// `acc[r * hd + d] += Σ_j p[r * KT + j] · v[j * hd + d]` for `r < nr`.
    ///
    /// # Safety
    /// `p` holds `(nr - 1) * KT + nk` floats, `v` holds `nk * hd` floats,
    /// `acc` holds `nr * hd` floats, `nk <= KT`, and the CPU supports the ISA.
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

    /// Bytes of one query row in [`Isa::quantize_q`]'s layout (rows follow
    /// each other), so a group of rows starts `r * q8_row_bytes(hd)` in.
    #[inline(always)]
    fn q8_row_bytes(_hd: usize) -> usize {
        0
    }

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
/// Invariance: tiles are `KT` keys of a fixed grid (a key's lane is its
/// concatenated index plus the block's anchor, modulo `KT`), visited in
/// order; a tile gathers its keys from however many segments hold them.
/// So a row's scores, softmax steps and `P · V` chain see its keys in the
/// same tiles and lanes whatever other rows share the block (they only add
/// keys the row does not see, with probability 0) and however the keys'
/// cells are cut into segments.
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
    let mut cursor = Pieces::new(b.segs);
    // The previous tile's pieces; empty when no row saw it.
    let mut prev = TilePieces::default();
    let mut cur = 0usize;
    // q quantized once for the whole block, every row alike (its conv tiles
    // stay unused on the stored path).
    let q8 = if b.k.dtype == KvDtype::Q8_0 && stored::<I>(nr, hd) && conv.len() >= nr * hd {
        // SAFETY: qs holds nr*hd floats, conv 4*nr*hd bytes (checked).
        unsafe { I::quantize_q(b.qs.as_ptr(), nr, hd, conv.as_mut_ptr().cast()) }
    } else {
        std::ptr::null()
    };
    // The current tile is keys [end - KT, end) (its start may lie before
    // key 0); its part with keys is [a, e). Key x is lane x + KT - end.
    let mut end = lo_all + (KT - (lo_all + b.anchor) % KT);
    let mut a = lo_all;
    // One pass past the last tile: its P·V alone (one call site of the
    // step, which inlines the stored kernels' every variant).
    loop {
        let last = a >= hi_all;
        if last && prev.n == 0 {
            break;
        }
        let e = end.min(hi_all);
        let pieces = if last {
            TilePieces::default()
        } else {
            cursor.take(a, e, a + KT - end)
        };
        let [b0, b1] = &mut bufs;
        let (sc, p) = if cur == 0 { (b0, &*b1) } else { (b1, &*b0) };
        // SAFETY: the pieces lie inside the head's rows (validated runs) and
        // their lanes inside the tile; the buffers are sized per the contract.
        unsafe { step_pieces::<I>(b, &pieces, &prev, sc, p, acc, conv, q8) };
        if last {
            break;
        }
        let mut any = false;
        for r in 0..nr {
            let (lo, hi) = (b.lo[r], b.hi[r]);
            let Some(row) = sc[r * KT..(r + 1) * KT].first_chunk_mut::<KT>() else {
                continue;
            };
            if lo >= e || hi <= a || lo >= hi {
                row.fill(0.0);
                continue;
            }
            // Visible keys of this tile, as lanes [va, vb) of the row.
            let va = lo.max(a) + KT - end;
            let vb = hi.min(e) + KT - end;
            scores(row);
            let m_old = m[r];
            // SAFETY: lo < e and hi > a, so va < vb <= KT; CPU per our contract.
            let (mn, sum) = unsafe { I::softmax_row(row, va, vb, m_old) };
            fold_row(m, l, acc, r, mn, sum, hd);
            any = true;
        }
        prev = if any { pieces } else { TilePieces::default() };
        cur ^= 1;
        a = e;
        end += KT;
    }
}

/// One contiguous part of a tile: `(first pool row, keys, first lane)`.
type Piece = (usize, usize, usize);

/// A tile's keys as contiguous pieces, in lane order (at most `KT`).
#[derive(Clone, Copy)]
struct TilePieces {
    p: [Piece; KT],
    n: usize,
}

impl Default for TilePieces {
    fn default() -> Self {
        TilePieces {
            p: [(0, 0, 0); KT],
            n: 0,
        }
    }
}

/// Walks the segments in concatenated order, handing out each tile's pieces.
struct Pieces<'s> {
    segs: &'s [crate::runs::Run],
    /// Current segment and its first concatenated index.
    seg: usize,
    seg_lo: usize,
}

impl<'s> Pieces<'s> {
    fn new(segs: &'s [crate::runs::Run]) -> Self {
        Pieces {
            segs,
            seg: 0,
            seg_lo: 0,
        }
    }

    /// The pieces of keys `[a, e)`, key `a` in lane `lane_a`; tiles come in
    /// increasing order.
    fn take(&mut self, a: usize, e: usize, lane_a: usize) -> TilePieces {
        let mut out = TilePieces::default();
        let mut j = a;
        while j < e && self.seg < self.segs.len() {
            let s = self.segs[self.seg];
            let s_hi = self.seg_lo + s.len;
            if j >= s_hi {
                self.seg += 1;
                self.seg_lo = s_hi;
                continue;
            }
            let n = e.min(s_hi) - j;
            if out.n < KT {
                out.p[out.n] = (s.start + (j - self.seg_lo), n, lane_a + (j - a));
                out.n += 1;
            }
            j += n;
        }
        out
    }
}

/// Scores of the tile `kt`'s pieces into `sc` and `P · V` of the tile
/// `vt`'s pieces with `p` into `acc`: one pipelined [`step`] when each is a
/// single piece, else piece by piece (each piece's keys in lane order, so
/// every accumulator sees the same chain of keys either way).
///
/// # Safety
/// As [`step`], for every piece.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn step_pieces<I: Isa>(
    b: &Block<'_>,
    kt: &TilePieces,
    vt: &TilePieces,
    sc: &mut [f32],
    p: &[f32],
    acc: &mut [f32],
    conv: &mut [f32],
    q8: *const u8,
) {
    const NONE: Piece = (0, 0, 0);
    let single = kt.n <= 1 && vt.n <= 1;
    let calls = if single { 1 } else { kt.n + vt.n };
    // One call site of `step` (see `run_block_with`).
    for c in 0..calls {
        let (k, v) = if single {
            (
                if kt.n == 1 { kt.p[0] } else { NONE },
                if vt.n == 1 { vt.p[0] } else { NONE },
            )
        } else if c < kt.n {
            (kt.p[c], NONE)
        } else {
            (NONE, vt.p[c - kt.n])
        };
        // SAFETY: forwarded contract.
        unsafe { step::<I>(b, k, v, sc, p, acc, conv, q8) };
    }
}

/// Whether the block's rows go through [`Isa::scores_pv_stored`] (whole or
/// in groups of 4). Depends on the ISA and `hd` only where the ISA runs
/// groups, so a row takes the same path in any block.
#[inline(always)]
fn stored<I: Isa>(nr: usize, hd: usize) -> bool {
    I::stored_ok(nr, hd) || (I::STORED_GROUPS && I::stored_ok(4, hd))
}

/// One pipeline step: scores of the `kt = (first row, keys, first lane)`
/// piece of K into lanes of `sc`, `P · V` of the `vt` piece of V with the
/// same lanes of `p` into `acc`; as stored where the ISA widens in
/// registers, else through the `conv` scratch tiles.
///
/// # Safety
/// The pieces lie inside the head's rows, their lanes inside `KT`; `sc`,
/// `p` hold `nr * KT` floats, `acc` `nr * hd`, `conv` `2 * KT * hd`; `q8`
/// null or from `I::quantize_q` of this block's rows (and `conv` then
/// unused); the CPU supports `I`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn step<I: Isa>(
    b: &Block<'_>,
    kt: Piece,
    vt: Piece,
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
        let q8_row = I::q8_row_bytes(hd);
        let mut r = 0;
        while r < nr {
            let g = group.min(nr - r);
            let s = Step {
                qs: b.qs[r * hd..].as_ptr(),
                nr: g,
                k,
                kd: b.k.dtype,
                nk: kt.1,
                sc: sc[r * KT + kt.2..].as_mut_ptr(),
                p: p[r * KT + vt.2..].as_ptr(),
                v,
                vd: b.v.dtype,
                nkp: vt.1,
                hd,
                acc: acc[r * hd..].as_mut_ptr(),
                q8: if q8.is_null() {
                    q8
                } else {
                    q8.wrapping_add(r * q8_row)
                },
            };
            // SAFETY: stored_ok held for g rows (g <= 4 in groups); the
            // slices above hold the pieces' rows and rows r..r + g of the
            // block's buffers (lanes + keys <= KT); q8 covers rows r.. when
            // non-null.
            unsafe { I::scores_pv_stored(s) };
            r += g;
        }
        return;
    }
    let (kconv, vconv) = conv.split_at_mut(KT * hd);
    // SAFETY: each conversion buffer holds KT * hd >= keys * hd floats; qs has
    // nr*hd floats, sc / p nr*KT from lane 0, acc nr*hd (contract).
    unsafe {
        if kt.1 > 0 {
            let k = tile::<I>(b.k, kt.0, kt.1, hd, kconv);
            I::scores(
                b.qs.as_ptr(),
                nr,
                k.as_ptr(),
                kt.1,
                hd,
                sc[kt.2..].as_mut_ptr(),
            );
        }
        if vt.1 > 0 {
            let v = tile::<I>(b.v, vt.0, vt.1, hd, vconv);
            I::pv(
                p[vt.2..].as_ptr(),
                nr,
                v.as_ptr(),
                vt.1,
                hd,
                acc.as_mut_ptr(),
            );
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
