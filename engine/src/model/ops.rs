//! The element-wise pieces of a decoder layer: RMSNorm, RoPE, head layouts
//! (the gate activations are in `gate`).
//!
//! Every function works on whole rows of a known width; a length that is not
//! a multiple of it is handled by `chunks_exact` (the tail is ignored, which
//! the callers rule out by construction).

use super::config::RopeStyle;

/// `out = x / rms(x) * w` for each row of `w.len()` values of `x`.
pub fn rms_norm_into(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let n = w.len();
    if n == 0 {
        return;
    }
    for (xr, or) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let scale = inv_rms(xr, eps);
        for ((o, &v), &g) in or.iter_mut().zip(xr).zip(w) {
            *o = v * scale * g;
        }
    }
}

/// The same in place.
pub fn rms_norm_in_place(x: &mut [f32], w: &[f32], eps: f32) {
    let n = w.len();
    if n == 0 {
        return;
    }
    for xr in x.chunks_exact_mut(n) {
        let scale = inv_rms(xr, eps);
        for (v, &g) in xr.iter_mut().zip(w) {
            *v *= scale * g;
        }
    }
}

fn inv_rms(x: &[f32], eps: f32) -> f32 {
    let ss: f32 = x.iter().map(|v| v * v).sum();
    1.0 / (ss / x.len().max(1) as f32 + eps).sqrt()
}

/// Cosines and sines of a RoPE table: for each token, `head_dim / 2` angles
/// `pos * base^(-2i/head_dim)` (f32 throughout, as the reference computes them).
pub fn rope_table(
    positions: &[usize],
    head_dim: usize,
    base: f32,
    cos: &mut Vec<f32>,
    sin: &mut Vec<f32>,
) {
    let half = head_dim / 2;
    cos.clear();
    sin.clear();
    let inv_freq: Vec<f32> = (0..half)
        .map(|i| 1.0 / base.powf((2 * i) as f32 / head_dim as f32))
        .collect();
    for &p in positions {
        for &f in &inv_freq {
            let a = p as f32 * f;
            cos.push(a.cos());
            sin.push(a.sin());
        }
    }
}

/// Rotates `x` (`[T, n_heads * head_dim]`, token-major) by the table of
/// [`rope_table`] for those T tokens.
pub fn rope_in_place(
    x: &mut [f32],
    t: usize,
    head_dim: usize,
    style: RopeStyle,
    cos: &[f32],
    sin: &[f32],
) {
    let half = head_dim / 2;
    let width = x.len() / t.max(1);
    if half == 0 || width == 0 {
        return;
    }
    for ((tok, c), s) in x
        .chunks_exact_mut(width)
        .zip(cos.chunks_exact(half))
        .zip(sin.chunks_exact(half))
    {
        for head in tok.chunks_exact_mut(head_dim) {
            match style {
                RopeStyle::Adjacent => {
                    for ((pair, &c), &s) in head.chunks_exact_mut(2).zip(c).zip(s) {
                        if let [a, b] = pair {
                            let (x0, x1) = (*a, *b);
                            *a = x0 * c - x1 * s;
                            *b = x0 * s + x1 * c;
                        }
                    }
                }
                RopeStyle::HalfSplit => {
                    let (lo, hi) = head.split_at_mut(half);
                    for (((a, b), &c), &s) in lo.iter_mut().zip(hi.iter_mut()).zip(c).zip(s) {
                        let (x0, x1) = (*a, *b);
                        *a = x0 * c - x1 * s;
                        *b = x0 * s + x1 * c;
                    }
                }
            }
        }
    }
}

/// `[T, H * d]` token-major to `[H, T, d]` head-major.
pub fn to_heads(x: &[f32], t: usize, heads: usize, d: usize, out: &mut [f32]) {
    for (ti, tok) in x.chunks_exact(heads * d).take(t).enumerate() {
        for (h, row) in tok.chunks_exact(d).enumerate() {
            let at = (h * t + ti) * d;
            if let Some(dst) = out.get_mut(at..at + d) {
                dst.copy_from_slice(row);
            }
        }
    }
}

/// `[H, T, d]` head-major to `[T, H * d]` token-major.
pub fn from_heads(x: &[f32], t: usize, heads: usize, d: usize, out: &mut [f32]) {
    for (h, head) in x.chunks_exact(t * d).take(heads).enumerate() {
        for (ti, row) in head.chunks_exact(d).enumerate() {
            let at = (ti * heads + h) * d;
            if let Some(dst) = out.get_mut(at..at + d) {
                dst.copy_from_slice(row);
            }
        }
    }
}
