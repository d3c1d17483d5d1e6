//! Gemma 2: Gemma 3's layer without QK norms, one RoPE base, attention
//! scores and logits soft-capped (`c·tanh(x/c)`), and sliding-window and
//! full-attention layers alternating (the even ones slide).

use super::gemma3::TEMPLATE;
use super::{positive, window};
use crate::error::{EngineError, Result};
use crate::gguf::Metadata;
use crate::model::config::{Activation, ChatDefaults, Family, ModelConfig, RopeStyle};

/// Block count of Gemma 2 27B, whose query scalar is `n_embd / n_head`
/// rather than the head size; the files do not carry it, and the reference
/// implementation tells the sizes apart the same way.
const LAYERS_27B: usize = 46;

pub static FAMILY: Family = Family {
    archs: &["gemma2"],
    hf_model_types: &["gemma2"],
    hparams,
    implements: &[
        "attention.sliding_window",
        "attn_logit_softcapping",
        "final_logit_softcapping",
        "attention.query_pre_attn_scalar",
    ],
    chat: ChatDefaults {
        turn_ends: &["<end_of_turn>"],
        template: Some(TEMPLATE),
    },
};

fn hparams(m: &Metadata, prefix: &str, cfg: &mut ModelConfig) -> Result<()> {
    let window_key = format!("{prefix}.attention.sliding_window");
    let w = window(m, prefix)?
        .ok_or_else(|| EngineError::Model(format!("{window_key}: expected a nonzero window")))?;
    cfg.windows = (0..cfg.n_layers)
        .map(|i| i.is_multiple_of(2).then_some(w))
        .collect();
    let scalar = match positive(m, &format!("{prefix}.attention.query_pre_attn_scalar"))? {
        Some(s) => s,
        None if cfg.n_layers == LAYERS_27B => (cfg.n_embd / cfg.n_head) as f32,
        None => cfg.head_dim as f32,
    };
    cfg.attn_scale = 1.0 / scalar.sqrt();
    cfg.attn_softcap = positive(m, &format!("{prefix}.attn_logit_softcapping"))?;
    cfg.final_softcap = positive(m, &format!("{prefix}.final_logit_softcapping"))?;
    cfg.rope_style = RopeStyle::HalfSplit;
    cfg.embed_scale = (cfg.n_embd as f32).sqrt();
    cfg.activation = Activation::GeluTanh;
    cfg.sandwich_norms = true;
    Ok(())
}
