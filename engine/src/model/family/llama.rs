//! Llama and the models converted as Llama (SmolLM2, Mistral): SiLU gate,
//! one RoPE base with adjacent pairs, no extra norms; RoPE scaling by
//! `rope_freqs.weight` (llama3) or `rope.scaling.type = linear`.

use super::linear_scaling;
use crate::error::Result;
use crate::gguf::Metadata;
use crate::model::config::{ChatDefaults, Family, ModelConfig};

pub static FAMILY: Family = Family {
    archs: &["llama"],
    hf_model_types: &["llama"],
    hparams,
    // original_context_length only matters to YaRN, which the type refuses.
    implements: &[
        "rope.scaling.type",
        "rope.scaling.factor",
        "rope.scaling.original_context_length",
        "rope.scaling.finetuned",
    ],
    chat: ChatDefaults {
        turn_ends: &["<|im_end|>", "<|eot_id|>", "<|endoftext|>"],
        template: None,
    },
};

fn hparams(m: &Metadata, prefix: &str, cfg: &mut ModelConfig) -> Result<()> {
    linear_scaling(m, prefix, "llama", cfg)?;
    cfg.rope_freqs = true;
    Ok(())
}
