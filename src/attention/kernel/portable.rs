//! The portable kernel: plain Rust micro-kernels, the scalar fallback and,
//! compiled under AVX2+FMA, the AVX2 path.

use super::{exp2, Isa, KT};

/// Portable tile softmax step: lanes outside `[va, vb)` become 0, the others
/// `exp2(s - mn)` with `mn = max(m_old, max of the visible lanes)`; returns
/// `(mn, Σ p)`. `va < vb <= KT`.
#[inline(always)]
pub(super) fn softmax_row_portable(
    row: &mut [f32; KT],
    va: usize,
    vb: usize,
    m_old: f32,
) -> (f32, f32) {
    // Fixed-width (KT) lane-wise passes so each can vectorise.
    let mut mx = [f32::NEG_INFINITY; 16];
    for (jj, s) in row.iter_mut().enumerate() {
        if jj < va || jj >= vb {
            *s = f32::NEG_INFINITY;
        }
        mx[jj % 16] = mx[jj % 16].max(*s);
    }
    let mt = mx.iter().fold(f32::NEG_INFINITY, |a, &x| a.max(x));
    let mn = m_old.max(mt);
    let mut sums = [0.0f32; 16];
    for (jj, s) in row.iter_mut().enumerate() {
        let p = exp2(*s - mn);
        *s = p;
        sums[jj % 16] += p;
    }
    (mn, sums.iter().sum())
}

/// Portable micro-kernels; they autovectorise when compiled inside a
/// `#[target_feature]` function (the AVX2+FMA path) and run as plain SSE2 code
/// otherwise (the scalar fallback).
/// `FMA` selects fused multiply-add (the AVX2+FMA path); without it `mul_add`
/// would become a libm call, so the scalar path multiplies and adds.
#[derive(Clone, Copy)]
pub(crate) struct Portable<const FMA: bool>;

#[inline(always)]
fn fmadd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

#[inline(always)]
fn dot<const FMA: bool>(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 16];
    let mut ca = a.chunks_exact(16);
    let mut cb = b.chunks_exact(16);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for i in 0..16 {
            acc[i] = fmadd::<FMA>(x[i], y[i], acc[i]);
        }
    }
    let mut tail = 0.0f32;
    for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
        tail = fmadd::<FMA>(*x, *y, tail);
    }
    acc.iter().sum::<f32>() + tail
}

/// Two read-only operands and the output of a micro-kernel as slices.
///
/// # Safety
/// Each pointer addresses its count of floats for `'a`; the output overlaps neither input.
#[inline(always)]
unsafe fn slices<'a>(
    a: (*const f32, usize),
    b: (*const f32, usize),
    out: (*mut f32, usize),
) -> (&'a [f32], &'a [f32], &'a mut [f32]) {
    // SAFETY: the contract above.
    unsafe {
        (
            std::slice::from_raw_parts(a.0, a.1),
            std::slice::from_raw_parts(b.0, b.1),
            std::slice::from_raw_parts_mut(out.0, out.1),
        )
    }
}

impl<const FMA: bool> Isa for Portable<FMA> {
    #[inline(always)]
    unsafe fn scores(qs: *const f32, nr: usize, k: *const f32, nk: usize, hd: usize, sc: *mut f32) {
        // SAFETY: sizes per the trait contract.
        let n_sc = (nr - 1) * KT + nk;
        let (qs, k, sc) = unsafe { slices((qs, nr * hd), (k, nk * hd), (sc, n_sc)) };
        for (j, kr) in k.chunks_exact(hd).enumerate() {
            for (r, qr) in qs.chunks_exact(hd).enumerate() {
                sc[r * KT + j] = dot::<FMA>(qr, kr);
            }
        }
    }

    #[inline(always)]
    unsafe fn pv(p: *const f32, nr: usize, v: *const f32, nk: usize, hd: usize, acc: *mut f32) {
        // SAFETY: sizes per the trait contract.
        let n_p = (nr - 1) * KT + nk;
        let (p, v, acc) = unsafe { slices((p, n_p), (v, nk * hd), (acc, nr * hd)) };
        for (j, vr) in v.chunks_exact(hd).enumerate() {
            for (r, ar) in acc.chunks_exact_mut(hd).enumerate() {
                let pj = p[r * KT + j];
                if pj != 0.0 {
                    for (a, x) in ar.iter_mut().zip(vr) {
                        *a = fmadd::<FMA>(pj, *x, *a);
                    }
                }
            }
        }
    }
}
