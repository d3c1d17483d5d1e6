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

use super::softmax::{exp2_in_range, State};

/// Query rows per block of the XNNPACK backend: the widest score tile.
pub(crate) const RB: usize = 32;

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
    let mut sw = Sweep {
        s,
        nr,
        m_old: &state.m[..nr],
        live,
        mn: [0.0; RB],
        sum: [0.0; RB],
    };
    sweep(&mut sw);
    let (mn, sum) = (sw.mn, sw.sum);
    for r in (0..nr).filter(|&r| live[r]) {
        state.fold_row(r, mn[r], sum[r], hd);
    }
    true
}

/// Dispatches [`sweep_body`] to the widest instruction set available.
fn sweep(sw: &mut Sweep<'_>) {
    #[cfg(target_arch = "x86_64")]
    {
        let cpu = crate::cpu::features();
        if cpu.avx512f {
            // SAFETY: avx512f detected.
            return unsafe { sweep_avx512(sw) };
        }
        if cpu.avx2_fma() {
            // SAFETY: avx2 and fma detected.
            return unsafe { sweep_avx2(sw) };
        }
    }
    sweep_body(sw);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn sweep_avx512(sw: &mut Sweep<'_>) {
    sweep_body(sw);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn sweep_avx2(sw: &mut Sweep<'_>) {
    sweep_body(sw);
}

/// One tile's sweep: the scores `s` of `nr` columns, the running maxima
/// `m_old`, which columns see a key; out: new maxima `mn` and sums `sum`.
struct Sweep<'a> {
    s: &'a mut [f32],
    nr: usize,
    m_old: &'a [f32],
    live: [bool; RB],
    mn: [f32; RB],
    sum: [f32; RB],
}

/// Column maxima (folded with the running maxima `m_old`) into `mn`, then
/// `s ← 2^(s - mn[col])` and the column sums into `sum`. Dead columns use
/// `mn = 0`: their masked `-inf` scores become exact zeros.
#[inline(always)]
fn sweep_body(sw: &mut Sweep<'_>) {
    let Sweep {
        s,
        nr,
        m_old,
        live,
        mn,
        sum,
    } = sw;
    let (nr, s) = (*nr, &mut **s);
    let w = nr * LANES;
    let mut acc = [f32::NEG_INFINITY; RB * LANES];
    let acc = &mut acc[..w];
    // Fixed 16-wide inner loops: one vector instruction each. A block's
    // tail shorter than 16 (nc * nr not a multiple of 16) takes the zip.
    for c in s.chunks(w) {
        let mut cx = c.chunks_exact(LANES);
        for (a, x) in acc.chunks_exact_mut(LANES).zip(&mut cx) {
            for i in 0..LANES {
                a[i] = if x[i] > a[i] { x[i] } else { a[i] };
            }
        }
        let tail = cx.remainder();
        for (a, &x) in acc[c.len() - tail.len()..].iter_mut().zip(tail) {
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
        let len = c.len();
        let mut cx = c.chunks_exact_mut(LANES);
        let lanes = pat[..w]
            .chunks_exact(LANES)
            .zip(sacc[..w].chunks_exact_mut(LANES));
        for (x, (m, a)) in (&mut cx).zip(lanes) {
            for i in 0..LANES {
                let p = exp2v(x[i] - m[i]);
                x[i] = p;
                a[i] += p;
            }
        }
        let tail = cx.into_remainder();
        let o = len - tail.len();
        for ((x, &m), a) in tail.iter_mut().zip(&pat[o..w]).zip(&mut sacc[o..w]) {
            let p = exp2v(*x - m);
            *x = p;
            *a += p;
        }
    }
    for r in 0..nr {
        sum[r] = (0..LANES).map(|k| sacc[k * nr + r]).sum();
    }
}

/// `softmax::exp2`, branch-free: NaN and `-inf` clamp to -127 and every
/// lane below -126 selects 0, the same results as `exp2`.
#[inline(always)]
fn exp2v(x: f32) -> f32 {
    let xc = x.max(-127.0);
    let v = exp2_in_range(xc);
    if xc < -126.0 {
        0.0
    } else {
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::softmax::exp2;

    /// Every compiled sweep against a per-column walk, on tiles whose length
    /// is not a multiple of the sweep width, with a dead column.
    #[test]
    fn sweeps_match_a_column_walk() {
        type Run = unsafe fn(&mut Sweep<'_>);
        let mut variants: Vec<(&str, Run)> = vec![("portable", |sw| sweep_body(sw))];
        #[cfg(target_arch = "x86_64")]
        {
            let cpu = crate::cpu::features();
            if cpu.avx512f {
                variants.push(("avx512", sweep_avx512));
            }
            if cpu.avx2_fma() {
                variants.push(("avx2", sweep_avx2));
            }
        }
        for (nr, nc) in [(4usize, 37usize), (1, 5), (32, 256), (3, 17)] {
            let mut want: Vec<f32> = (0..nc * nr)
                .map(|i| ((i * 7919 % 1000) as f32) * 0.013 - 6.0)
                .collect();
            let m_old: Vec<f32> = (0..nr)
                .map(|r| if r % 3 == 0 { f32::NEG_INFINITY } else { 2.0 })
                .collect();
            let mut live = [false; RB];
            for l in live.iter_mut().take(nr).skip(1) {
                *l = true;
            }
            // Column 0 is dead: masked to -inf as `mask_softmax` leaves it.
            for jj in 0..nc {
                want[jj * nr] = f32::NEG_INFINITY;
            }
            let masked = want.clone();
            let (mut want_mn, mut want_sum) = ([0.0f32; RB], [0.0f64; RB]);
            for r in 0..nr {
                let col = (0..nc).map(|jj| want[jj * nr + r]);
                let m = col.fold(m_old[r], f32::max);
                want_mn[r] = if live[r] { m } else { 0.0 };
                for jj in 0..nc {
                    let x = &mut want[jj * nr + r];
                    *x = exp2(*x - want_mn[r]);
                    want_sum[r] += f64::from(*x);
                }
            }
            for (name, run) in &variants {
                let mut s = masked.clone();
                let mut sw = Sweep {
                    s: &mut s,
                    nr,
                    m_old: &m_old,
                    live,
                    mn: [0.0; RB],
                    sum: [0.0; RB],
                };
                // SAFETY: each variant was pushed only when its features were detected.
                unsafe { run(&mut sw) };
                let (mn, sum) = (sw.mn, sw.sum);
                assert_eq!(s, want, "{name} nr={nr} nc={nc}: probabilities");
                assert_eq!(mn[..nr], want_mn[..nr], "{name}: maxima");
                for r in 0..nr {
                    let err = (f64::from(sum[r]) - want_sum[r]).abs();
                    assert!(err <= 1e-5 * want_sum[r].max(1.0), "{name} r={r}: sum");
                }
            }
        }
    }

    #[test]
    fn branch_free_exp2_equals_exp2() {
        let mut xs = vec![
            f32::NAN,
            f32::NEG_INFINITY,
            -1e30,
            -127.0,
            -126.5,
            -126.0,
            -0.0,
            0.0,
        ];
        xs.extend((0..20_000).map(|i| -(i as f32) * 0.0064));
        for x in xs {
            assert_eq!(exp2v(x).to_bits(), exp2(x).to_bits(), "x = {x}");
        }
    }
}
