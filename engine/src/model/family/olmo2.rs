//! OLMo 2: no norms before attention and feed-forward, RMSNorms of their
//! outputs before the residual adds instead, q and k normalised over the
//! whole projection (not per head), rotate-half RoPE. OLMo 3 files (the
//! same architecture name) add sliding windows with a per-layer pattern.

use super::window;
use crate::error::{EngineError, Result};
use crate::gguf::Metadata;
use crate::model::config::{ChatDefaults, Family, ModelConfig, QkNorm, RopeStyle};

pub static FAMILY: Family = Family {
    archs: &["olmo2"],
    hf_model_types: &["olmo2", "olmo3"],
    hparams,
    implements: &[
        "attention.sliding_window",
        "attention.sliding_window_pattern",
    ],
    chat: ChatDefaults {
        turn_ends: &["<|endoftext|>", "<|im_end|>"],
        template: None,
    },
};

fn hparams(m: &Metadata, prefix: &str, cfg: &mut ModelConfig) -> Result<()> {
    cfg.rope_style = RopeStyle::HalfSplit;
    cfg.pre_norms = false;
    cfg.sandwich_norms = true;
    cfg.qk_norm = QkNorm::Whole;
    let pattern_key = format!("{prefix}.attention.sliding_window_pattern");
    let pattern = match m.get(&pattern_key) {
        None => None,
        Some(_) => Some(
            m.array(&pattern_key)?
                .iter()
                .map(|v| v.as_bool())
                .collect::<Option<Vec<bool>>>()
                .filter(|p| p.len() == cfg.n_layers)
                .ok_or_else(|| {
                    EngineError::Model(format!(
                        "metadata {pattern_key:?}: expected {} booleans (one per layer)",
                        cfg.n_layers
                    ))
                })?,
        ),
    };
    match (window(m, prefix)?, pattern) {
        (Some(w), Some(p)) => cfg.windows = p.iter().map(|&s| s.then_some(w)).collect(),
        (Some(w), None) => cfg.windows = vec![Some(w); cfg.n_layers],
        (None, Some(p)) if p.iter().any(|&s| s) => {
            return Err(EngineError::Model(format!(
                "metadata {pattern_key:?}: sliding layers without a window"
            )))
        }
        _ => {}
    }
    Ok(())
}
