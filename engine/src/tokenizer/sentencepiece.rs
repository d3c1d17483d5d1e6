//! SentencePiece-style BPE (`tokenizer.ggml.model = "llama"`): spaces become
//! `▁` (with one more in front of each stretch of text between added tokens
//! when the file asks for a dummy prefix, as Llama's and Phi-3's do and
//! Gemma's does not), the stretch is one word, characters outside the
//! vocabulary fall back to `<0xXX>` byte tokens, and a pair merges when its
//! concatenation is a token. The file lists no merges, so their order comes
//! from the vocabulary, as the reference tokenizer derives it (see `Order`).

use super::bpe::merge_word;
use super::vocab::Vocab;

/// The meta space that stands for ' ' inside tokens.
pub(crate) const META: char = '\u{2581}';

/// Python's `str.isspace`: Unicode White_Space plus the four ASCII separators.
fn py_space(c: char) -> bool {
    c.is_whitespace() || ('\x1c'..='\x1f').contains(&c)
}

/// Gemma files store tokens of two or more spaces with real spaces; the model
/// looks them up as meta spaces, so a whitespace-only token with a space in it
/// is respelled as that many `▁`.
pub(crate) fn respell(token: &str) -> String {
    if token.contains(' ') && token.chars().all(py_space) {
        std::iter::repeat_n(META, token.chars().count()).collect()
    } else {
        token.to_string()
    }
}

/// `<0xXX>` → the byte, for a byte-fallback token's spelling.
pub(crate) fn byte_token(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// Which merge goes first.
#[derive(Debug, Clone)]
pub(crate) enum Order {
    /// The merged token's position in the file, then the longer left part:
    /// Gemma's, whose scores do not follow its merge order.
    Position,
    /// The merged token's score, highest first, then the longer left part,
    /// then the longer right part, then the merged token's position: SentencePiece's
    /// score order with the reference's tie-breaks. Holds each token's place
    /// among the distinct scores, best first.
    Score(Vec<u32>),
}

impl Order {
    /// The score order of `scores` (one per token).
    pub(crate) fn by_score(scores: &[f64]) -> Order {
        // -0.0 and 0.0 are one score, as Python compares them.
        let key = |s: f64| if s == 0.0 { 0.0 } else { s };
        let mut distinct: Vec<f64> = scores.iter().map(|&s| key(s)).collect();
        distinct.sort_by(|a, b| b.total_cmp(a));
        distinct.dedup();
        let place = |s: f64| {
            let at = distinct.partition_point(|d| d.total_cmp(&key(s)).is_gt());
            u32::try_from(at).unwrap_or(u32::MAX)
        };
        Order::Score(scores.iter().map(|&s| place(s)).collect())
    }

    /// The rank of merging `left` and `right` into token `id` (lower first).
    fn rank(&self, id: u32, left: &str, right: &str) -> u128 {
        // A longer part ranks lower: its length's complement in the field's width.
        let longer =
            |len: usize, max: u32| u128::from(max - u32::try_from(len).unwrap_or(max).min(max));
        match self {
            Order::Position => u128::from(id) << 32 | longer(left.len(), u32::MAX),
            Order::Score(place) => {
                let p = place.get(id as usize).copied().unwrap_or(u32::MAX);
                let chars = |s: &str| s.chars().count();
                u128::from(p) << 64
                    | longer(chars(left), 0xffff) << 48
                    | longer(chars(right), 0xffff) << 32
                    | u128::from(id)
            }
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct SentencePiece {
    /// The `<0xXX>` token of each byte, when the vocabulary has it.
    byte_ids: [Option<u32>; 256],
    unk: Option<u32>,
    /// Whether each stretch of text starts with an added `▁`.
    dummy_prefix: bool,
    order: Order,
}

impl SentencePiece {
    pub(crate) fn new(
        vocab: &Vocab,
        unk: Option<u32>,
        dummy_prefix: bool,
        order: Order,
    ) -> SentencePiece {
        let mut byte_ids = [None; 256];
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            *slot = vocab.get(format!("<0x{b:02X}>").as_str());
        }
        SentencePiece {
            byte_ids,
            unk,
            dummy_prefix,
            order,
        }
    }

    /// Whether each stretch of text starts with an added `▁`.
    pub(crate) fn dummy_prefix(&self) -> bool {
        self.dummy_prefix
    }

    /// Appends the ids of `text` (no added tokens in it) to `out`.
    pub(crate) fn encode(&self, text: &str, vocab: &Vocab, out: &mut Vec<u32>) {
        let mut word: Vec<u32> = Vec::with_capacity(text.len() + 1);
        let mut buf = [0u8; 4];
        let mut last_unk = false;
        let prefix = (self.dummy_prefix && !text.is_empty()).then_some(' ');
        for c in prefix.into_iter().chain(text.chars()) {
            let c = if c == ' ' { META } else { c };
            if let Some(id) = vocab.get(c.encode_utf8(&mut buf)) {
                word.push(id);
                last_unk = false;
                continue;
            }
            let bytes: Option<Vec<u32>> = c
                .encode_utf8(&mut buf)
                .bytes()
                .map(|b| self.byte_ids.get(usize::from(b)).copied().flatten())
                .collect();
            match (bytes, self.unk) {
                (Some(ids), _) => {
                    word.extend(ids);
                    last_unk = false;
                }
                // Unknown characters in a row become one unknown token.
                (None, Some(unk)) if !last_unk => {
                    word.push(unk);
                    last_unk = true;
                }
                _ => {}
            }
        }
        // One buffer per call builds each pair's concatenation without allocating per look-up.
        let mut scratch = String::new();
        let mut merge = |a: u32, b: u32| {
            let (pa, pb) = (vocab.piece(a)?, vocab.piece(b)?);
            scratch.clear();
            scratch.push_str(pa);
            scratch.push_str(pb);
            let id = vocab.get(scratch.as_str())?;
            Some((self.order.rank(id, pa, pb), id))
        };
        merge_word(&mut word, &mut merge);
        out.extend_from_slice(&word);
    }
}

/// Decodes pieces the way the reference decoder chain does: `▁` → ' ', runs of
/// byte tokens joined and read as UTF-8 (one U+FFFD per byte when a run is not
/// valid UTF-8), everything concatenated.
pub(crate) fn decode<'p>(pieces: impl Iterator<Item = &'p str>) -> String {
    let mut out = String::new();
    let mut run: Vec<u8> = Vec::new();
    let flush = |run: &mut Vec<u8>, out: &mut String| {
        if run.is_empty() {
            return;
        }
        match std::str::from_utf8(run) {
            Ok(s) => out.push_str(s),
            Err(_) => out.extend(std::iter::repeat_n('\u{fffd}', run.len())),
        }
        run.clear();
    };
    for p in pieces {
        if let Some(b) = byte_token(p) {
            run.push(b);
            continue;
        }
        flush(&mut run, &mut out);
        out.extend(p.chars().map(|c| if c == META { ' ' } else { c }));
    }
    flush(&mut run, &mut out);
    out
}

/// The raw bytes of one piece: a byte token's byte, else its text with `▁` as ' '.
pub(crate) fn piece_bytes(piece: &str) -> Vec<u8> {
    match byte_token(piece) {
        Some(b) => vec![b],
        None => piece.replace(META, " ").into_bytes(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn respells_space_runs_and_reads_byte_tokens() {
        assert_eq!(respell("   "), "▁▁▁");
        assert_eq!(respell("\n\n"), "\n\n");
        assert_eq!(respell("a b"), "a b");
        assert_eq!(byte_token("<0xE2>"), Some(0xE2));
        assert_eq!(byte_token("<0xE2"), None);
        assert_eq!(
            decode(["▁hi", "<0xE2>", "<0x98>", "<0x83>"].into_iter()),
            " hi☃"
        );
        assert_eq!(decode(["<0xE2>", "x"].into_iter()), "\u{fffd}x");
    }
}
