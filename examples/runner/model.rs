//! The demo's model (`demo_model.py`: `DemoConfig`, `make_weights`, `rms_norm`,
//! ...): weights from the shared generator, norms, head reshapes and the greedy head.

use crate::args::Args;
use crate::matmul::matmul;
use crate::rng::*;

/// f32 weights, row-major: `emb [vocab, hidden]`, `wq [hidden, q_heads *
/// head_dim]`, `wk`/`wv [hidden, kv_heads * head_dim]`, `wo [q_heads *
/// head_dim, hidden]`; `out [hidden, vocab]` the untied output head.
pub(crate) struct Weights {
    pub(crate) emb: Vec<f32>,
    pub(crate) out: Vec<f32>,
    pub(crate) wq: Vec<Vec<f32>>,
    pub(crate) wk: Vec<Vec<f32>>,
    pub(crate) wv: Vec<Vec<f32>>,
    pub(crate) wo: Vec<Vec<f32>>,
}

/// `make_weights(cfg).astype(np.float32)`: each matrix is `uniform / sqrt(rows)`
/// in float64, then cast; the embeddings are unscaled.
pub(crate) fn make_weights(a: &Args) -> Weights {
    let mat = |tag: u64, layer: usize, rows: usize, cols: usize| -> Vec<f32> {
        let s = (rows as f64).sqrt();
        uniform(stream_key(a.seed, tag, layer), rows * cols)
            .map(|u| (u / s) as f32)
            .collect()
    };
    let (qd, kd) = (a.q_heads * a.head_dim, a.kv_heads * a.head_dim);
    let emb: Vec<f32> = uniform(stream_key(a.seed, TAG_EMB, 0), a.vocab * a.hidden)
        .map(|u| u as f32)
        .collect();
    let per_layer = |tag: u64, rows: usize, cols: usize| -> Vec<Vec<f32>> {
        (0..a.layers).map(|i| mat(tag, i, rows, cols)).collect()
    };
    Weights {
        wq: per_layer(TAG_WQ, a.hidden, qd),
        wk: per_layer(TAG_WK, a.hidden, kd),
        wv: per_layer(TAG_WV, a.hidden, kd),
        wo: per_layer(TAG_WO, qd, a.hidden),
        out: mat(TAG_OUT, 0, a.hidden, a.vocab),
        emb,
    }
}

pub(crate) fn prompt_prefix(a: &Args) -> Vec<usize> {
    integers(stream_key(a.seed, TAG_PROMPT, 0), a.prefix, a.vocab)
}

pub(crate) fn fork_token(a: &Args, fork: usize) -> usize {
    (fork * 7 + 1) % a.vocab
}

/// `x / sqrt(mean(x * x) + 1e-6)` per row of `width` (the mean summed in f64).
pub(crate) fn rms_norm(x: &[f32], width: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks_exact(width) {
        let ss: f64 = row.iter().map(|&v| f64::from(v * v)).sum();
        let mean = (ss / width as f64) as f32;
        let d = (mean + 1e-6f32).sqrt();
        out.extend(row.iter().map(|&v| v / d));
    }
    out
}

/// `[t, n * d]` -> `[n, t, d]`.
pub(crate) fn heads(x: &[f32], t: usize, n: usize, d: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; x.len()];
    for (ti, row) in x.chunks_exact(n * d).enumerate() {
        for (h, src) in row.chunks_exact(d).enumerate() {
            let o = (h * t + ti) * d;
            out[o..o + d].copy_from_slice(src);
        }
    }
    out
}

/// `[n, t, d]` -> `[t, n * d]`.
pub(crate) fn unheads(x: &[f32], t: usize, n: usize, d: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; x.len()];
    for (h, head) in x.chunks_exact(t * d).enumerate() {
        for (ti, src) in head.chunks_exact(d).enumerate() {
            let o = (ti * n + h) * d;
            out[o..o + d].copy_from_slice(src);
        }
    }
    out
}

/// Greedy choice from the final hidden states `[t, hidden]`:
/// `argmax(rms_norm(x) · out)`, the first index on ties (like `np.argmax`).
pub(crate) fn next_tokens(
    a: &Args,
    w: &Weights,
    x: &[f32],
    t: usize,
    threads: usize,
) -> Vec<usize> {
    let logits = matmul(
        &rms_norm(x, a.hidden),
        t,
        a.hidden,
        &w.out,
        a.vocab,
        threads,
    );
    logits
        .chunks_exact(a.vocab)
        .map(|row| {
            let mut best = 0;
            for (i, &v) in row.iter().enumerate() {
                if v > row[best] {
                    best = i;
                }
            }
            best
        })
        .collect()
}
