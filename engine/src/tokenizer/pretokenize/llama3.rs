//! The Llama 3 split (also DBRX's, Falcon 3's and others'), and Qwen 2's and
//! Qwen 3.5's variants of it: the pattern
//! `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`.
//! Qwen 2 takes one digit at a time (`\p{N}`); Qwen 3.5 also counts marks as
//! letters (`[\p{L}\p{M}]+`, and not in the punctuation class).

use super::classes::{Chars, LETTER, MARK, NEWLINE, NUMBER, SPACE};

/// Which variant of the pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Llama3 {
    /// The longest digit run one piece takes: 3, or 1 for Qwen.
    pub(crate) digits: usize,
    /// Whether marks join letter runs (Qwen 3.5).
    pub(crate) marks_are_letters: bool,
}

impl Llama3 {
    /// The end of the piece starting at character `i`.
    pub(super) fn piece_end(self, t: &Chars<'_>, i: usize) -> usize {
        let c = t.contraction(i, true);
        if c > 0 {
            return i + 1 + c;
        }
        let word = if self.marks_are_letters {
            LETTER | MARK
        } else {
            LETTER
        };
        // `[^\r\n\p{L}\p{N}]?` then a letter run: any one character but a
        // newline, letter or digit may lead it.
        if t.is_not(i, NEWLINE | LETTER | NUMBER) && t.is(i + 1, word) {
            return t.run(i + 1, word);
        }
        if t.is(i, word) {
            return t.run(i, word);
        }
        if t.is(i, NUMBER) {
            return t.run(i, NUMBER).min(i + self.digits);
        }
        let other = SPACE | NUMBER | word;
        let lead = usize::from(t.ch(i) == Some(' ') && t.is_not(i + 1, other));
        if t.is_not(i + lead, other) {
            let end = t.run_not(i + lead, other);
            return t.run(end, NEWLINE);
        }
        t.spaces_to_newline(i).unwrap_or_else(|| t.spaces(i))
    }
}
