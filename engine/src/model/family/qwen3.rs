//! Qwen 3 (dense): the Llama layer with a per-head RMSNorm of q and k before
//! rotate-half RoPE, no biases, ChatML.

use super::qwen2::CHATML;
use crate::error::Result;
use crate::gguf::Metadata;
use crate::model::config::{ChatDefaults, Family, ModelConfig, QkNorm, RopeStyle};

pub static FAMILY: Family = Family {
    archs: &["qwen3"],
    hf_model_types: &["qwen3"],
    hparams,
    implements: &[],
    chat: ChatDefaults {
        turn_ends: &["<|im_end|>", "<|endoftext|>"],
        template: Some(CHATML),
    },
};

fn hparams(_m: &Metadata, _prefix: &str, cfg: &mut ModelConfig) -> Result<()> {
    cfg.rope_style = RopeStyle::HalfSplit;
    cfg.qk_norm = QkNorm::PerHead;
    Ok(())
}
