//! Mask and online softmax down the columns of the XNNPACK backend's score
//! tile `Sᵀ` (`nc` keys × `nr` query rows, row-major: column `r` has stride
//! `nr`).
//!
//! A strided walk per column does not vectorise. Instead the tile is swept
//! flat, `nr · 16` values at a time, against accumulators (and a repeated
//! pattern of the row maxima) of the same width, so element `i` always meets
//! column `i % nr`; the 16 partial results per column are reduced at the end.
//! The sweep is compiled for AVX-512 and for AVX2+FMA and chosen at run time.
// Column indices are < nr <= RB and tile indices < nc * nr, bounded by the
// validated block geometry ("Arithmetic bounds" in validate.rs).
#![allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]

use super::softmax::{exp2, State};
use super::xnn::RB;

/// Partial results kept per column during the flat sweep.
const LANES: usize = 16;

/// Masks column `r` of `s` (keys `j..j + nc`) to the row's visible keys
/// `lo[r]..hi[r]`, replaces the scores by `2^(s - m_new)` and folds each
/// column that sees a key into `state`. Columns that see none become zeros.
/// Returns whether any column saw a key.
pub(super) fn mask_softmax(
    s: &mut [f32],
    nc: usize,
    j: usize,
    lo: &[usize],
    hi: &[usize],
    state: &mut State<'_>,
    hd: usize,
) -> bool {
    let nr = lo.len().min(hi.len()).min(RB);
    let s = &mut s[..nc * nr];
    let mut live = [false; RB];
    for r in 0..nr {
        let (a, e) = (lo[r].max(j), hi[r].min(j + nc));
        let (a, e) = if a < e { (a - j, e - j) } else { (0, 0) };
        live[r] = a < e;
        for jj in (0..a).chain(e.max(a)..nc) {
            s[jj * nr + r] = f32::NEG_INFINITY;
        }
    }
    if !live.iter().any(|&l| l) {
        return false;
    }
    let mut mn = [0.0f32; RB];
    let mut sum = [0.0f32; RB];
    sweep(s, nr, &state.m[..nr], &live, &mut mn, &mut sum);
    for r in (0..nr).filter(|&r| live[r]) {
        state.fold_row(r, mn[r], sum[r], hd);
    }
    true
}

/// Dispatches [`sweep_body`] to the widest instruction set available.
fn sweep(
    s: &mut [f32],
    nr: usize,
    m_old: &[f32],
    live: &[bool; RB],
    mn: &mut [f32; RB],
    sum: &mut [f32; RB],
) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: avx512f detected.
            return unsafe { sweep_avx512(s, nr, m_old, live, mn, sum) };
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: avx2 and fma detected.
            return unsafe { sweep_avx2(s, nr, m_old, live, mn, sum) };
        }
    }
    sweep_body(s, nr, m_old, live, mn, sum);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn sweep_avx512(
    s: &mut [f32],
    nr: usize,
    m_old: &[f32],
    live: &[bool; RB],
    mn: &mut [f32; RB],
    sum: &mut [f32; RB],
) {
    sweep_body(s, nr, m_old, live, mn, sum);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn sweep_avx2(
    s: &mut [f32],
    nr: usize,
    m_old: &[f32],
    live: &[bool; RB],
    mn: &mut [f32; RB],
    sum: &mut [f32; RB],
) {
    sweep_body(s, nr, m_old, live, mn, sum);
}

/// Column maxima (folded with the running maxima `m_old`) into `mn`, then
/// `s ← 2^(s - mn[col])` and the column sums into `sum`. Dead columns use
/// `mn = 0`: their masked `-inf` scores become exact zeros.
#[inline(always)]
fn sweep_body(
    s: &mut [f32],
    nr: usize,
    m_old: &[f32],
    live: &[bool; RB],
    mn: &mut [f32; RB],
    sum: &mut [f32; RB],
) {
    let w = nr * LANES;
    let mut acc = [f32::NEG_INFINITY; RB * LANES];
    let acc = &mut acc[..w];
    for c in s.chunks(w) {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a = if x > *a { x } else { *a };
        }
    }
    let mut pat = [0.0f32; RB * LANES];
    for r in 0..nr {
        let m = (0..LANES).fold(m_old[r], |m, k| m.max(acc[k * nr + r]));
        mn[r] = if live[r] { m } else { 0.0 };
        for k in 0..LANES {
            pat[k * nr + r] = mn[r];
        }
    }
    let mut sacc = [0.0f32; RB * LANES];
    for c in s.chunks_mut(w) {
        for ((x, &m), a) in c.iter_mut().zip(&pat[..w]).zip(&mut sacc[..w]) {
            let p = exp2(*x - m);
            *x = p;
            *a += p;
        }
    }
    for r in 0..nr {
        sum[r] = (0..LANES).map(|k| sacc[k * nr + r]).sum();
    }
}
