//! Phi-3 / 3.5 / 4-mini: q, k and v in one matrix and gate and up in
//! another, rotate-half RoPE over the leading `rope.dimension_count`
//! dimensions of a head (all of them in Phi-3, three quarters in
//! Phi-4-mini), and a sliding window over every layer where the file gives
//! one (0 means none).
//!
//! The 128k-context files (Phi-3/3.5 128k, Phi-4-mini) carry LongRoPE:
//! `rope_factors_short`/`_long` tensors and `rope.scaling.attn_factor`.

use super::{positive, window};
use crate::error::{EngineError, Result};
use crate::gguf::Metadata;
use crate::model::config::{ChatDefaults, Family, LongRope, ModelConfig, RopeStyle};

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
    implements: &[
        "attention.sliding_window",
        "rope.scaling.original_context_length",
        "rope.scaling.attn_factor",
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
    // 128k files give a window past the context, which never binds.
    if let Some(w) = window(m, prefix)?.filter(|&w| w < cfg.context_length) {
        cfg.windows = vec![Some(w); cfg.n_layers];
    }
    cfg.sliding_rope_is_global = true;
    // LongRoPE applies where the plan finds the factor tensors.
    let ctx_key = format!("{prefix}.rope.scaling.original_context_length");
    if let Some(original_context) = m.opt(&ctx_key, Metadata::usize)? {
        if original_context == 0 {
            return Err(EngineError::Model(format!(
                "metadata {ctx_key:?}: expected a nonzero context, got 0"
            )));
        }
        // Without the key: the reference's default for the context ratio.
        let scale = cfg.context_length as f64 / original_context as f64;
        let default = if scale > 1.0 {
            (1.0 + scale.ln() / (original_context as f64).ln()).sqrt() as f32
        } else {
            1.0
        };
        let attn_factor =
            positive(m, &format!("{prefix}.rope.scaling.attn_factor"))?.unwrap_or(default);
        cfg.longrope = Some(LongRope {
            original_context,
            attn_factor,
        });
    }
    Ok(())
}
