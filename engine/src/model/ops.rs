//! The element-wise pieces of a decoder layer: RMSNorm, RoPE, head layouts
//! (the gate activations are in `gate`).
//!
//! Every function works on whole rows of a known width; a length that is not
//! a multiple of it is handled by `chunks_exact` (the tail is ignored, which
//! the callers rule out by construction).

use super::config::{RopeStyle, Yarn};

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

/// The frequencies of a RoPE table: dimension pair `i` of a head of `d`
/// turns by `pos * base^(-2i/d) / (divisors[i] * linear)` radians.
#[derive(Debug, Clone, Copy)]
pub struct RopeFreqs<'a> {
    pub base: f32,
    /// Linear scaling: positions divided by it (1 without).
    pub linear: f32,
    /// Per-pair divisors (`rope_freqs.weight`, llama3 scaling), `d / 2` of them.
    pub divisors: Option<&'a [f32]>,
    pub yarn: Option<Yarn>,
    /// LongRoPE: from this position on, these divisors replace `divisors`.
    pub long: Option<(usize, &'a [f32])>,
    /// Multiplier of cos and sin (LongRoPE's attention factor; 1 without).
    pub mscale: f32,
}

impl RopeFreqs<'_> {
    pub fn plain(base: f32) -> RopeFreqs<'static> {
        RopeFreqs {
            base,
            linear: 1.0,
            divisors: None,
            yarn: None,
            long: None,
            mscale: 1.0,
        }
    }
}

/// YaRN's blend of pair `i`'s frequency `f` (of `half` pairs): the
/// reference's ramp between the pairs at which `beta_fast` and `beta_slow`
/// turns fit in the original context (floored and ceiled), computed in f64.
fn yarn_freq(y: &Yarn, f: f32, i: usize, half: usize, base: f32) -> f32 {
    let dim = (2 * half) as f64;
    let ctx = y.original_context as f64;
    let at = |turns: f32| {
        let turns = f64::from(turns);
        dim * (ctx / (turns * 2.0 * std::f64::consts::PI)).ln() / (2.0 * f64::from(base).ln())
    };
    let low = at(y.beta_fast).floor().max(0.0);
    let mut high = at(y.beta_slow).ceil().min(dim - 1.0);
    if low == high {
        high += 0.001;
    }
    let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0) as f32;
    // Written from the interpolated end so that a factor of 1 is `f` exactly.
    let fi = f / y.factor;
    fi + (f - fi) * (1.0 - ramp)
}

/// Cosines and sines of a RoPE table: for each token, `head_dim / 2` angles
/// `pos * f_i` with `f_i = base^(-2i/head_dim) / divisor_i / linear` (f32
/// throughout, as the reference computes them: Hugging Face divides its
/// inverse frequencies by the llama3 factors and the linear factor; without
/// scaling both divisions are by 1, exactly).
pub fn rope_table(
    positions: &[usize],
    head_dim: usize,
    freqs: &RopeFreqs<'_>,
    cos: &mut Vec<f32>,
    sin: &mut Vec<f32>,
) {
    let half = head_dim / 2;
    cos.clear();
    sin.clear();
    let inv_freq = |divisors: Option<&[f32]>| -> Vec<f32> {
        (0..half)
            .map(|i| {
                let f = 1.0 / freqs.base.powf((2 * i) as f32 / head_dim as f32);
                let div = divisors.and_then(|d| d.get(i)).copied().unwrap_or(1.0);
                let f = match &freqs.yarn {
                    Some(y) => yarn_freq(y, f, i, half, freqs.base),
                    None => f,
                };
                f / div / freqs.linear
            })
            .collect()
    };
    let near = inv_freq(freqs.divisors);
    let far = freqs.long.map(|(from, d)| (from, inv_freq(Some(d))));
    // YaRN and LongRoPE scale cos and sin (so q·k by the square), as the reference does.
    let m = freqs.mscale
        * match &freqs.yarn {
            Some(y) if y.factor > 1.0 => 0.1 * y.factor.ln() + 1.0,
            _ => 1.0,
        };
    for &p in positions {
        let table = match &far {
            Some((from, f)) if p >= *from => f,
            _ => &near,
        };
        for &f in table {
            let a = p as f32 * f;
            cos.push(a.cos() * m);
            sin.push(a.sin() * m);
        }
    }
}

/// Rotates the first `rot` dimensions of every head of `x` (`[T, n_heads *
/// head_dim]`, token-major) by the table [`rope_table`] made for `rot`
/// dimensions and those T tokens; the other `head_dim - rot` pass through.
pub fn rope_in_place(
    x: &mut [f32],
    t: usize,
    head_dim: usize,
    rot: usize,
    style: RopeStyle,
    cos: &[f32],
    sin: &[f32],
) {
    let half = rot.min(head_dim) / 2;
    let width = x.len() / t.max(1);
    if half == 0 || width == 0 || head_dim == 0 {
        return;
    }
    for ((tok, c), s) in x
        .chunks_exact_mut(width)
        .zip(cos.chunks_exact(half))
        .zip(sin.chunks_exact(half))
    {
        for whole in tok.chunks_exact_mut(head_dim) {
            let head = match whole.get_mut(..2 * half) {
                Some(h) => h,
                None => continue,
            };
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

#[cfg(test)]
#[allow(clippy::indexing_slicing)]
mod tests {
    use super::*;

    /// `x` (one head of `d`, adjacent pairs) rotated at `pos` by the direct
    /// formula, in f64: pair `i` turns by `pos / linear * base^(-2i/d) / div_i`.
    fn direct(x: &[f32], pos: usize, base: f64, linear: f64, div: Option<&[f32]>) -> Vec<f64> {
        let d = x.len();
        let mut out = vec![0.0; d];
        for i in 0..d / 2 {
            let dv = div.map_or(1.0, |v| f64::from(v[i]));
            let theta = pos as f64 / linear * base.powf(-2.0 * i as f64 / d as f64) / dv;
            let (a, b) = (f64::from(x[2 * i]), f64::from(x[2 * i + 1]));
            out[2 * i] = a * theta.cos() - b * theta.sin();
            out[2 * i + 1] = a * theta.sin() + b * theta.cos();
        }
        out
    }

    #[test]
    fn rope_rotates_by_the_scaled_frequencies() {
        let d = 16;
        let x: Vec<f32> = (0..d)
            .map(|i| ((i * 7 % 5) as f32 - 2.0) * 0.37 + 0.1)
            .collect();
        let divisors: Vec<f32> = (0..d / 2).map(|i| 1.0 + i as f32 * 0.9).collect();
        let positions = [0usize, 1, 7, 300, 4097];
        let cases: [(f32, Option<&[f32]>); 4] = [
            (1.0, None),
            (4.0, None),
            (1.0, Some(&divisors)),
            (8.0, Some(&divisors)),
        ];
        for (linear, div) in cases {
            let freqs = RopeFreqs {
                base: 500_000.0,
                linear,
                divisors: div,
                yarn: None,
                long: None,
                mscale: 1.0,
            };
            let (mut cos, mut sin) = (Vec::new(), Vec::new());
            rope_table(&positions, d, &freqs, &mut cos, &mut sin);
            let mut got: Vec<f32> = positions.iter().flat_map(|_| x.iter().copied()).collect();
            rope_in_place(
                &mut got,
                positions.len(),
                d,
                d,
                RopeStyle::Adjacent,
                &cos,
                &sin,
            );
            for (t, &p) in positions.iter().enumerate() {
                let want = direct(&x, p, 500_000.0, f64::from(linear), div);
                for (g, w) in got[t * d..(t + 1) * d].iter().zip(&want) {
                    // f32 angles of positions up to ~4k: a few 1e-4 radians.
                    assert!(
                        (f64::from(*g) - w).abs() < 2e-3,
                        "pos {p} linear {linear} divisors {}: {g} vs {w}",
                        div.is_some()
                    );
                }
            }
        }
        // The scaling changes the rotation: position 7 scaled by 4 is position 1.75.
        let (mut c4, mut s4) = (Vec::new(), Vec::new());
        let (mut c1, mut s1) = (Vec::new(), Vec::new());
        let scaled = RopeFreqs {
            base: 10_000.0,
            linear: 4.0,
            divisors: None,
            yarn: None,
            long: None,
            mscale: 1.0,
        };
        rope_table(&[8], d, &scaled, &mut c4, &mut s4);
        rope_table(&[2], d, &RopeFreqs::plain(10_000.0), &mut c1, &mut s1);
        for (a, b) in c4.iter().zip(&c1).chain(s4.iter().zip(&s1)) {
            assert!((a - b).abs() < 1e-6, "{a} vs {b}");
        }
        assert!((c4[0] - 1.0).abs() > 0.1, "position 2 turns pair 0 visibly");
    }

    #[test]
    fn yarn_blends_as_the_reference_defines() {
        // The reference's formula in f64: low and high correction pairs
        // (floored, ceiled, clamped), a linear ramp, the blend, mscale.
        let (d, base) = (64usize, 100_000f64);
        let y = Yarn {
            factor: 4.0,
            original_context: 8192,
            beta_fast: 32.0,
            beta_slow: 1.0,
        };
        let corr = |turns: f64| {
            d as f64 * (8192.0 / (turns * 2.0 * std::f64::consts::PI)).ln() / (2.0 * base.ln())
        };
        let (low, high) = (
            corr(32.0).floor().max(0.0),
            corr(1.0).ceil().min(d as f64 - 1.0),
        );
        assert_eq!((low, high), (10.0, 20.0));
        let freqs = RopeFreqs {
            base: base as f32,
            linear: 1.0,
            divisors: None,
            yarn: Some(y),
            long: None,
            mscale: 1.0,
        };
        let (mut cos, mut sin) = (Vec::new(), Vec::new());
        rope_table(&[1000], d, &freqs, &mut cos, &mut sin);
        let mscale = 0.1 * 4f64.ln() + 1.0;
        for i in 0..d / 2 {
            let extra = base.powf(-2.0 * i as f64 / d as f64);
            let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
            let keep = 1.0 - ramp;
            let f = extra / 4.0 * (1.0 - keep) + extra * keep;
            let a = 1000.0 * f;
            assert!(
                (f64::from(cos[i]) - a.cos() * mscale).abs() < 2e-3,
                "cos {i}"
            );
            assert!(
                (f64::from(sin[i]) - a.sin() * mscale).abs() < 2e-3,
                "sin {i}"
            );
        }
    }

    #[test]
    fn partial_rotary_turns_the_leading_dimensions_only() {
        // Two heads of 8 with 4 rotated dims: each head's first 4 values turn
        // as a head of 4 would (rotate-half within them), the last 4 pass.
        let (d, rot, pos) = (8, 4, [3usize]);
        let x: Vec<f32> = (0..2 * d).map(|i| i as f32 * 0.25 - 1.0).collect();
        let (mut cos, mut sin) = (Vec::new(), Vec::new());
        rope_table(&pos, rot, &RopeFreqs::plain(10_000.0), &mut cos, &mut sin);
        assert_eq!(cos.len(), rot / 2);
        let mut got = x.clone();
        rope_in_place(&mut got, 1, d, rot, RopeStyle::HalfSplit, &cos, &sin);
        for h in 0..2 {
            let head = &x[h * d..(h + 1) * d];
            let mut small = head[..rot].to_vec();
            rope_in_place(&mut small, 1, rot, rot, RopeStyle::HalfSplit, &cos, &sin);
            assert_eq!(&got[h * d..h * d + rot], &small[..]);
            assert_eq!(&got[h * d + rot..(h + 1) * d], &head[rot..]);
            assert_ne!(&got[h * d..h * d + rot], &head[..rot]);
        }
    }
}
