//! The reference matmul: every weight row decoded to f32 and dotted with the
//! f32 activations, no activation quantization. Slow; for tests that
//! separate the forward's own error from the quantized dot kernels' (see
//! [`Model::set_exact_matmul`](super::Model::set_exact_matmul)).

use crate::error::{EngineError, Result};
use crate::quant::{dequantize_row, QMatrix};

/// `out[t * rows + r] = W[r] · x[t]`, as `quant::matmul` lays it out.
pub fn matmul_exact(
    w: &QMatrix<'_>,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
    row: &mut Vec<f32>,
) -> Result<()> {
    let (rows, cols) = (w.rows, w.cols);
    if x.len() < n_tokens * cols || out.len() < n_tokens * rows {
        return Err(EngineError::InvalidArgument(format!(
            "exact matmul: {n_tokens} tokens of {cols} inputs and {rows} outputs need {} and {} \
             values, got {} and {}",
            n_tokens * cols,
            n_tokens * rows,
            x.len(),
            out.len()
        )));
    }
    row.resize(cols, 0.0);
    for r in 0..rows {
        dequantize_row(w.ty, w.row(r)?, row)?;
        for (t, xt) in x.chunks_exact(cols).take(n_tokens).enumerate() {
            if let Some(o) = out.get_mut(t * rows + r) {
                *o = dot(row, xt);
            }
        }
    }
    Ok(())
}

/// Eight partial sums, so the compiler vectorises the loop.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for ((s, &p), &q) in acc.iter_mut().zip(x).zip(y) {
            *s += p * q;
        }
    }
    acc.iter().sum::<f32>() + tail
}
