//! A model's hyper-parameters, read from the GGUF metadata of its family.

use super::family::{refuse_unimplemented, Arch};
use crate::error::{EngineError, Result};
use crate::gguf::Metadata;

/// How RoPE pairs the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Dimensions `(2i, 2i+1)` rotate together. Llama GGUFs store Q/K rows
    /// permuted by their converter so that this pairing reproduces the
    /// Hugging Face model's half-split rotation.
    Adjacent,
    /// Dimensions `(i, i + d/2)` rotate together (Gemma's rotate-half).
    HalfSplit,
}

/// The gate's activation in the feed-forward (`act(gate) * up`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    Silu,
    /// GELU with the tanh approximation.
    GeluTanh,
}

/// Bound on every size read from metadata, so products of two stay far from
/// overflowing (tensor shapes are checked against these sizes afterwards).
const MAX_SIZE: usize = 1 << 24;

/// What the forward needs to know about a model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    pub n_layers: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_ff: usize,
    pub vocab: usize,
    pub context_length: usize,
    /// RoPE base of full-attention layers.
    pub rope_base: f32,
    /// RoPE base of sliding-window layers (equal to `rope_base` for Llama).
    pub rope_base_local: f32,
    pub rope_style: RopeStyle,
    pub eps: f32,
    /// Multiplier of `q·k` in attention.
    pub attn_scale: f32,
    /// Per layer: the sliding window, `None` for full attention.
    pub windows: Vec<Option<usize>>,
    /// Multiplier of the token embeddings (Gemma: `sqrt(n_embd)`).
    pub embed_scale: f32,
    pub activation: Activation,
    /// Per-head RMSNorm of q and k before RoPE (`attn_q_norm`, `attn_k_norm`).
    pub qk_norm: bool,
    /// RMSNorm of the attention and feed-forward outputs before their
    /// residual adds (`post_attention_norm`, `post_ffw_norm`).
    pub sandwich_norms: bool,
    /// Linear RoPE scaling of full-attention layers: positions are divided
    /// by it (1 without scaling).
    pub rope_linear: f32,
    /// Whether the plan reads an optional `rope_freqs.weight`: per-dimension
    /// divisors of the full-attention layers' RoPE frequencies (llama3 scaling).
    pub rope_freqs: bool,
}

impl ModelConfig {
    /// The config of an `arch` model from its metadata; `vocab` comes from
    /// the token embedding's shape (Gemma 3 files carry no vocab key).
    /// `Unsupported` for a key that changes the math which the family does
    /// not implement.
    pub fn from_metadata(arch: Arch, m: &Metadata, vocab: usize) -> Result<ModelConfig> {
        let family = arch.family();
        refuse_unimplemented(m, arch.name(), family)?;
        let key = |k: &str| format!("{}.{k}", arch.name());
        let n_layers = m.usize(&key("block_count"))?;
        let n_embd = m.usize(&key("embedding_length"))?;
        let n_head = m.usize(&key("attention.head_count"))?;
        let n_head_kv = m
            .opt(&key("attention.head_count_kv"), Metadata::usize)?
            .unwrap_or(n_head);
        let n_ff = m.usize(&key("feed_forward_length"))?;
        let context_length = m.usize(&key("context_length"))?;
        let eps = m.f32(&key("attention.layer_norm_rms_epsilon"))?;
        let rope_base = m
            .opt(&key("rope.freq_base"), Metadata::f32)?
            .unwrap_or(10_000.0);
        if n_layers == 0 || n_head == 0 || n_head_kv == 0 || n_embd == 0 || n_ff == 0 {
            return Err(EngineError::Model(format!(
                "sizes: expected nonzero block_count, head counts, embedding and feed-forward \
                 lengths, got {n_layers}, {n_head}/{n_head_kv}, {n_embd}, {n_ff}"
            )));
        }
        let sizes = [n_layers, n_embd, n_head, n_head_kv, n_ff, context_length];
        if sizes.iter().any(|&s| s > MAX_SIZE) {
            return Err(EngineError::Model(format!(
                "sizes: expected block_count, embedding_length, head counts, feed_forward_length \
                 and context_length at most {MAX_SIZE}, got {sizes:?}"
            )));
        }
        if !n_head.is_multiple_of(n_head_kv) {
            return Err(EngineError::Model(format!(
                "attention.head_count: expected a multiple of head_count_kv {n_head_kv}, got {n_head}"
            )));
        }
        let head_dim = match m.opt(&key("attention.key_length"), Metadata::usize)? {
            Some(d) => d,
            None if n_embd.is_multiple_of(n_head) => n_embd / n_head,
            None => {
                return Err(EngineError::Model(format!(
                    "head size: embedding_length {n_embd} is not a multiple of head_count {n_head} \
                     and attention.key_length is missing"
                )))
            }
        };
        if let Some(vd) = m.opt(&key("attention.value_length"), Metadata::usize)? {
            if vd != head_dim {
                return Err(EngineError::Unsupported(format!(
                    "attention.value_length: expected the key length {head_dim}, got {vd}"
                )));
            }
        }
        if head_dim == 0 || !head_dim.is_multiple_of(2) || head_dim > MAX_SIZE / n_head {
            return Err(EngineError::Model(format!(
                "head size: expected a nonzero even number with head_count x head size at most \
                 {MAX_SIZE}, got {head_dim}"
            )));
        }
        if let Some(rd) = m.opt(&key("rope.dimension_count"), Metadata::usize)? {
            if rd != head_dim {
                return Err(EngineError::Unsupported(format!(
                    "rope.dimension_count: expected the head size {head_dim} (partial rotary \
                     embeddings are not supported), got {rd}"
                )));
            }
        }
        // The Llama recipe; the family's hparams change what differs.
        let mut cfg = ModelConfig {
            arch,
            n_layers,
            n_embd,
            n_head,
            n_head_kv,
            head_dim,
            n_ff,
            vocab,
            context_length,
            rope_base,
            rope_base_local: rope_base,
            rope_style: RopeStyle::Adjacent,
            eps,
            attn_scale: 1.0 / (head_dim as f32).sqrt(),
            windows: vec![None; n_layers],
            embed_scale: 1.0,
            activation: Activation::Silu,
            qk_norm: false,
            sandwich_norms: false,
            rope_linear: 1.0,
            rope_freqs: false,
        };
        (family.hparams)(m, arch.name(), &mut cfg)?;
        Ok(cfg)
    }

    /// The RoPE base of `layer`.
    pub fn rope_base_of(&self, layer: usize) -> f32 {
        match self.windows.get(layer) {
            Some(Some(_)) => self.rope_base_local,
            _ => self.rope_base,
        }
    }

    /// Query width `n_head * head_dim`.
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// Key/value width `n_head_kv * head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }
}
