//! Qwen 2 / 2.5 (and the DeepSeek-R1 Qwen distills): the Llama layer with
//! biases on q, k and v, rotate-half RoPE (the converter keeps Hugging
//! Face's row order), ChatML.

use super::{rope_scaling, SCALING_KEYS};
use crate::error::Result;
use crate::gguf::Metadata;
use crate::model::config::{ChatDefaults, Family, ModelConfig, RopeStyle};

/// ChatML, for files that carry no template.
pub(super) const CHATML: &str = concat!(
    "{%- for m in messages -%}",
    "{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}",
    "{%- endfor -%}",
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\n' }}{%- endif -%}",
);

pub static FAMILY: Family = Family {
    archs: &["qwen2"],
    hf_model_types: &["qwen2"],
    hparams,
    // Qwen 2.5 and Qwen 3 reach 128k tokens with YaRN where the file says so.
    implements: &SCALING_KEYS,
    chat: ChatDefaults {
        turn_ends: &["<|im_end|>", "<|endoftext|>"],
        template: Some(CHATML),
    },
};

fn hparams(m: &Metadata, prefix: &str, cfg: &mut ModelConfig) -> Result<()> {
    rope_scaling(m, prefix, "qwen2", true, cfg)?;
    cfg.rope_style = RopeStyle::HalfSplit;
    cfg.qkv_bias = true;
    Ok(())
}
