//! Qwen 2 / 2.5 (and the DeepSeek-R1 Qwen distills): the Llama layer with
//! biases on q, k and v, rotate-half RoPE (the converter keeps Hugging
//! Face's row order), ChatML.

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
    implements: &[],
    chat: ChatDefaults {
        turn_ends: &["<|im_end|>", "<|endoftext|>"],
        template: Some(CHATML),
    },
};

fn hparams(_m: &Metadata, _prefix: &str, cfg: &mut ModelConfig) -> Result<()> {
    cfg.rope_style = RopeStyle::HalfSplit;
    cfg.qkv_bias = true;
    Ok(())
}
