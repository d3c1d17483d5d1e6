//! The gate activations of the feed-forward (`act(gate) * up`): GELU with
//! the tanh approximation (Gemma) and SiLU (Llama), both written as
//! `x · σ(k)` over one branch-free `exp` so the loop vectorizes. The libm
//! `tanhf`/`expf` calls they replace were a tenth of a prefill, all of it on
//! the caller's thread.
//!
//! `0.5·x·(1 + tanh(u))` is `x / (1 + e^(−2u))` exactly; the second form
//! also avoids the cancellation of `1 + tanh(u)` for very negative `u`.

/// `e^x` for f32 to about 2 ulp: `x = n·ln2 + r` with `|r| <= ln2/2`, `e^r`
/// by a degree-6 polynomial, `2^n` into the exponent bits. Inputs are
/// clamped to where the result is a normal finite f32 (so `e^-100` is a
/// tiny number, not zero; callers only divide by `1 + e^x`).
#[inline(always)]
fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split so `n · LN2_HI` is exact for the n that occur.
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // Adding then subtracting 1.5 · 2^23 rounds to the nearest integer.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    let n = (x * LOG2E + ROUND) - ROUND;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    // Taylor coefficients 1/k!: on |r| <= 0.347 the degree-6 remainder is
    // below 2.6e-8 relative.
    let p = 1.0 / 720.0;
    let p = p * r + 1.0 / 120.0;
    let p = p * r + 1.0 / 24.0;
    let p = p * r + 1.0 / 6.0;
    let p = p * r + 0.5;
    let p = p * r + 1.0;
    let p = p * r + 1.0;
    // n is in -126..=127 after the clamp: a normal exponent.
    let scale = f32::from_bits(((n as i32 + 127) as u32) << 23);
    p * scale
}

#[inline(always)]
fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    let u = SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x);
    x / (1.0 + exp(-2.0 * u))
}

#[inline(always)]
fn silu(x: f32) -> f32 {
    x / (1.0 + exp(-x))
}

#[inline(always)]
fn gated_loop(gate: &mut [f32], up: &[f32], gelu: bool) {
    if gelu {
        for (g, &u) in gate.iter_mut().zip(up) {
            *g = gelu_tanh(*g) * u;
        }
    } else {
        for (g, &u) in gate.iter_mut().zip(up) {
            *g = silu(*g) * u;
        }
    }
}

/// The same loop compiled for AVX-512 (sixteen lanes a step).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn gated_avx512(gate: &mut [f32], up: &[f32], gelu: bool) {
    gated_loop(gate, up, gelu);
}

/// The same loop compiled for AVX2 (eight lanes a step).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn gated_avx2(gate: &mut [f32], up: &[f32], gelu: bool) {
    gated_loop(gate, up, gelu);
}

/// `gate = act(gate) * up`, element-wise (GELU(tanh) when `gelu`, else SiLU).
pub fn gated(gate: &mut [f32], up: &[f32], gelu: bool) {
    #[cfg(target_arch = "x86_64")]
    {
        let cpu = offgraph_kv::cpu::features();
        if cpu.avx512f && cpu.avx2_fma() {
            // SAFETY: the CPU has the features the copy is compiled with (just checked).
            return unsafe { gated_avx512(gate, up, gelu) };
        }
        if cpu.avx2_fma() {
            // SAFETY: as above.
            return unsafe { gated_avx2(gate, up, gelu) };
        }
    }
    gated_loop(gate, up, gelu);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grid() -> impl Iterator<Item = f32> {
        (-4000..=4000).map(|i| i as f32 / 100.0)
    }

    #[test]
    fn exp_is_within_a_few_ulp_of_libm() {
        for x in grid().chain([-87.0, 88.0, -0.0, 1e-8]) {
            let (got, want) = (exp(x), x.exp());
            assert!(
                ((got - want) / want).abs() <= 3e-7,
                "exp({x}) = {got}, libm {want}"
            );
        }
        // Past the clamp: finite and ordered, never 0 or inf.
        assert!(exp(-200.0) > 0.0 && exp(-200.0) <= exp(-87.0));
        assert!(exp(200.0).is_finite() && exp(200.0) >= exp(88.0));
    }

    #[test]
    fn activations_match_their_tanh_and_exp_forms() {
        const K: f32 = 0.797_884_6;
        let xs: Vec<f32> = grid().collect();
        for gelu in [true, false] {
            let mut g = xs.clone();
            let up: Vec<f32> = xs.iter().map(|x| 1.0 + x.abs()).collect();
            gated(&mut g, &up, gelu);
            for ((&x, &u), &got) in xs.iter().zip(&up).zip(&g) {
                let (x64, u64) = (f64::from(x), f64::from(u));
                let want = if gelu {
                    0.5 * x64 * (1.0 + (f64::from(K) * (x64 + 0.044_715 * x64 * x64 * x64)).tanh())
                } else {
                    x64 / (1.0 + (-x64).exp())
                } * u64;
                let tol = 1e-6 * want.abs().max(1e-3);
                assert!(
                    (f64::from(got) - want).abs() <= tol,
                    "gelu={gelu} x={x}: {got} against {want}"
                );
            }
        }
    }
}
