//! Reading a tokenizer out of GGUF metadata (`tokenizer.ggml.*`), checked:
//! every array must have the vocabulary's length and every id must be in it.

use super::added::AddedTokens;
use super::byte_level::{self, ByteLevel};
use super::pretokenize::Split;
use super::sentencepiece::{self, Order, SentencePiece};
use super::vocab::Vocab;
use super::{Model, Tokenizer};
use crate::error::{EngineError, Result};
use crate::gguf::{Metadata, Value};
use std::collections::HashMap;

const MODEL: &str = "tokenizer.ggml.model";
const TOKENS: &str = "tokenizer.ggml.tokens";
const TYPES: &str = "tokenizer.ggml.token_type";
const SCORES: &str = "tokenizer.ggml.scores";
const MERGES: &str = "tokenizer.ggml.merges";
const PRE: &str = "tokenizer.ggml.pre";
const SPACE_PREFIX: &str = "tokenizer.ggml.add_space_prefix";

/// `tokenizer.ggml.token_type` values that matter here.
const CONTROL: i64 = 3;
const USER_DEFINED: i64 = 4;

/// An optional string key, borrowed from the metadata.
fn opt_str<'m>(meta: &'m Metadata, key: &str) -> Result<Option<&'m str>> {
    match meta.get(key) {
        Some(_) => meta.str(key).map(Some),
        None => Ok(None),
    }
}

fn strings<'m>(meta: &'m Metadata, key: &str) -> Result<Vec<&'m str>> {
    meta.array(key)?
        .iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_str().ok_or_else(|| {
                EngineError::Model(format!(
                    "metadata {key:?}[{i}]: expected a string, got {v:?}"
                ))
            })
        })
        .collect()
}

/// An optional per-token array: absent, or exactly `n` values `f` accepts.
fn per_token<T>(
    meta: &Metadata,
    key: &str,
    n: usize,
    want: &str,
    f: impl Fn(&Value) -> Option<T>,
) -> Result<Option<Vec<T>>> {
    if meta.get(key).is_none() {
        return Ok(None);
    }
    let arr = meta.array(key)?;
    if arr.len() != n {
        return Err(EngineError::Model(format!(
            "metadata {key:?}: {} values for {n} tokens",
            arr.len()
        )));
    }
    arr.iter()
        .enumerate()
        .map(|(i, v)| {
            f(v).ok_or_else(|| {
                EngineError::Model(format!("metadata {key:?}[{i}]: expected {want}, got {v:?}"))
            })
        })
        .collect::<Result<Vec<T>>>()
        .map(Some)
}

/// An optional token id key, which must name a token.
fn token_id(meta: &Metadata, name: &str, n: usize) -> Result<Option<u32>> {
    let key = format!("tokenizer.ggml.{name}_token_id");
    let Some(id) = meta.opt(&key, |m, k| m.u64(k))? else {
        return Ok(None);
    };
    match u32::try_from(id) {
        Ok(id) if (id as usize) < n => Ok(Some(id)),
        _ => Err(EngineError::Model(format!(
            "metadata {key:?}: token id {id} is not below the vocabulary size {n}"
        ))),
    }
}

pub(super) fn build(meta: &Metadata) -> Result<Tokenizer> {
    let kind = match meta.str(MODEL)? {
        "gpt2" => "gpt2",
        "llama" => "llama",
        other => {
            return Err(EngineError::Unsupported(format!(
                "metadata {MODEL:?} = {other:?}: only \"gpt2\" and \"llama\" tokenizers are built"
            )))
        }
    };
    // Gemma's sentencepiece files differ in two defaults the reference keys on
    // the architecture: merges follow token positions, and no dummy prefix.
    let gemma = kind == "llama"
        && opt_str(meta, "general.architecture")?.is_some_and(|a| a.starts_with("gemma"));
    let pre = opt_str(meta, PRE)?;
    let stored = strings(meta, TOKENS)?;
    let n = stored.len();
    if n == 0 || u32::try_from(n).is_err() {
        return Err(EngineError::Model(format!(
            "metadata {TOKENS:?}: {n} tokens"
        )));
    }
    let types = per_token(meta, TYPES, n, "an integer", Value::as_i64)?;
    // Unused by the Gemma merge order, but a file whose scores do not match its tokens is broken.
    let scores = per_token(meta, SCORES, n, "a number", Value::as_f64)?;
    let (bos, eos) = (token_id(meta, "bos", n)?, token_id(meta, "eos", n)?);
    let (unk, pad) = (token_id(meta, "unknown", n)?, token_id(meta, "padding", n)?);
    let add_bos = meta
        .opt("tokenizer.ggml.add_bos_token", |m, k| m.bool(k))?
        .unwrap_or(kind == "llama");
    let add_eos = meta
        .opt("tokenizer.ggml.add_eos_token", |m, k| m.bool(k))?
        .unwrap_or(false);
    let chat_template = opt_str(meta, "tokenizer.chat_template")?.map(str::to_string);

    let table = byte_level::byte_to_char();
    let alphabet: HashMap<char, u8> = table.iter().zip(0u8..=255).map(|(&c, b)| (c, b)).collect();
    let vocab = match kind {
        "gpt2" => Vocab::new(
            stored
                .iter()
                .map(|t| byte_level::spell(t, &alphabet, &table)),
        ),
        _ => Vocab::new(stored.iter().map(|t| sentencepiece::respell(t))),
    };
    let vocab = vocab.ok_or_else(|| {
        EngineError::Model(format!(
            "metadata {TOKENS:?}: more token text than 32-bit offsets address"
        ))
    })?;

    // Added tokens, in the order the reference adds them: the named special
    // tokens, then control tokens (special), then user-defined ones (not special).
    let mut special = vec![false; n];
    let mut added = AddedTokens::new();
    let mut added_text = HashMap::new();
    let mut add = |text: &str, own: u32, is_special: bool| {
        let id = vocab.get(text).unwrap_or(own);
        added.insert(text, id);
        if let Some(s) = special.get_mut(id as usize) {
            *s |= is_special;
        }
        if vocab.piece(id).is_some_and(|p| p != text) {
            added_text.entry(id).or_insert_with(|| text.to_string());
        }
    };
    let mut named: Vec<u32> = [bos, eos, unk, pad].into_iter().flatten().collect();
    if gemma {
        // Gemma's tokenizer class names "<mask>" as its mask token.
        named.extend(vocab.get("<mask>"));
    }
    for id in named {
        if let Some(t) = stored.get(id as usize) {
            add(t, id, true);
        }
    }
    let type_of = |id: usize| types.as_ref().and_then(|t| t.get(id).copied());
    for (id, t) in (0u32..).zip(&stored) {
        // In a byte-level vocabulary a control token outside the byte alphabet is a
        // mislabelled plain token; the reference leaves it out.
        let spelled = kind != "gpt2" || t.chars().all(|c| alphabet.contains_key(&c));
        if type_of(id as usize) == Some(CONTROL) && spelled {
            add(t, id, true);
        }
    }
    for (id, t) in (0u32..).zip(&stored) {
        if type_of(id as usize) == Some(USER_DEFINED) && vocab.contains(t) {
            add(t, id, false);
        }
    }

    let model = match kind {
        "gpt2" => {
            let merges = strings(meta, MERGES)?;
            let split = Split::named(pre)?;
            Model::ByteLevel(ByteLevel::new(split, &vocab, &merges, alphabet, &table)?)
        }
        _ => {
            let order = match (gemma, scores) {
                (true, _) => Order::Position,
                (false, Some(scores)) => Order::by_score(&scores),
                (false, None) => {
                    return Err(EngineError::Model(format!(
                        "metadata {SCORES:?} is missing: a sentencepiece vocabulary merges by score"
                    )))
                }
            };
            let prefix = meta.opt(SPACE_PREFIX, |m, k| m.bool(k))?.unwrap_or(!gemma);
            Model::SentencePiece(SentencePiece::new(&vocab, unk, prefix, order))
        }
    };
    Ok(Tokenizer {
        model,
        kind,
        vocab,
        added,
        added_text,
        special,
        bos,
        eos,
        add_bos,
        add_eos,
        chat_template,
    })
}
