//! The tensors a family's forward reads, found and shape-checked at open.
//!
//! Matrices stay in the file: a [`MatRef`] names its tensor, and the forward
//! takes a view of the mapping per call ([`Weights::matrix`]), so no weight
//! byte is ever copied. Norm vectors are decoded to f32 once (a few KB).

use super::config::{Arch, ModelConfig};
use crate::error::{EngineError, Result};
use crate::gguf::GgufFile;
use crate::quant::QMatrix;
use crate::GgmlType;

/// A matrix of `rows` outputs by `cols` inputs stored in the file.
#[derive(Debug, Clone)]
pub struct MatRef {
    pub name: String,
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
}

/// One decoder layer's weights.
#[derive(Debug, Clone)]
pub struct LayerWeights {
    pub attn_norm: Vec<f32>,
    pub wq: MatRef,
    pub wk: MatRef,
    pub wv: MatRef,
    pub wo: MatRef,
    /// Gemma 3: per-head RMSNorm weights of q and k (`head_dim` each).
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    /// Gemma 3: the norm of the attention output before its residual add.
    pub post_attn_norm: Option<Vec<f32>>,
    pub ffn_norm: Vec<f32>,
    pub gate: MatRef,
    pub up: MatRef,
    pub down: MatRef,
    /// Gemma 3: the norm of the feed-forward output before its residual add.
    pub post_ffn_norm: Option<Vec<f32>>,
}

/// Every weight of a model.
#[derive(Debug, Clone)]
pub struct Weights {
    /// `[vocab, n_embd]`: rows are looked up by token id.
    pub embed: MatRef,
    /// `[vocab, n_embd]`: `output.weight`, or the embedding when tied.
    pub output: MatRef,
    pub output_norm: Vec<f32>,
    pub layers: Vec<LayerWeights>,
}

impl Weights {
    /// The vocabulary size the embedding's shape gives, before the config
    /// exists (Gemma 3 files carry no vocab key).
    pub fn vocab_of(file: &GgufFile) -> Result<usize> {
        let t = file.tensor("token_embd.weight")?;
        match t.info.dims.get(1) {
            Some(&v) if t.info.dims.len() == 2 => to_usize(v, "token_embd.weight"),
            _ => Err(EngineError::Model(format!(
                "tensor \"token_embd.weight\": expected 2 dimensions, got {:?}",
                t.info.dims
            ))),
        }
    }

    /// Finds and checks every tensor `cfg` needs.
    pub fn load(file: &GgufFile, cfg: &ModelConfig) -> Result<Weights> {
        let (e, ff) = (cfg.n_embd, cfg.n_ff);
        let embed = matrix(file, "token_embd.weight", cfg.vocab, e)?;
        // Tied output (SmolLM2, Gemma 3): the embedding is the projection.
        let output = match file.get_tensor("output.weight") {
            Some(_) => matrix(file, "output.weight", cfg.vocab, e)?,
            None => embed.clone(),
        };
        let gemma = cfg.arch == Arch::Gemma3;
        let opt_norm = |name: String, n: usize| -> Result<Option<Vec<f32>>> {
            if gemma {
                norm(file, &name, n).map(Some)
            } else {
                Ok(None)
            }
        };
        let mut layers = Vec::with_capacity(cfg.n_layers);
        for i in 0..cfg.n_layers {
            let n = |s: &str| format!("blk.{i}.{s}.weight");
            layers.push(LayerWeights {
                attn_norm: norm(file, &n("attn_norm"), e)?,
                wq: matrix(file, &n("attn_q"), cfg.q_dim(), e)?,
                wk: matrix(file, &n("attn_k"), cfg.kv_dim(), e)?,
                wv: matrix(file, &n("attn_v"), cfg.kv_dim(), e)?,
                wo: matrix(file, &n("attn_output"), e, cfg.q_dim())?,
                q_norm: opt_norm(n("attn_q_norm"), cfg.head_dim)?,
                k_norm: opt_norm(n("attn_k_norm"), cfg.head_dim)?,
                post_attn_norm: opt_norm(n("post_attention_norm"), e)?,
                ffn_norm: norm(file, &n("ffn_norm"), e)?,
                gate: matrix(file, &n("ffn_gate"), ff, e)?,
                up: matrix(file, &n("ffn_up"), ff, e)?,
                down: matrix(file, &n("ffn_down"), e, ff)?,
                post_ffn_norm: opt_norm(n("post_ffw_norm"), e)?,
            });
        }
        Ok(Weights {
            embed,
            output,
            output_norm: norm(file, "output_norm.weight", e)?,
            layers,
        })
    }

    /// A view of `m`'s bytes in the mapping.
    pub fn matrix<'f>(file: &'f GgufFile, m: &MatRef) -> Result<QMatrix<'f>> {
        let t = file.tensor(&m.name)?;
        QMatrix::new(m.ty, m.rows, m.cols, t.data)
    }
}

fn to_usize(v: u64, name: &str) -> Result<usize> {
    usize::try_from(v)
        .map_err(|_| EngineError::Model(format!("tensor {name:?}: dimension {v} does not fit")))
}

/// Checks `name`'s GGUF dims `[cols, rows]` (row length first).
fn check_dims(name: &str, dims: &[u64], want: &[usize]) -> Result<()> {
    let ok = dims.len() == want.len() && dims.iter().zip(want).all(|(&d, &w)| d == w as u64);
    if ok {
        Ok(())
    } else {
        Err(EngineError::Model(format!(
            "tensor {name:?}: expected dims {want:?}, got {dims:?}"
        )))
    }
}

/// The matrix `name` of `rows` x `cols`, checked by building its view once.
fn matrix(file: &GgufFile, name: &str, rows: usize, cols: usize) -> Result<MatRef> {
    let t = file.tensor(name)?;
    check_dims(name, &t.info.dims, &[cols, rows])?;
    let m = MatRef {
        name: name.to_string(),
        ty: t.info.ty,
        rows,
        cols,
    };
    QMatrix::new(m.ty, rows, cols, t.data)
        .map_err(|e| EngineError::Model(format!("tensor {name:?}: {e}")))?;
    Ok(m)
}

/// The vector `name` of `n` values, decoded to f32.
fn norm(file: &GgufFile, name: &str, n: usize) -> Result<Vec<f32>> {
    let t = file.tensor(name)?;
    check_dims(name, &t.info.dims, &[n])?;
    let v = t.to_f32()?;
    if v.len() != n {
        return Err(EngineError::Model(format!(
            "tensor {name:?}: expected {n} values, got {}",
            v.len()
        )));
    }
    Ok(v)
}
