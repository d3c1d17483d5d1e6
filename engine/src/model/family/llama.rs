//! Llama and the models converted as Llama (SmolLM2, Mistral): SiLU gate,
//! one RoPE base with adjacent pairs, no extra norms; RoPE scaling by
//! `rope_freqs.weight` (llama3) or `rope.scaling.type = linear`.

use super::shown;
use crate::error::{EngineError, Result};
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
    let type_key = format!("{prefix}.rope.scaling.type");
    let factor_key = format!("{prefix}.rope.scaling.factor");
    let factor = m.opt(&factor_key, Metadata::f32)?;
    // As llama.cpp reads it: a factor without a type is linear.
    let scaling = match m.get(&type_key) {
        Some(_) => Some(m.str(&type_key)?),
        None => None,
    };
    match scaling {
        None | Some("linear") => {
            if let Some(f) = factor {
                if !(f.is_finite() && f > 0.0) {
                    return Err(EngineError::Model(format!(
                        "metadata {factor_key:?}: expected a positive factor, got {f}"
                    )));
                }
                cfg.rope_linear = f;
            }
        }
        Some("none") => {
            if let Some(f) = factor.filter(|&f| f != 1.0) {
                return Err(EngineError::Unsupported(format!(
                    "metadata {factor_key:?} = {f} with {type_key:?} = \"none\": a scaling \
                     factor without a scaling"
                )));
            }
        }
        Some(other) => {
            let v = m.get(&type_key).map_or_else(|| format!("{other:?}"), shown);
            return Err(EngineError::Unsupported(format!(
                "metadata {type_key:?} = {v}: the llama family implements \"linear\" and \
                 llama3's rope_freqs.weight only"
            )));
        }
    }
    cfg.rope_freqs = true;
    Ok(())
}
