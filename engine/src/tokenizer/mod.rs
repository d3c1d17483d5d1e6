//! The tokenizer, built from the GGUF's own metadata (no `tokenizer.json`).
//!
//! It reproduces the tokenizer transformers builds from the same file
//! (`AutoTokenizer.from_pretrained(dir, gguf_file=...)`): byte-level BPE for
//! `tokenizer.ggml.model = "gpt2"` files, split by the pattern
//! `tokenizer.ggml.pre` names (GPT-2's, Llama 3's, Qwen's, GPT-4o's...), and
//! SentencePiece-style BPE with byte fallback for `"llama"` files (Llama 2,
//! Mistral, Phi-3, Gemma), with the dummy prefix `tokenizer.ggml.add_space_prefix`
//! asks for as SentencePiece itself adds it. Added tokens (control,
//! user-defined and the named special tokens) are matched in the text before
//! the model runs.

mod added;
mod bpe;
mod byte_level;
mod metadata;
mod pretokenize;
mod sentencepiece;
mod vocab;

use crate::error::{EngineError, Result};
use crate::gguf::Metadata;
use added::{AddedTokens, Part};
use byte_level::ByteLevel;
use sentencepiece::SentencePiece;
use std::collections::HashMap;
use std::fmt;
use vocab::Vocab;

enum Model {
    ByteLevel(ByteLevel),
    SentencePiece(SentencePiece),
}

/// A GGUF model's tokenizer: text ↔ token ids.
pub struct Tokenizer {
    model: Model,
    kind: &'static str,
    /// Each id's spelling inside the model (byte alphabet, or `▁` for spaces),
    /// and spelling → id (on a repeated spelling the last id wins, as in the reference).
    vocab: Vocab,
    added: AddedTokens,
    /// Added tokens whose text differs from their model spelling.
    added_text: HashMap<u32, String>,
    special: Vec<bool>,
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    chat_template: Option<String>,
}

impl fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tokenizer")
            .field("kind", &self.kind)
            .field("vocab_size", &self.vocab.len())
            .field("added", &self.added.len())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("add_bos", &self.add_bos)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Builds the tokenizer a file's metadata describes.
    ///
    /// `Unsupported` for a `tokenizer.ggml.model` this crate does not build;
    /// `Model` for a missing or mistyped key, arrays of inconsistent lengths,
    /// or ids out of range.
    pub fn from_metadata(meta: &Metadata) -> Result<Tokenizer> {
        metadata::build(meta)
    }

    /// The ids of `text`, as the reference `tok(text, add_special_tokens=add_special)`.
    /// Added and special tokens written in the text become their ids either way;
    /// `add_special` adds BOS (and EOS) when the file asks for them.
    pub fn encode(&self, text: &str, add_special: bool) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            out.extend(self.bos);
        }
        self.added.split(text, &mut |part| match part {
            Part::Token(id) => out.push(id),
            Part::Text(t) => match &self.model {
                Model::ByteLevel(m) => m.encode(t, &mut out),
                Model::SentencePiece(m) => m.encode(t, &self.vocab, &mut out),
            },
        });
        if add_special && self.add_eos {
            out.extend(self.eos);
        }
        out
    }

    /// The text of `ids`; `skip_special` leaves out special tokens.
    /// `InvalidArgument` for an id outside the vocabulary.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        if let Some((at, &id)) = ids
            .iter()
            .enumerate()
            .find(|&(_, &id)| id as usize >= self.vocab.len())
        {
            return Err(self.out_of_range(id, Some(at)));
        }
        let kept = ids
            .iter()
            .filter(|&&id| !(skip_special && self.is_special(id)))
            .filter_map(|&id| self.text_of(id));
        Ok(match &self.model {
            Model::ByteLevel(m) => {
                let bytes: Vec<u8> = kept
                    .flat_map(|p| byte_level::unspell(p, &m.alphabet))
                    .collect();
                String::from_utf8_lossy(&bytes).into_owned()
            }
            Model::SentencePiece(m) => {
                let text = sentencepiece::decode(kept);
                // The dummy prefix comes off again, as the reference decoder strips one leading space.
                match text.strip_prefix(' ') {
                    Some(rest) if m.dummy_prefix() => rest.to_string(),
                    _ => text,
                }
            }
        })
    }

    /// The raw bytes token `id` stands for (a byte token's single byte; a
    /// byte-level token's bytes), for decoders that join bytes before UTF-8.
    pub fn token_bytes(&self, id: u32) -> Result<Vec<u8>> {
        let text = self
            .text_of(id)
            .ok_or_else(|| self.out_of_range(id, None))?;
        Ok(match &self.model {
            Model::ByteLevel(m) => byte_level::unspell(text, &m.alphabet),
            Model::SentencePiece(_) => sentencepiece::piece_bytes(text),
        })
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab.len()
    }

    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// The id of a token as the file spells it, e.g. `"<end_of_turn>"`.
    pub fn token_id(&self, piece: &str) -> Option<u32> {
        if let Some(id) = self.vocab.get(piece) {
            return Some(id);
        }
        if let Some((&id, _)) = self.added_text.iter().find(|(_, t)| t.as_str() == piece) {
            return Some(id);
        }
        let spelled = match &self.model {
            Model::ByteLevel(m) => {
                byte_level::spell(piece, &m.alphabet, &byte_level::byte_to_char())
            }
            Model::SentencePiece(_) => sentencepiece::respell(piece),
        };
        self.vocab.get(&spelled)
    }

    /// Whether `id` is a special token (left out by `decode(.., true)`).
    pub fn is_special(&self, id: u32) -> bool {
        self.special.get(id as usize).copied().unwrap_or(false)
    }

    /// Whether `encode(.., true)` starts with BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos && self.bos.is_some()
    }

    /// `tokenizer.chat_template` as stored, when the file has one.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// `"gpt2"` (byte-level BPE) or `"llama"` (SentencePiece-style BPE).
    pub fn model_kind(&self) -> &str {
        self.kind
    }

    /// What the decoder reads for `id`: an added token's text, else its model spelling.
    fn text_of(&self, id: u32) -> Option<&str> {
        match self.added_text.get(&id) {
            Some(t) => Some(t),
            None => self.vocab.piece(id),
        }
    }

    fn out_of_range(&self, id: u32, at: Option<usize>) -> EngineError {
        let at = at.map(|i| format!(" at index {i}")).unwrap_or_default();
        EngineError::InvalidArgument(format!(
            "token id {id}{at} is not below the vocabulary size {}",
            self.vocab.len()
        ))
    }
}
