//! The GPT-2 split of text into pieces before byte-level BPE: contractions,
//! letter runs, digit runs and punctuation runs (each may take one leading
//! space), and whitespace runs that leave their last character to the next
//! piece. It is the pattern
//! `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
//! written as a scanner, because the lookahead is not in Rust's regex crate.

use crate::error::{EngineError, Result};
use regex_syntax::hir::{Class, HirKind};

/// Sorted, disjoint code point ranges of one Unicode class.
#[derive(Debug, Clone)]
struct Ranges(Vec<(char, char)>);

impl Ranges {
    fn from_class(pattern: &str) -> Result<Ranges> {
        let bad = |why: String| EngineError::Unsupported(format!("unicode class {pattern}: {why}"));
        let hir = regex_syntax::Parser::new()
            .parse(pattern)
            .map_err(|e| bad(e.to_string()))?;
        match hir.kind() {
            HirKind::Class(Class::Unicode(c)) => Ok(Ranges(
                c.ranges().iter().map(|r| (r.start(), r.end())).collect(),
            )),
            _ => Err(bad("not a class".into())),
        }
    }

    fn contains(&self, c: char) -> bool {
        self.0
            .binary_search_by(|&(lo, hi)| {
                if hi < c {
                    std::cmp::Ordering::Less
                } else if lo > c {
                    std::cmp::Ordering::Greater
                } else {
                    std::cmp::Ordering::Equal
                }
            })
            .is_ok()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Letter,
    Number,
    Space,
    Other,
}

/// The GPT-2 pre-tokenizer.
#[derive(Debug, Clone)]
pub(crate) struct Gpt2Split {
    letters: Ranges,
    numbers: Ranges,
}

impl Gpt2Split {
    pub(crate) fn new() -> Result<Gpt2Split> {
        Ok(Gpt2Split {
            letters: Ranges::from_class(r"\p{L}")?,
            numbers: Ranges::from_class(r"\p{N}")?,
        })
    }

    fn kind(&self, c: char) -> Kind {
        if c.is_ascii() {
            // The common case without a table search.
            return if c.is_ascii_alphabetic() {
                Kind::Letter
            } else if c.is_ascii_digit() {
                Kind::Number
            } else if c.is_ascii_whitespace() || c == '\x0b' {
                Kind::Space
            } else {
                Kind::Other
            };
        }
        if c.is_whitespace() {
            Kind::Space
        } else if self.letters.contains(c) {
            Kind::Letter
        } else if self.numbers.contains(c) {
            Kind::Number
        } else {
            Kind::Other
        }
    }

    /// Calls `piece` on each piece of `text`, in order; the pieces cover `text` exactly.
    pub(crate) fn split<'t>(&self, text: &'t str, piece: &mut dyn FnMut(&'t str)) {
        let chars: Vec<(usize, char, Kind)> = text
            .char_indices()
            .map(|(at, c)| (at, c, self.kind(c)))
            .collect();
        let n = chars.len();
        let at = |i: usize| chars.get(i).map_or(text.len(), |&(b, _, _)| b);
        let kind = |i: usize| chars.get(i).map(|&(_, _, k)| k);
        let ch = |i: usize| chars.get(i).map(|&(_, c, _)| c);
        let run = |mut i: usize, k: Kind| {
            while kind(i) == Some(k) {
                i += 1;
            }
            i
        };
        let mut i = 0;
        while i < n {
            let Some(&(_, c, k)) = chars.get(i) else {
                break;
            };
            let end = if c == '\'' && contraction(ch(i + 1), ch(i + 2)) > 0 {
                i + 1 + contraction(ch(i + 1), ch(i + 2))
            } else if k != Kind::Space {
                run(i, k)
            } else if let Some(next @ (Kind::Letter | Kind::Number | Kind::Other)) =
                kind(i + 1).filter(|_| c == ' ')
            {
                run(i + 1, next)
            } else {
                // Whitespace: all of a run that ends the text, else all but its last
                // character (which may then lead the next piece), but at least one.
                let j = run(i, Kind::Space);
                if j == n || j - i == 1 {
                    j
                } else {
                    j - 1
                }
            };
            if let Some(s) = text.get(at(i)..at(end)) {
                piece(s);
            }
            i = end;
        }
    }
}

/// The length after the apostrophe of the contraction `'s|'t|'re|'ve|'m|'ll|'d`
/// starting there, or 0.
fn contraction(a: Option<char>, b: Option<char>) -> usize {
    match (a, b) {
        (Some('s' | 't' | 'm' | 'd'), _) => 1,
        (Some('r'), Some('e')) | (Some('v'), Some('e')) | (Some('l'), Some('l')) => 2,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(text: &str) -> Vec<String> {
        let s = Gpt2Split::new().unwrap_or_else(|e| unreachable!("{e}"));
        let mut out = Vec::new();
        s.split(text, &mut |p| out.push(p.to_string()));
        out
    }

    #[test]
    fn splits_like_the_gpt2_pattern() {
        assert_eq!(pieces("Hello world"), ["Hello", " world"]);
        assert_eq!(pieces("don't I'M"), ["don", "'t", " I", "'", "M"]);
        assert_eq!(pieces("a   b"), ["a", "  ", " b"]);
        assert_eq!(pieces("a\n\nb"), ["a", "\n", "\n", "b"]);
        assert_eq!(pieces("x  "), ["x", "  "]);
        assert_eq!(pieces("3.14 !!?"), ["3", ".", "14", " !!?"]);
        assert_eq!(pieces("café 日本"), ["café", " 日本"]);
        assert_eq!(pieces(""), Vec::<String>::new());
    }
}
