//! Granite (3.x dense): the Llama layer with four multipliers: of the
//! embeddings, of each block's output before its residual add, of `q·k`
//! (instead of `1/sqrt(head_dim)`), and a divisor of the logits.

use super::positive;
use crate::error::Result;
use crate::gguf::Metadata;
use crate::model::config::{ChatDefaults, Family, ModelConfig};

/// Granite 3's chat format, for files that carry no template.
const TEMPLATE: &str = concat!(
    "{%- for m in messages -%}",
    "{{ '<|start_of_role|>' + m['role'] + '<|end_of_role|>' + m['content'] + '<|end_of_text|>\n' }}",
    "{%- endfor -%}",
    "{%- if add_generation_prompt -%}{{ '<|start_of_role|>assistant<|end_of_role|>' }}{%- endif -%}",
);

pub static FAMILY: Family = Family {
    archs: &["granite"],
    hf_model_types: &["granite"],
    hparams,
    implements: &[
        "embedding_scale",
        "residual_scale",
        "attention.scale",
        "logit_scale",
    ],
    chat: ChatDefaults {
        turn_ends: &["<|end_of_text|>"],
        template: Some(TEMPLATE),
    },
};

fn hparams(m: &Metadata, prefix: &str, cfg: &mut ModelConfig) -> Result<()> {
    let key = |k: &str| format!("{prefix}.{k}");
    if let Some(s) = positive(m, &key("embedding_scale"))? {
        cfg.embed_scale = s;
    }
    if let Some(s) = positive(m, &key("residual_scale"))? {
        cfg.residual_scale = s;
    }
    if let Some(s) = positive(m, &key("attention.scale"))? {
        cfg.attn_scale = s;
    }
    if let Some(s) = positive(m, &key("logit_scale"))? {
        cfg.logit_scale = s;
    }
    Ok(())
}
