//! The tensors a family's forward reads, found and shape-checked at open.
//!
//! The plan is the Llama layer plus what the config's knobs add or change
//! (QK norms, pre- and sandwich norms, q/k/v biases, fused q/k/v and
//! gate/up matrices, `rope_freqs.weight`); every other tensor in the file is
//! refused, since the forward would silently ignore it.
//!
//! Matrices stay in the file: a [`MatRef`] names its tensor, and the forward
//! takes a view of the mapping per call ([`Weights::matrix`]). Where the
//! kernels read packed groups ([`quant::packed_len`]), [`Weights::repack`]
//! copies every matrix's whole groups of 16 rows once into one anonymous
//! mapping in that layout and drops the file's pages of the tensors it
//! packed, so resident memory stays about the file's size. Norm vectors are
//! decoded to f32 once (a few KB).

mod pack;

use super::config::{ModelConfig, QkNorm};
use crate::error::{EngineError, Result};
use crate::gguf::GgufFile;
use crate::quant::{self, QMatrix};
use crate::GgmlType;
use memmap2::{Mmap, MmapOptions};
use std::collections::HashSet;
use std::sync::Arc;

/// A matrix of `rows` outputs by `cols` inputs stored in the file: rows
/// `row0..row0 + rows` of its tensor (a part of a fused matrix, or all of one).
#[derive(Debug, Clone)]
pub struct MatRef {
    pub name: String,
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub row0: usize,
    /// Its whole groups of rows packed at load ([`Weights::repack`]).
    pub packed: Option<Packed>,
}

/// A matrix's packed groups: `len` bytes at `off` of the model's packed mapping.
#[derive(Debug, Clone)]
pub struct Packed {
    map: Arc<Mmap>,
    off: usize,
    len: usize,
}

impl Packed {
    fn bytes(&self) -> Option<&[u8]> {
        self.map.get(self.off..self.off.checked_add(self.len)?)
    }
}

/// Where each packed matrix starts in the mapping: 2 MiB, so the mapping
/// can take huge pages, and every group's loads start 64-byte aligned.
const PACK_ALIGN: usize = 2 << 20;
/// Each matrix's packed groups start at a multiple of this.
const MATRIX_ALIGN: usize = 4096;

/// One decoder layer's weights.
#[derive(Debug, Clone)]
pub struct LayerWeights {
    /// The norms of the layer input (absent in OLMo 2).
    pub attn_norm: Option<Vec<f32>>,
    pub wq: MatRef,
    pub wk: MatRef,
    pub wv: MatRef,
    pub wo: MatRef,
    /// Qwen 2: biases of q, k and v.
    pub bq: Option<Vec<f32>>,
    pub bk: Option<Vec<f32>>,
    pub bv: Option<Vec<f32>>,
    /// RMSNorm weights of q and k: `head_dim` each (per head) or the whole
    /// projection's width (OLMo 2).
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    /// Gemma, OLMo 2: the norm of the attention output before its residual add.
    pub post_attn_norm: Option<Vec<f32>>,
    pub ffn_norm: Option<Vec<f32>>,
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
    /// `[head_dim / 2]` divisors of the full-attention layers' RoPE
    /// frequencies (`rope_freqs.weight`, llama3 scaling), when the file has them.
    pub rope_freqs: Option<Vec<f32>>,
    /// LongRoPE's short and long divisors, when the family reads them and
    /// the file has them.
    pub rope_factors: Option<[Vec<f32>; 2]>,
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

    /// Finds and checks every tensor `cfg` needs; `Unsupported` for a
    /// tensor of the file the plan does not consume.
    pub fn load(file: &GgufFile, cfg: &ModelConfig) -> Result<Weights> {
        let mut p = Plan {
            file,
            seen: HashSet::new(),
        };
        let (e, ff) = (cfg.n_embd, cfg.n_ff);
        let embed = p.matrix("token_embd.weight", cfg.vocab, e)?;
        // Tied output (SmolLM2, Gemma 3): the embedding is the projection.
        let output = match file.get_tensor("output.weight") {
            Some(_) => p.matrix("output.weight", cfg.vocab, e)?,
            None => embed.clone(),
        };
        let rope_freqs = match file.get_tensor("rope_freqs.weight") {
            Some(_) if cfg.rope_freqs => Some(p.divisors("rope_freqs.weight", cfg.rope_dims / 2)?),
            _ => None,
        };
        const FACTORS: [&str; 2] = ["rope_factors_short.weight", "rope_factors_long.weight"];
        let has = FACTORS.map(|n| file.get_tensor(n).is_some());
        let rope_factors = match (cfg.longrope.is_some(), has) {
            (true, [true, true]) => Some([
                p.divisors(FACTORS[0], cfg.rope_dims / 2)?,
                p.divisors(FACTORS[1], cfg.rope_dims / 2)?,
            ]),
            (true, [true, false] | [false, true]) => {
                return Err(EngineError::Model(format!(
                    "tensors {FACTORS:?}: LongRoPE needs both, the file has one"
                )))
            }
            _ => None,
        };
        let mut layers = Vec::with_capacity(cfg.n_layers);
        let (qd, kd) = (cfg.q_dim(), cfg.kv_dim());
        let (qn, kn) = match cfg.qk_norm {
            QkNorm::None => (None, None),
            QkNorm::PerHead => (Some(cfg.head_dim), Some(cfg.head_dim)),
            QkNorm::Whole => (Some(qd), Some(kd)),
        };
        for i in 0..cfg.n_layers {
            let n = |s: &str| format!("blk.{i}.{s}.weight");
            let b = |s: &str| format!("blk.{i}.{s}.bias");
            // In the layer's order, so a file missing its first tensor says so.
            let attn_norm = p.opt_norm(cfg.pre_norms, &n("attn_norm"), e)?;
            let [wq, wk, wv] = if cfg.fused_qkv {
                p.fused(&n("attn_qkv"), [qd, kd, kd], e)?
            } else {
                [
                    p.matrix(&n("attn_q"), qd, e)?,
                    p.matrix(&n("attn_k"), kd, e)?,
                    p.matrix(&n("attn_v"), kd, e)?,
                ]
            };
            let [gate, up] = if cfg.fused_gate_up {
                p.fused(&n("ffn_up"), [ff, ff], e)?
            } else {
                [
                    p.matrix(&n("ffn_gate"), ff, e)?,
                    p.matrix(&n("ffn_up"), ff, e)?,
                ]
            };
            let bias = cfg.qkv_bias;
            layers.push(LayerWeights {
                attn_norm,
                wq,
                wk,
                wv,
                wo: p.matrix(&n("attn_output"), e, qd)?,
                bq: p.opt_vector(bias, &b("attn_q"), qd)?,
                bk: p.opt_vector(bias, &b("attn_k"), kd)?,
                bv: p.opt_vector(bias, &b("attn_v"), kd)?,
                q_norm: qn.map(|d| p.norm(&n("attn_q_norm"), d)).transpose()?,
                k_norm: kn.map(|d| p.norm(&n("attn_k_norm"), d)).transpose()?,
                post_attn_norm: p.opt_norm(cfg.sandwich_norms, &n("post_attention_norm"), e)?,
                ffn_norm: p.opt_norm(cfg.pre_norms, &n("ffn_norm"), e)?,
                gate,
                up,
                down: p.matrix(&n("ffn_down"), e, ff)?,
                post_ffn_norm: p.opt_norm(cfg.sandwich_norms, &n("post_ffw_norm"), e)?,
            });
        }
        let output_norm = p.norm("output_norm.weight", e)?;
        if let Some(t) = file.tensors().iter().find(|t| !p.seen.contains(&t.name)) {
            return Err(EngineError::Unsupported(format!(
                "tensor {:?} ({:?}, dims {:?}): not in the {} family's plan (running without \
                 it would compute a different model)",
                t.name,
                t.ty,
                t.dims,
                cfg.arch.name()
            )));
        }
        Ok(Weights {
            embed,
            output,
            output_norm,
            layers,
            rope_freqs,
            rope_factors,
        })
    }

    /// Packs every matrix the kernels read packed (all but the embedding's
    /// lookups) into one anonymous mapping on `threads` threads, dropping
    /// each packed tensor's file pages after it; returns the packed bytes (0
    /// when the path packs nothing). The bytes do not depend on `threads`.
    pub fn repack(&mut self, file: &GgufFile, threads: usize) -> Result<usize> {
        let mut mats: Vec<&mut MatRef> = Vec::new();
        for l in &mut self.layers {
            mats.extend([
                &mut l.wq,
                &mut l.wk,
                &mut l.wv,
                &mut l.wo,
                &mut l.gate,
                &mut l.up,
                &mut l.down,
            ]);
        }
        mats.push(&mut self.output);
        let mut at = Vec::with_capacity(mats.len());
        let mut total = 0usize;
        for m in &mats {
            let len = quant::packed_len(m.ty, m.rows, m.cols).unwrap_or(0);
            at.push((total, len));
            total = total
                .checked_add(len.next_multiple_of(MATRIX_ALIGN))
                .ok_or_else(|| EngineError::Model("packed weights: size overflows".into()))?;
        }
        if total == 0 {
            return Ok(0);
        }
        let io = |what: &str, e: std::io::Error| {
            EngineError::Io(format!("packed weights ({total} bytes): {what}: {e}"))
        };
        let mut map = MmapOptions::new()
            .len(total + PACK_ALIGN)
            .map_anon()
            .map_err(|e| io("map", e))?;
        #[cfg(target_os = "linux")]
        {
            // Huge pages where the OS gives them (fewer TLB misses on a
            // streamed read); refused is fine.
            let _ = map.advise(memmap2::Advice::HugePage);
        }
        let base = (map.as_ptr() as usize).next_multiple_of(PACK_ALIGN) - map.as_ptr() as usize;
        let out = map
            .get_mut(base..base + total)
            .ok_or_else(|| EngineError::Model("packed weights: out of range".into()))?;
        let shared: Vec<&MatRef> = mats.iter().map(|m| &**m).collect();
        pack::run(file, pack::jobs(&shared, &at, out)?, threads)?;
        let map = Arc::new(map.make_read_only().map_err(|e| io("protect", e))?);
        for (m, &(off, len)) in mats.into_iter().zip(&at) {
            if len > 0 {
                m.packed = Some(Packed {
                    map: map.clone(),
                    off: base + off,
                    len,
                });
            }
        }
        Ok(at.iter().map(|&(_, l)| l).sum())
    }

    /// Each packed matrix's name and packed bytes, in the forward's order.
    pub fn packed_parts(&self) -> Vec<(&str, &[u8])> {
        let layers = self
            .layers
            .iter()
            .flat_map(|l| [&l.wq, &l.wk, &l.wv, &l.wo, &l.gate, &l.up, &l.down]);
        layers
            .chain([&self.output])
            .filter_map(|m| Some((m.name.as_str(), m.packed.as_ref()?.bytes()?)))
            .collect()
    }

    /// A view of `m`'s bytes in the mapping, with its packed groups when
    /// it has them.
    pub fn matrix<'f>(file: &'f GgufFile, m: &'f MatRef) -> Result<QMatrix<'f>> {
        let t = file.tensor(&m.name)?;
        let rb = usize::try_from(m.ty.row_bytes(m.cols as u64)?)
            .map_err(|_| EngineError::Model(format!("tensor {:?}: rows too long", m.name)))?;
        let part = m
            .row0
            .checked_mul(rb)
            .zip(m.rows.checked_mul(rb))
            .and_then(|(lo, n)| t.data.get(lo..lo.checked_add(n)?))
            .ok_or_else(|| {
                EngineError::Model(format!(
                    "tensor {:?}: rows {}..{} beyond the tensor",
                    m.name,
                    m.row0,
                    m.row0 + m.rows
                ))
            })?;
        let q = QMatrix::new(m.ty, m.rows, m.cols, part)?;
        match &m.packed {
            Some(p) => q.with_packed(p.bytes().ok_or_else(|| {
                EngineError::Model(format!("tensor {:?}: packed range out of bounds", m.name))
            })?),
            None => Ok(q),
        }
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

/// The tensors read so far, so that the rest can be refused.
struct Plan<'f> {
    file: &'f GgufFile,
    seen: HashSet<String>,
}

impl Plan<'_> {
    fn matrix(&mut self, name: &str, rows: usize, cols: usize) -> Result<MatRef> {
        self.seen.insert(name.to_string());
        matrix(self.file, name, rows, cols)
    }

    fn norm(&mut self, name: &str, n: usize) -> Result<Vec<f32>> {
        self.seen.insert(name.to_string());
        norm(self.file, name, n)
    }

    /// The norm `name` when the family's plan has it (then it is required).
    fn opt_norm(&mut self, wanted: bool, name: &str, n: usize) -> Result<Option<Vec<f32>>> {
        if wanted {
            self.norm(name, n).map(Some)
        } else {
            Ok(None)
        }
    }

    /// A bias vector: read as a norm is (`n` values decoded to f32).
    fn opt_vector(&mut self, wanted: bool, name: &str, n: usize) -> Result<Option<Vec<f32>>> {
        self.opt_norm(wanted, name, n)
    }

    /// The `N` consecutive row blocks of `parts` rows of the fused matrix
    /// `name` (`sum(parts)` x `cols`), each a view of its rows.
    fn fused<const N: usize>(
        &mut self,
        name: &str,
        parts: [usize; N],
        cols: usize,
    ) -> Result<[MatRef; N]> {
        let whole = self.matrix(name, parts.iter().sum(), cols)?;
        let mut row0 = 0;
        Ok(parts.map(|rows| {
            let m = MatRef {
                rows,
                row0,
                ..whole.clone()
            };
            row0 += rows;
            m
        }))
    }

    /// RoPE frequency divisors: `n` finite positive values.
    fn divisors(&mut self, name: &str, n: usize) -> Result<Vec<f32>> {
        let v = self.norm(name, n)?;
        if let Some(bad) = v.iter().find(|d| !(d.is_finite() && **d > 0.0)) {
            return Err(EngineError::Model(format!(
                "tensor {name:?}: expected positive finite divisors, got {bad}"
            )));
        }
        Ok(v)
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
        row0: 0,
        packed: None,
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
