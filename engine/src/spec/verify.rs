//! Acceptance: which drafted tokens the target's own sampling keeps.
//!
//! One verification step scores the sequence's pending token and its `k`
//! drafted tokens; row `i` of its logits is the target's distribution for
//! the token after `draft[..i]`. Greedy keeps drafts while each equals its
//! row's argmax, then takes the argmax of the first row that disagrees (or
//! of the last row): exactly the tokens plain greedy decode would produce.
//! Sampled keeps the output distribution exact by the standard rejection
//! rule: draft `x` proposed with probability `q(x)` is kept with probability
//! `min(1, p(x) / q(x))`; on rejection the token is drawn from
//! `max(p - q, 0)` renormalised. A deterministic proposal (prompt lookup)
//! has `q` one-hot at `x`: keep with probability `p(x)`, else draw from `p`
//! with `x` removed.

use super::sample::{argmax, draw, probs, Rng, Sampling};
use crate::error::{EngineError, Result};

/// What one verification kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// Drafted tokens kept, a prefix of the draft.
    pub accepted: usize,
    /// The target's token after them (a correction or the bonus token).
    pub next: u32,
}

/// Verifies `draft` against `rows` (`draft.len() + 1` logit rows of `vocab`
/// values). `q`: the draft model's distribution for each drafted token when
/// it sampled them (`None`: a deterministic proposal). `InvalidArgument` for
/// rows or `q` of the wrong size or a drafted id beyond the vocabulary.
pub fn verify(
    draft: &[u32],
    rows: &[f32],
    vocab: usize,
    sampling: Sampling,
    q: Option<&[Vec<f64>]>,
    rng: &mut Rng,
) -> Result<Verdict> {
    let k = draft.len();
    if vocab == 0 || rows.len() != (k + 1) * vocab {
        return Err(EngineError::InvalidArgument(format!(
            "verify: expected {} rows of {vocab} logits for {k} drafted tokens, got {} values",
            k + 1,
            rows.len()
        )));
    }
    if let Some(&bad) = draft.iter().find(|&&t| t as usize >= vocab) {
        return Err(EngineError::InvalidArgument(format!(
            "verify: drafted token {bad} is beyond the vocabulary of {vocab}"
        )));
    }
    if let Some(q) = q {
        if q.len() != k || q.iter().any(|r| r.len() != vocab) {
            return Err(EngineError::InvalidArgument(format!(
                "verify: expected {k} draft distributions of {vocab} values"
            )));
        }
    }
    let row = |i: usize| rows.get(i * vocab..(i + 1) * vocab).unwrap_or_default();
    let temp = match sampling {
        Sampling::Greedy => {
            let accepted = draft
                .iter()
                .enumerate()
                .take_while(|&(i, &x)| argmax(row(i)) == x)
                .count();
            return Ok(Verdict {
                accepted,
                next: argmax(row(accepted)),
            });
        }
        Sampling::Temperature(t) => t,
    };
    for (i, &x) in draft.iter().enumerate() {
        let p = probs(row(i), temp);
        let q_row = q.and_then(|q| q.get(i));
        let px = p.get(x as usize).copied().unwrap_or(0.0);
        let qx = q_row.map_or(1.0, |r| r.get(x as usize).copied().unwrap_or(0.0));
        // u < p/q without dividing (q(x) is 0 only for a draft q never proposes).
        if rng.next_f64() * qx < px {
            continue;
        }
        let residual: Vec<f64> = match q_row {
            Some(r) => p.iter().zip(r).map(|(a, b)| (a - b).max(0.0)).collect(),
            None => {
                let mut r = p.clone();
                if let Some(v) = r.get_mut(x as usize) {
                    *v = 0.0;
                }
                r
            }
        };
        // An all-zero residual means p == q, where nothing is rejected; drawn
        // from p so rounding cannot stall.
        let next = if residual.iter().sum::<f64>() > 0.0 {
            draw(&residual, rng)
        } else {
            draw(&p, rng)
        };
        return Ok(Verdict { accepted: i, next });
    }
    Ok(Verdict {
        accepted: k,
        next: draw(&probs(row(k), temp), rng),
    })
}

#[cfg(test)]
#[allow(clippy::indexing_slicing, clippy::unwrap_used)]
mod tests {
    use super::*;

    const P: [f64; 4] = [0.5, 0.3, 0.15, 0.05];

    fn logits(p: &[f64]) -> Vec<f32> {
        p.iter().map(|&x| x.ln() as f32).collect()
    }

    /// Rows for `k` drafts, every row the distribution `P`.
    fn rows(k: usize) -> Vec<f32> {
        (0..=k).flat_map(|_| logits(&P)).collect()
    }

    /// Frequencies of the first output token over `n` verifications.
    fn first_token_freq(
        n: usize,
        mut run: impl FnMut(&mut Rng) -> (Vec<u32>, Verdict),
    ) -> Vec<f64> {
        let mut rng = Rng::new(42);
        let mut count = [0usize; 4];
        for _ in 0..n {
            let (draft, v) = run(&mut rng);
            let first = if v.accepted > 0 { draft[0] } else { v.next };
            count[first as usize] += 1;
        }
        count.iter().map(|&c| c as f64 / n as f64).collect()
    }

    fn assert_close(f: &[f64], what: &str) {
        for (got, want) in f.iter().zip(P) {
            // 20k draws: one standard deviation is below 0.0036.
            assert!((got - want).abs() < 0.015, "{what}: {f:?} vs {P:?}");
        }
    }

    #[test]
    fn greedy_keeps_the_argmax_prefix() {
        // Row argmaxes 2, 0, 1: drafts [2, 0, 3] keep two, then 1.
        let v = 4;
        let mut r = vec![0.0f32; 4 * v];
        r[2] = 1.0;
        r[v] = 1.0;
        r[2 * v + 1] = 1.0;
        r[3 * v + 3] = 1.0;
        let mut rng = Rng::new(0);
        let got = verify(&[2, 0, 3], &r, v, Sampling::Greedy, None, &mut rng).unwrap();
        assert_eq!(
            got,
            Verdict {
                accepted: 2,
                next: 1
            }
        );
        let got = verify(&[2, 0, 1], &r, v, Sampling::Greedy, None, &mut rng).unwrap();
        assert_eq!(
            got,
            Verdict {
                accepted: 3,
                next: 3
            }
        );
        let got = verify(&[], &r[..v], v, Sampling::Greedy, None, &mut rng).unwrap();
        assert_eq!(
            got,
            Verdict {
                accepted: 0,
                next: 2
            }
        );
    }

    #[test]
    fn a_fixed_proposal_keeps_the_distribution() {
        // Prompt lookup proposes token 1 (p = 0.3) every time.
        let r = rows(2);
        let f = first_token_freq(20_000, |rng| {
            let d = vec![1, 2];
            let v = verify(&d, &r, 4, Sampling::Temperature(1.0), None, rng).unwrap();
            (d, v)
        });
        assert_close(&f, "n-gram proposal");
    }

    #[test]
    fn a_sampled_draft_model_keeps_the_distribution() {
        let q = vec![0.1, 0.2, 0.6, 0.1];
        let r = rows(1);
        let f = first_token_freq(20_000, |rng| {
            let d = vec![draw(&q, rng)];
            let v = verify(
                &d,
                &r,
                4,
                Sampling::Temperature(1.0),
                Some(std::slice::from_ref(&q)),
                rng,
            )
            .unwrap();
            (d, v)
        });
        assert_close(&f, "draft distribution q");
    }

    #[test]
    fn a_draft_equal_to_the_target_is_always_kept() {
        let mut rng = Rng::new(3);
        let r = rows(3);
        for _ in 0..200 {
            let d: Vec<u32> = (0..3).map(|_| draw(&P, &mut rng)).collect();
            let qs = vec![P.to_vec(); 3];
            let v = verify(&d, &r, 4, Sampling::Temperature(1.0), Some(&qs), &mut rng).unwrap();
            assert_eq!(v.accepted, 3);
        }
    }

    #[test]
    fn bad_shapes_are_refused() {
        let mut rng = Rng::new(0);
        let r = rows(2);
        let bad = |res: Result<Verdict>| matches!(res, Err(EngineError::InvalidArgument(_)));
        assert!(bad(verify(&[1], &r, 4, Sampling::Greedy, None, &mut rng)));
        assert!(bad(verify(
            &[1, 9],
            &r,
            4,
            Sampling::Greedy,
            None,
            &mut rng
        )));
        let q = vec![P.to_vec()];
        assert!(bad(verify(
            &[1, 2],
            &r,
            4,
            Sampling::Greedy,
            Some(&q),
            &mut rng
        )));
        assert!(bad(verify(&[], &[], 0, Sampling::Greedy, None, &mut rng)));
    }
}
