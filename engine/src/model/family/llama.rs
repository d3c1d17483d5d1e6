//! Llama and the models converted as Llama (SmolLM2, Mistral): SiLU gate,
//! one RoPE base with adjacent pairs, no extra norms; RoPE scaling by
//! `rope_freqs.weight` (llama3) or `rope.scaling.type` linear or yarn.

use super::{rope_scaling, SCALING_KEYS};
use crate::error::Result;
use crate::gguf::Metadata;
use crate::model::config::{ChatDefaults, Family, ModelConfig};

pub static FAMILY: Family = Family {
    archs: &["llama"],
    hf_model_types: &["llama"],
    hparams,
    implements: &[
        SCALING_KEYS[0],
        SCALING_KEYS[1],
        SCALING_KEYS[2],
        SCALING_KEYS[3],
        SCALING_KEYS[4],
        "rope.scaling.finetuned",
    ],
    chat: ChatDefaults {
        turn_ends: &["<|im_end|>", "<|eot_id|>", "<|endoftext|>"],
        template: None,
    },
};

fn hparams(m: &Metadata, prefix: &str, cfg: &mut ModelConfig) -> Result<()> {
    rope_scaling(m, prefix, "llama", true, cfg)?;
    cfg.rope_freqs = true;
    Ok(())
}
