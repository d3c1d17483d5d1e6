//! Gemma 3: GELU(tanh) gate, embeddings scaled by `sqrt(n_embd)`, QK norms,
//! sandwich norms, rotate-half RoPE, and five sliding-window layers (with
//! their own RoPE base) to every full-attention one, whose RoPE may be
//! scaled linearly (4B and larger).

use super::rope_scaling;
use crate::error::{EngineError, Result};
use crate::gguf::Metadata;
use crate::model::config::{Activation, ChatDefaults, Family, ModelConfig, QkNorm, RopeStyle};

/// Sliding window layers: all but every sixth.
const SLIDING_PERIOD: usize = 6;
/// RoPE base of sliding-window layers (no GGUF key carries it).
const LOCAL_ROPE_BASE: f32 = 10_000.0;

/// The chat format, for files that carry no template (the Gemma 3 GGUFs have
/// none): a system message opens the first user turn; the assistant's role
/// is "model".
pub(super) const TEMPLATE: &str = concat!(
    "{{ bos_token }}",
    "{%- set ns = namespace(prefix='') -%}",
    "{%- for m in messages -%}",
    "{%- if m['role'] == 'system' -%}",
    "{%- set ns.prefix = ns.prefix + m['content'] + '\n\n' -%}",
    "{%- else -%}",
    "{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else 'user') + '\n' }}",
    "{%- if m['role'] != 'assistant' -%}{{ ns.prefix }}{%- set ns.prefix = '' -%}{%- endif -%}",
    "{{ m['content'] | trim }}{{ '<end_of_turn>\n' }}",
    "{%- endif -%}",
    "{%- endfor -%}",
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}",
);

pub static FAMILY: Family = Family {
    archs: &["gemma3"],
    hf_model_types: &["gemma3", "gemma3_text"],
    hparams,
    // Gemma 3 4B and larger scale the full-attention layers' RoPE linearly.
    implements: &[
        "attention.sliding_window",
        "attention.query_pre_attn_scalar",
        "rope.scaling.type",
        "rope.scaling.factor",
    ],
    chat: ChatDefaults {
        turn_ends: &["<end_of_turn>"],
        template: Some(TEMPLATE),
    },
};

fn hparams(m: &Metadata, prefix: &str, cfg: &mut ModelConfig) -> Result<()> {
    let window_key = format!("{prefix}.attention.sliding_window");
    let window = m.usize(&window_key)?;
    if window == 0 {
        return Err(EngineError::Model(format!(
            "{window_key}: expected a nonzero window, got 0"
        )));
    }
    // Gemma 3 scales by query_pre_attn_scalar^-1/2, which its checkpoints
    // set to the head size (256 for the 270M model).
    let scalar = m
        .opt(
            &format!("{prefix}.attention.query_pre_attn_scalar"),
            Metadata::f32,
        )?
        .unwrap_or(cfg.head_dim as f32);
    rope_scaling(m, prefix, "gemma3", false, cfg)?;
    cfg.windows = (0..cfg.n_layers)
        .map(|i| (!(i + 1).is_multiple_of(SLIDING_PERIOD)).then_some(window))
        .collect();
    cfg.rope_base_local = LOCAL_ROPE_BASE;
    cfg.rope_style = RopeStyle::HalfSplit;
    cfg.attn_scale = 1.0 / scalar.sqrt();
    cfg.embed_scale = (cfg.n_embd as f32).sqrt();
    cfg.activation = Activation::GeluTanh;
    cfg.qk_norm = QkNorm::PerHead;
    cfg.sandwich_norms = true;
    Ok(())
}
