//! What a model is: its family's description (the registry in `family`
//! fills it) and the hyper-parameters the forward reads.

use crate::error::Result;
use crate::gguf::Metadata;
use std::fmt;

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

/// YaRN RoPE scaling as the reference defines it: each pair's frequency
/// blends the original (fast pairs) and the one divided by `factor` (slow
/// pairs) along a ramp between the pairs that turn `beta_fast` and
/// `beta_slow` times over `original_context` positions; cos and sin are
/// multiplied by `0.1 ln(factor) + 1`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Yarn {
    pub factor: f32,
    pub original_context: usize,
    pub beta_fast: f32,
    pub beta_slow: f32,
}

/// LongRoPE as Phi-3.5 and Phi-4-mini use it: per-pair divisors of the
/// frequencies (`rope_factors_short.weight` for positions below
/// `original_context`, `rope_factors_long.weight` from there on), and cos
/// and sin multiplied by `attn_factor`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LongRope {
    pub original_context: usize,
    pub attn_factor: f32,
}

/// Where q and k are RMS-normalised before RoPE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkNorm {
    None,
    /// Each head over `head_dim` values (Gemma 3, Qwen 3).
    PerHead,
    /// The whole projection, `q_dim` and `kv_dim` values (OLMo 2).
    Whole,
}

/// The gate's activation in the feed-forward (`act(gate) * up`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    Silu,
    /// GELU with the tanh approximation.
    GeluTanh,
}

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
    /// Whether sliding layers rotate as full ones do (Phi-3), rather than by
    /// their own base and never scaled (Gemma).
    pub sliding_rope_is_global: bool,
    /// Multiplier of the token embeddings (Gemma: `sqrt(n_embd)`).
    pub embed_scale: f32,
    pub activation: Activation,
    /// RMSNorm of q and k before RoPE (`attn_q_norm`, `attn_k_norm`).
    pub qk_norm: QkNorm,
    /// RMSNorm of the layer input before attention and before the
    /// feed-forward (`attn_norm`, `ffn_norm`); OLMo 2 has none.
    pub pre_norms: bool,
    /// RMSNorm of the attention and feed-forward outputs before their
    /// residual adds (`post_attention_norm`, `post_ffw_norm`).
    pub sandwich_norms: bool,
    /// Biases of the q, k and v projections (`attn_{q,k,v}.bias`, Qwen 2).
    pub qkv_bias: bool,
    /// q, k and v in one matrix of `q_dim + 2 kv_dim` rows (`attn_qkv`, Phi-3).
    pub fused_qkv: bool,
    /// Gate and up in one matrix of `2 n_ff` rows, gate first (`ffn_up`, Phi-3).
    pub fused_gate_up: bool,
    /// Leading dimensions of a head that RoPE rotates (the rest pass through):
    /// `head_dim` unless the family rotates part of it (Phi-4-mini).
    pub rope_dims: usize,
    /// Multiplier of each block's output before its residual add (Granite).
    pub residual_scale: f32,
    /// Divisor of the logits (Granite's `logits_scaling`).
    pub logit_scale: f32,
    /// Attention scores capped as `c·tanh(s/c)` (Gemma 2).
    pub attn_softcap: Option<f32>,
    /// Logits capped the same way (Gemma 2).
    pub final_softcap: Option<f32>,
    /// Linear RoPE scaling of full-attention layers: positions are divided
    /// by it (1 without scaling).
    pub rope_linear: f32,
    /// YaRN scaling of full-attention layers (Qwen 2.5 / 3 long-context files).
    pub rope_yarn: Option<Yarn>,
    /// LongRoPE (Phi-3.5, Phi-4-mini): read where the file has its factor tensors.
    pub longrope: Option<LongRope>,
    /// Whether the plan reads an optional `rope_freqs.weight`: per-dimension
    /// divisors of the full-attention layers' RoPE frequencies (llama3 scaling).
    pub rope_freqs: bool,
}

impl ModelConfig {
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

/// What a family's chat format needs from the engine's users.
#[derive(Debug, PartialEq, Eq)]
pub struct ChatDefaults {
    /// Pieces that end an assistant turn: generation stops at them as at eos.
    pub turn_ends: &'static [&'static str],
    /// A chat template (Jinja) for files that carry none.
    pub template: Option<&'static str>,
}

/// One model family.
pub struct Family {
    /// The `general.architecture` values (and metadata key prefixes) it reads.
    pub archs: &'static [&'static str],
    /// Hugging Face `model_type` values of the same models (for the chat
    /// defaults of a model run through transformers).
    pub hf_model_types: &'static [&'static str],
    /// Sets the family's knobs on `cfg` (whose shared sizes are read, and
    /// whose knobs start at the Llama defaults) from the keys `{prefix}.*`.
    pub hparams: fn(m: &Metadata, prefix: &str, cfg: &mut ModelConfig) -> Result<()>,
    /// Keys (after `{prefix}.`) from the registry's math keys or `rope.scaling.*` that
    /// `hparams` reads and implements; any other such key is refused.
    pub implements: &'static [&'static str],
    pub chat: ChatDefaults,
}

/// A family as a file names it: `name` is the file's `general.architecture`.
#[derive(Clone, Copy)]
pub struct Arch {
    pub(in crate::model) name: &'static str,
    pub(in crate::model) family: &'static Family,
}

impl Arch {
    /// The metadata key prefix and `general.architecture` value.
    pub fn name(self) -> &'static str {
        self.name
    }

    pub fn family(self) -> &'static Family {
        self.family
    }
}

impl PartialEq for Arch {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

impl Eq for Arch {}

impl fmt::Debug for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Arch({:?})", self.name)
    }
}
