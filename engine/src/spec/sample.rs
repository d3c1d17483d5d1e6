//! Picking a token from a logit row: greedy (the first largest, as every
//! greedy path of the engine picks) or sampled at a temperature from a
//! seeded stream.

/// A small seeded generator (SplitMix64).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// Uniform in [0, 1), 53 bits.
    pub fn next_f64(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// How tokens are picked from the target's logits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Sampling {
    /// The first largest logit.
    Greedy,
    /// Sampled from `softmax(logits / temp)`, `temp > 0`.
    Temperature(f32),
}

/// The index of the first largest value (0 for an empty row).
pub fn argmax(row: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut max = f32::NEG_INFINITY;
    for (i, &v) in row.iter().enumerate() {
        if v > max {
            best = i;
            max = v;
        }
    }
    best as u32
}

/// `softmax(row / temp)` in f64.
pub fn probs(row: &[f32], temp: f32) -> Vec<f64> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let t = f64::from(temp);
    let mut p: Vec<f64> = row
        .iter()
        .map(|&v| ((f64::from(v) - f64::from(max)) / t).exp())
        .collect();
    let total: f64 = p.iter().sum();
    if total > 0.0 && total.is_finite() {
        p.iter_mut().for_each(|x| *x /= total);
    }
    p
}

/// A draw from the weights `w` (not necessarily normalised; all >= 0). The
/// last positive weight when rounding leaves a remainder; 0 when all are 0.
pub fn draw(w: &[f64], rng: &mut Rng) -> u32 {
    let total: f64 = w.iter().sum();
    let mut u = rng.next_f64() * total;
    let mut last = 0usize;
    for (i, &x) in w.iter().enumerate() {
        if x > 0.0 {
            last = i;
            if u < x {
                return i as u32;
            }
            u -= x;
        }
    }
    last as u32
}

/// One token from `row` as `sampling` picks it.
pub fn pick(row: &[f32], sampling: Sampling, rng: &mut Rng) -> u32 {
    match sampling {
        Sampling::Greedy => argmax(row),
        Sampling::Temperature(t) => draw(&probs(row, t), rng),
    }
}

#[cfg(test)]
#[allow(clippy::indexing_slicing)]
mod tests {
    use super::*;

    #[test]
    fn argmax_takes_the_first_of_ties() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(argmax(&[]), 0);
    }

    #[test]
    fn draws_follow_the_weights() {
        let mut rng = Rng::new(1);
        let w = [0.0, 1.0, 3.0, 0.0];
        let mut n = [0usize; 4];
        for _ in 0..40_000 {
            n[draw(&w, &mut rng) as usize] += 1;
        }
        assert_eq!(n[0] + n[3], 0);
        let f = n[2] as f64 / 40_000.0;
        assert!((f - 0.75).abs() < 0.015, "{f}");
    }

    #[test]
    fn probs_sum_to_one() {
        let p = probs(&[0.0, 1.0, 2.0], 0.5);
        assert!((p.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        assert!(p[2] > p[1] && p[1] > p[0]);
    }
}
