//! Qwen 3 (dense): the Llama layer with a per-head RMSNorm of q and k before
//! rotate-half RoPE, no biases, ChatML.

use super::qwen2::CHATML;
use super::{rope_scaling, SCALING_KEYS};
use crate::error::Result;
use crate::gguf::Metadata;
use crate::model::config::{ChatDefaults, Family, ModelConfig, QkNorm, RopeStyle};

pub static FAMILY: Family = Family {
    archs: &["qwen3"],
    hf_model_types: &["qwen3"],
    hparams,
    // Qwen 2.5 and Qwen 3 reach 128k tokens with YaRN where the file says so.
    implements: &SCALING_KEYS,
    chat: ChatDefaults {
        turn_ends: &["<|im_end|>", "<|endoftext|>"],
        template: Some(CHATML),
    },
};

fn hparams(m: &Metadata, prefix: &str, cfg: &mut ModelConfig) -> Result<()> {
    rope_scaling(m, prefix, "qwen3", true, cfg)?;
    cfg.rope_style = RopeStyle::HalfSplit;
    cfg.qk_norm = QkNorm::PerHead;
    Ok(())
}
