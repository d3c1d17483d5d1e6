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

mod gemma2;
mod gemma3;
mod granite;
mod llama;
mod olmo2;
mod phi3;
mod qwen2;
mod qwen3;

use super::config::{Activation, Arch, ChatDefaults, Family, ModelConfig, QkNorm, RopeStyle, Yarn};
use crate::error::{EngineError, Result};
use crate::gguf::{Metadata, Value};

/// Every family, looked up by `general.architecture`.
pub static REGISTRY: &[&Family] = &[
    &llama::FAMILY,
    &gemma3::FAMILY,
    &gemma2::FAMILY,
    &qwen2::FAMILY,
    &qwen3::FAMILY,
    &phi3::FAMILY,
    &granite::FAMILY,
    &olmo2::FAMILY,
];

/// Bound on every size read from metadata, so products of two stay far from
/// overflowing (tensor shapes are checked against these sizes afterwards).
const MAX_SIZE: usize = 1 << 24;

// Read beside the registry, whose families fill it.
impl ModelConfig {
    /// The config of an `arch` model from its metadata; `vocab` comes from
    /// the token embedding's shape (Gemma 3 files carry no vocab key).
    /// `Unsupported` for a key that changes the math which the family does
    /// not implement.
    pub fn from_metadata(arch: Arch, m: &Metadata, vocab: usize) -> Result<ModelConfig> {
        let family = arch.family();
        refuse_unimplemented(m, arch.name(), family)?;
        let key = |k: &str| format!("{}.{k}", arch.name());
        let n_layers = m.usize(&key("block_count"))?;
        let n_embd = m.usize(&key("embedding_length"))?;
        let n_head = m.usize(&key("attention.head_count"))?;
        let n_head_kv = m
            .opt(&key("attention.head_count_kv"), Metadata::usize)?
            .unwrap_or(n_head);
        let n_ff = m.usize(&key("feed_forward_length"))?;
        let context_length = m.usize(&key("context_length"))?;
        let eps = m.f32(&key("attention.layer_norm_rms_epsilon"))?;
        let rope_base = m
            .opt(&key("rope.freq_base"), Metadata::f32)?
            .unwrap_or(10_000.0);
        if n_layers == 0 || n_head == 0 || n_head_kv == 0 || n_embd == 0 || n_ff == 0 {
            return Err(EngineError::Model(format!(
                "sizes: expected nonzero block_count, head counts, embedding and feed-forward \
                 lengths, got {n_layers}, {n_head}/{n_head_kv}, {n_embd}, {n_ff}"
            )));
        }
        let sizes = [n_layers, n_embd, n_head, n_head_kv, n_ff, context_length];
        if sizes.iter().any(|&s| s > MAX_SIZE) {
            return Err(EngineError::Model(format!(
                "sizes: expected block_count, embedding_length, head counts, feed_forward_length \
                 and context_length at most {MAX_SIZE}, got {sizes:?}"
            )));
        }
        if !n_head.is_multiple_of(n_head_kv) {
            return Err(EngineError::Model(format!(
                "attention.head_count: expected a multiple of head_count_kv {n_head_kv}, got {n_head}"
            )));
        }
        let head_dim = match m.opt(&key("attention.key_length"), Metadata::usize)? {
            Some(d) => d,
            None if n_embd.is_multiple_of(n_head) => n_embd / n_head,
            None => {
                return Err(EngineError::Model(format!(
                    "head size: embedding_length {n_embd} is not a multiple of head_count {n_head} \
                     and attention.key_length is missing"
                )))
            }
        };
        if let Some(vd) = m.opt(&key("attention.value_length"), Metadata::usize)? {
            if vd != head_dim {
                return Err(EngineError::Unsupported(format!(
                    "attention.value_length: expected the key length {head_dim}, got {vd}"
                )));
            }
        }
        if head_dim == 0 || !head_dim.is_multiple_of(2) || head_dim > MAX_SIZE / n_head {
            return Err(EngineError::Model(format!(
                "head size: expected a nonzero even number with head_count x head size at most \
                 {MAX_SIZE}, got {head_dim}"
            )));
        }
        let rope_dims = m
            .opt(&key("rope.dimension_count"), Metadata::usize)?
            .unwrap_or(head_dim);
        if rope_dims == 0 || !rope_dims.is_multiple_of(2) || rope_dims > head_dim {
            return Err(EngineError::Model(format!(
                "metadata {:?}: expected a nonzero even number at most the head size \
                 {head_dim}, got {rope_dims}",
                key("rope.dimension_count")
            )));
        }
        // The Llama recipe; the family's hparams change what differs.
        let mut cfg = ModelConfig {
            arch,
            n_layers,
            n_embd,
            n_head,
            n_head_kv,
            head_dim,
            n_ff,
            vocab,
            context_length,
            rope_base,
            rope_base_local: rope_base,
            rope_style: RopeStyle::Adjacent,
            eps,
            attn_scale: 1.0 / (head_dim as f32).sqrt(),
            windows: vec![None; n_layers],
            sliding_rope_is_global: false,
            embed_scale: 1.0,
            activation: Activation::Silu,
            qk_norm: QkNorm::None,
            pre_norms: true,
            sandwich_norms: false,
            qkv_bias: false,
            fused_qkv: false,
            fused_gate_up: false,
            rope_dims,
            residual_scale: 1.0,
            logit_scale: 1.0,
            attn_softcap: None,
            final_softcap: None,
            rope_linear: 1.0,
            rope_yarn: None,
            longrope: None,
            rope_freqs: false,
        };
        (family.hparams)(m, arch.name(), &mut cfg)?;
        Ok(cfg)
    }
}

// Beside the registry it searches (the type sits in `config`, below the families).
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

/// An optional positive finite number (a scale, a cap).
fn positive(m: &Metadata, key: &str) -> Result<Option<f32>> {
    match m.opt(key, Metadata::f32)? {
        Some(v) if !(v.is_finite() && v > 0.0) => Err(EngineError::Model(format!(
            "metadata {key:?}: expected a positive number, got {v}"
        ))),
        v => Ok(v),
    }
}

/// The family's sliding window, `None` where the file gives none or 0.
fn window(m: &Metadata, prefix: &str) -> Result<Option<usize>> {
    let w = m.opt(
        &format!("{prefix}.attention.sliding_window"),
        Metadata::usize,
    )?;
    Ok(w.filter(|&w| w > 0))
}

/// The `rope.scaling.*` keys [`rope_scaling`] reads, for a family's `implements`.
const SCALING_KEYS: [&str; 5] = [
    "rope.scaling.type",
    "rope.scaling.factor",
    "rope.scaling.original_context_length",
    "rope.scaling.yarn_beta_fast",
    "rope.scaling.yarn_beta_slow",
];

/// Reads `rope.scaling.type` and `.factor`: a linear factor (a factor
/// without a type is linear, as the reference reads it) sets
/// `cfg.rope_linear`; "yarn" sets `cfg.rope_yarn` (with
/// `original_context_length` and the optional betas); "none" takes no
/// factor; any other type (and "yarn" where `yarn` is false) is refused,
/// naming what `family` implements (llama
/// also reads llama3's `rope_freqs.weight`). YaRN's attention factor and
/// extrapolation mix are not read: their keys are refused.
fn rope_scaling(
    m: &Metadata,
    prefix: &str,
    family: &str,
    yarn: bool,
    cfg: &mut ModelConfig,
) -> Result<()> {
    let type_key = format!("{prefix}.rope.scaling.type");
    let factor_key = format!("{prefix}.rope.scaling.factor");
    let factor = m.opt(&factor_key, Metadata::f32)?;
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
        Some("yarn") if yarn => {
            let f = factor.ok_or_else(|| {
                EngineError::Model(format!(
                    "metadata {type_key:?} = \"yarn\": expected {factor_key:?} too, missing"
                ))
            })?;
            let ctx_key = format!("{prefix}.rope.scaling.original_context_length");
            let original_context = m.usize(&ctx_key)?;
            let beta = |k: &str, default: f32| -> Result<f32> {
                Ok(positive(m, &format!("{prefix}.rope.scaling.{k}"))?.unwrap_or(default))
            };
            if !(f.is_finite() && f >= 1.0) || original_context == 0 {
                return Err(EngineError::Model(format!(
                    "metadata {factor_key:?} and {ctx_key:?}: expected a factor >= 1 and a \
                     nonzero context, got {f} and {original_context}"
                )));
            }
            cfg.rope_yarn = Some(Yarn {
                factor: f,
                original_context,
                beta_fast: beta("yarn_beta_fast", 32.0)?,
                beta_slow: beta("yarn_beta_slow", 1.0)?,
            });
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
            let what = match (family, yarn) {
                ("llama", _) => "\"linear\", \"yarn\" and llama3's rope_freqs.weight",
                (_, true) => "\"linear\" and \"yarn\"",
                _ => "\"linear\"",
            };
            return Err(EngineError::Unsupported(format!(
                "metadata {type_key:?} = {v}: the {family} family implements {what} only"
            )));
        }
    }
    Ok(())
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
