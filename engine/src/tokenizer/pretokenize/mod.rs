//! The splits of text into pieces before byte-level BPE, one per pattern
//! family, each written as a scanner because the patterns' lookahead
//! (`\s+(?!\S)`) is not in Rust's regex crate. `tokenizer.ggml.pre` names the
//! split; the names map to patterns as the reference tokenizer maps them.

mod classes;
mod gpt2;
mod llama3;
mod o200k;

use crate::error::Result;
use classes::{Chars, Classes};
use llama3::Llama3;
use o200k::O200k;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pattern {
    Gpt2,
    Llama3(Llama3),
    O200k(O200k),
}

const LLAMA3: Pattern = Pattern::Llama3(Llama3 {
    digits: 3,
    marks_are_letters: false,
});
const QWEN2: Pattern = Pattern::Llama3(Llama3 {
    digits: 1,
    marks_are_letters: false,
});
const QWEN35: Pattern = Pattern::Llama3(Llama3 {
    digits: 1,
    marks_are_letters: true,
});
const GPT4O: Pattern = Pattern::O200k(O200k {
    contractions: true,
    digits: 3,
});
const TEKKEN: Pattern = Pattern::O200k(O200k {
    contractions: false,
    digits: 1,
});

/// The pattern of each `tokenizer.ggml.pre` name whose split is not GPT-2's.
const NAMED: &[(&str, Pattern)] = &[
    ("llama3", LLAMA3),
    ("llama-v3", LLAMA3),
    ("llama-bpe", LLAMA3),
    ("falcon3", LLAMA3),
    ("falcon-h1", LLAMA3),
    ("pixtral", LLAMA3),
    ("midm-2.0", LLAMA3),
    ("lfm2", LLAMA3),
    ("jina-v5-nano", LLAMA3),
    ("dbrx", LLAMA3),
    ("smaug-bpe", LLAMA3),
    ("tekken", TEKKEN),
    ("qwen2", QWEN2),
    ("deepseek-r1-qwen", QWEN2),
    ("kormo", QWEN2),
    ("f2llmv2", QWEN2),
    ("megrez", QWEN2),
    ("qwen35", QWEN35),
    ("gpt-4o", GPT4O),
    ("llama4", GPT4O),
    ("kanana2", GPT4O),
    ("talkie", GPT4O),
    ("minimax-m2", GPT4O),
];

/// A byte-level pre-tokenizer.
#[derive(Debug, Clone)]
pub(crate) struct Split {
    pattern: Pattern,
    classes: Classes,
}

impl Split {
    /// The split `tokenizer.ggml.pre = pre` names; GPT-2's for any other name
    /// or none, as the reference's byte-level tokenizer does.
    pub(crate) fn named(pre: Option<&str>) -> Result<Split> {
        let pattern = NAMED
            .iter()
            .find(|(name, _)| Some(*name) == pre)
            .map_or(Pattern::Gpt2, |&(_, p)| p);
        Ok(Split {
            pattern,
            classes: Classes::new()?,
        })
    }

    /// Calls `piece` on each piece of `text`, in order; the pieces cover `text` exactly.
    pub(crate) fn split<'t>(&self, text: &'t str, piece: &mut dyn FnMut(&'t str)) {
        let t = Chars::new(text, &self.classes);
        let mut i = 0;
        while i < t.len() {
            let end = match self.pattern {
                Pattern::Gpt2 => gpt2::piece_end(&t, i),
                Pattern::Llama3(p) => p.piece_end(&t, i),
                Pattern::O200k(p) => p.piece_end(&t, i),
            };
            // Every character is in some branch; the floor only guards the loop.
            let end = end.max(i + 1);
            piece(t.slice(i, end));
            i = end;
        }
    }
}

#[cfg(test)]
mod tests;
