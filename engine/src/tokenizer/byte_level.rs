//! Byte-level BPE (GPT-2 style, `tokenizer.ggml.model = "gpt2"`): text is
//! split by the pattern `tokenizer.ggml.pre` names, each piece's UTF-8 bytes are spelled in a
//! 256-character alphabet, and the file's merges apply in their listed order.

use super::bpe::merge_word;
use super::pretokenize::Split;
use super::vocab::Vocab;
use crate::error::{EngineError, Result};
use std::collections::HashMap;

/// The GPT-2 byte alphabet: printable Latin-1 bytes stand for themselves, the
/// other 68 bytes take the code points from U+0100 up, in byte order.
pub(crate) fn byte_to_char() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for (b, slot) in table.iter_mut().enumerate() {
        let printable = matches!(b, 33..=126 | 161..=172 | 174..=255);
        let code = if printable {
            b as u32
        } else {
            next += 1;
            next - 1
        };
        *slot = char::from_u32(code).unwrap_or('\0');
    }
    table
}

/// A token spelled in the alphabet, or its UTF-8 bytes spelled there when it
/// uses any other character (the reference converter respells those).
pub(crate) fn spell(token: &str, alphabet: &HashMap<char, u8>, table: &[char; 256]) -> String {
    if token.chars().all(|c| alphabet.contains_key(&c)) {
        token.to_string()
    } else {
        token
            .bytes()
            .filter_map(|b| table.get(usize::from(b)))
            .collect()
    }
}

/// The raw bytes a spelled piece stands for; a piece with a character outside
/// the alphabet stands for its own UTF-8 bytes.
pub(crate) fn unspell(piece: &str, alphabet: &HashMap<char, u8>) -> Vec<u8> {
    let bytes: Option<Vec<u8>> = piece.chars().map(|c| alphabet.get(&c).copied()).collect();
    bytes.unwrap_or_else(|| piece.as_bytes().to_vec())
}

/// The byte-level model: the single-byte tokens and the merge table.
#[derive(Debug, Clone)]
pub(crate) struct ByteLevel {
    split: Split,
    /// The token of each byte's alphabet character, when the vocabulary has it.
    byte_ids: [Option<u32>; 256],
    /// `(left << 32 | right)` → (rank, merged id).
    merges: HashMap<u64, (u32, u32)>,
    pub(crate) alphabet: HashMap<char, u8>,
}

impl ByteLevel {
    /// `merges` are `"left right"` strings over the spelled vocabulary `vocab`;
    /// `split` cuts text into the pieces the merges apply within.
    pub(crate) fn new(
        split: Split,
        vocab: &Vocab,
        merges: &[&str],
        alphabet: HashMap<char, u8>,
        table: &[char; 256],
    ) -> Result<ByteLevel> {
        let mut byte_ids = [None; 256];
        for (slot, c) in byte_ids.iter_mut().zip(table.iter()) {
            *slot = vocab.get(c.encode_utf8(&mut [0; 4]));
        }
        let mut map = HashMap::with_capacity(merges.len());
        let mut joined = String::new();
        for (rank, m) in merges.iter().enumerate() {
            let bad = |why: &str| {
                EngineError::Model(format!("tokenizer.ggml.merges[{rank}] = {m:?}: {why}"))
            };
            let mut parts = m.split(' ');
            let (Some(a), Some(b), None) = (parts.next(), parts.next(), parts.next()) else {
                return Err(bad("not two pieces separated by one space"));
            };
            let id = |p: &str| {
                vocab
                    .get(p)
                    .ok_or_else(|| bad(&format!("{p:?} is not a token")))
            };
            joined.clear();
            joined.push_str(a);
            joined.push_str(b);
            let (ia, ib, new) = (id(a)?, id(b)?, id(&joined)?);
            let rank = u32::try_from(rank).map_err(|_| bad("too many merges"))?;
            // A repeated pair keeps its last rank, as the reference table does.
            map.insert(u64::from(ia) << 32 | u64::from(ib), (rank, new));
        }
        Ok(ByteLevel {
            split,
            byte_ids,
            merges: map,
            alphabet,
        })
    }

    /// Appends the ids of `text` (no added tokens in it) to `out`.
    pub(crate) fn encode(&self, text: &str, out: &mut Vec<u32>) {
        let mut word = Vec::new();
        let mut merge = |a: u32, b: u32| {
            self.merges
                .get(&(u64::from(a) << 32 | u64::from(b)))
                .map(|&(rank, id)| (u128::from(rank), id))
        };
        self.split.split(text, &mut |piece| {
            word.clear();
            // A byte without a token is dropped: the reference model has no unknown token here.
            word.extend(
                piece
                    .bytes()
                    .filter_map(|b| self.byte_ids.get(usize::from(b)).copied().flatten()),
            );
            merge_word(&mut word, &mut merge);
            out.extend_from_slice(&word);
        });
    }
}
