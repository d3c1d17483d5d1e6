//! Phi-3 / 3.5 / 4-mini: q, k and v in one matrix and gate and up in
//! another, rotate-half RoPE over the leading `rope.dimension_count`
//! dimensions of a head (all of them in Phi-3, three quarters in
//! Phi-4-mini), and a sliding window over every layer where the file gives
//! one (0 means none).
//!
//! The 128k-context files' LongRoPE factors (`rope_factors_long` and
//! `_short` tensors) are not in the plan, so those files are refused.

use super::window;
use crate::error::Result;
use crate::gguf::Metadata;
use crate::model::config::{ChatDefaults, Family, ModelConfig, RopeStyle};

/// Phi-3's chat format, for files that carry no template.
const TEMPLATE: &str = concat!(
    "{%- for m in messages -%}",
    "{{ '<|' + m['role'] + '|>\n' + m['content'] + '<|end|>\n' }}",
    "{%- endfor -%}",
    "{%- if add_generation_prompt -%}{{ '<|assistant|>\n' }}{%- endif -%}",
);

pub static FAMILY: Family = Family {
    archs: &["phi3"],
    hf_model_types: &["phi3"],
    hparams,
    // The original context only selects between LongRoPE's factor tensors,
    // which the plan refuses.
    implements: &[
        "attention.sliding_window",
        "rope.scaling.original_context_length",
    ],
    chat: ChatDefaults {
        turn_ends: &["<|end|>", "<|endoftext|>"],
        template: Some(TEMPLATE),
    },
};

fn hparams(m: &Metadata, prefix: &str, cfg: &mut ModelConfig) -> Result<()> {
    cfg.rope_style = RopeStyle::HalfSplit;
    cfg.fused_qkv = true;
    cfg.fused_gate_up = true;
    if let Some(w) = window(m, prefix)? {
        cfg.windows = vec![Some(w); cfg.n_layers];
    }
    Ok(())
}
