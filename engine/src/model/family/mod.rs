//! The model families the engine runs, one file each, and the checks that
//! keep a file from running as a model it is not.
//!
//! A [`Family`] says which `general.architecture` names it reads, how its
//! hyper-parameters fill the shared [`ModelConfig`] (the knobs the one
//! forward reads: embedding scale, activation, QK and sandwich norms, RoPE
//! pairing, bases and scaling, sliding windows, attention scale), which
//! metadata keys that change the math it implements, and its chat defaults.
//! The tensor plan follows from the knobs ([`super::weights`]): every tensor
//! in a file must be one the plan consumes.
//!
//! Adding a family: a new file here defining a `pub static FAMILY: Family`
//! (its `hparams` sets the knobs from the family's keys), then one line in
//! [`REGISTRY`] and one `mod` line below. Any knob the forward lacks is a new
//! `ModelConfig` field that every other family leaves at its default.

mod gemma3;
mod llama;

use super::config::ModelConfig;
use crate::error::{EngineError, Result};
use crate::gguf::{Metadata, Value};
use std::fmt;

/// Every family, looked up by `general.architecture`.
pub static REGISTRY: &[&Family] = &[&llama::FAMILY, &gemma3::FAMILY];

/// What a family's chat format needs from the engine's users.
#[derive(Debug, PartialEq, Eq)]
pub struct ChatDefaults {
    /// Pieces that end an assistant turn: generation stops at them as at eos.
    pub turn_ends: &'static [&'static str],
    /// A chat template (Jinja) for files that carry none.
    pub template: Option<&'static str>,
}

/// One model family.
pub struct Family {
    /// The `general.architecture` values (and metadata key prefixes) it reads.
    pub archs: &'static [&'static str],
    /// Hugging Face `model_type` values of the same models (for the chat
    /// defaults of a model run through transformers).
    pub hf_model_types: &'static [&'static str],
    /// Sets the family's knobs on `cfg` (whose shared sizes are read, and
    /// whose knobs start at the Llama defaults) from the keys `{prefix}.*`.
    pub hparams: fn(m: &Metadata, prefix: &str, cfg: &mut ModelConfig) -> Result<()>,
    /// Keys (after `{prefix}.`) from [`MATH_KEYS`] or `rope.scaling.*` that
    /// `hparams` reads and implements; any other such key is refused.
    pub implements: &'static [&'static str],
    pub chat: ChatDefaults,
}

/// A family as a file names it: `name` is the file's `general.architecture`.
#[derive(Clone, Copy)]
pub struct Arch {
    name: &'static str,
    family: &'static Family,
}

impl Arch {
    /// The family of `general.architecture` `name`; `Unsupported` for none.
    pub fn parse(name: &str) -> Result<Arch> {
        for &family in REGISTRY {
            if let Some(&n) = family.archs.iter().find(|&&a| a == name) {
                return Ok(Arch { name: n, family });
            }
        }
        let known: Vec<&str> = REGISTRY
            .iter()
            .flat_map(|f| f.archs.iter().copied())
            .collect();
        Err(EngineError::Unsupported(format!(
            "architecture: expected one of {known:?}, got {name:?}"
        )))
    }

    /// The metadata key prefix and `general.architecture` value.
    pub fn name(self) -> &'static str {
        self.name
    }

    pub fn family(self) -> &'static Family {
        self.family
    }
}

impl PartialEq for Arch {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

impl Eq for Arch {}

impl fmt::Debug for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Arch({:?})", self.name)
    }
}

/// The chat defaults of the family an architecture or Hugging Face
/// `model_type` names; `None` for no known family.
pub fn chat_defaults(name: &str) -> Option<&'static ChatDefaults> {
    REGISTRY
        .iter()
        .find(|f| f.archs.contains(&name) || f.hf_model_types.contains(&name))
        .map(|f| &f.chat)
}

/// Every family's turn-end pieces, once each (for a tokenizer whose family
/// is unknown).
pub fn all_turn_ends() -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for p in REGISTRY.iter().flat_map(|f| f.chat.turn_ends.iter()) {
        if !out.contains(p) {
            out.push(p);
        }
    }
    out
}

/// What a key's value must be for the key to change nothing.
#[derive(Clone, Copy)]
enum Neutral {
    /// Any value changes the math.
    None,
    Zero,
    One,
}

/// Keys (after `{arch}.`) that change the math when present: a family that
/// does not list one in [`Family::implements`] refuses it (unless its value
/// is neutral). Every `rope.scaling.*` key is treated the same way.
const MATH_KEYS: &[(&str, Neutral)] = &[
    ("attn_logit_softcapping", Neutral::None),
    ("final_logit_softcapping", Neutral::None),
    ("expert_count", Neutral::Zero),
    ("expert_used_count", Neutral::Zero),
    ("expert_shared_count", Neutral::Zero),
    ("embedding_scale", Neutral::One),
    ("residual_scale", Neutral::One),
    ("logit_scale", Neutral::One),
    ("attention.scale", Neutral::None),
    ("attention.sliding_window", Neutral::None),
    ("attention.sliding_window_pattern", Neutral::None),
    ("attention.query_pre_attn_scalar", Neutral::None),
];

/// The value as the refusal prints it.
pub fn shown(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{:?}", s.chars().take(40).collect::<String>()),
        Value::Array(a) => format!("an array of {}", a.len()),
        Value::Bool(b) => b.to_string(),
        Value::F32(x) => x.to_string(),
        Value::F64(x) => x.to_string(),
        other => other
            .as_i64()
            .map_or_else(|| format!("{other:?}"), |x| x.to_string()),
    }
}

/// `Unsupported` for the first key of `m` under `{prefix}.` that changes the
/// math and that `family` does not implement.
pub fn refuse_unimplemented(m: &Metadata, prefix: &str, family: &Family) -> Result<()> {
    let Some(arch) = family.archs.iter().find(|&&a| a == prefix) else {
        return Ok(());
    };
    let head = format!("{arch}.");
    for (key, v) in m.entries.range(head.clone()..) {
        let Some(suffix) = key.strip_prefix(&head) else {
            break;
        };
        let neutral = match MATH_KEYS.iter().find(|(k, _)| *k == suffix) {
            Some(&(_, n)) => n,
            None if suffix.starts_with("rope.scaling.") => Neutral::None,
            None => continue,
        };
        if family.implements.contains(&suffix) {
            continue;
        }
        let is_neutral = match neutral {
            Neutral::None => false,
            Neutral::Zero => v.as_f64() == Some(0.0),
            Neutral::One => v.as_f64() == Some(1.0),
        };
        if !is_neutral {
            return Err(EngineError::Unsupported(format!(
                "metadata {key:?} = {}: the {arch} family does not implement it (running without \
                 it would compute a different model)",
                shown(v)
            )));
        }
    }
    Ok(())
}
