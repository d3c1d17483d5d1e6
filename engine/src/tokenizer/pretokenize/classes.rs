//! The character classes the split patterns test, looked up once per
//! character: `\s`, `\p{L}`, `\p{N}`, `\p{M}`, and the case-aware letter
//! classes of the GPT-4o pattern.

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

/// `\s`.
pub(super) const SPACE: u8 = 1;
/// `\p{L}`.
pub(super) const LETTER: u8 = 2;
/// `\p{N}`.
pub(super) const NUMBER: u8 = 4;
/// `\p{M}`.
pub(super) const MARK: u8 = 8;
/// `[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]`: what may lead a word in the GPT-4o pattern.
pub(super) const UPPER: u8 = 16;
/// `[\p{Ll}\p{Lm}\p{Lo}\p{M}]`: what may end a word in the GPT-4o pattern.
pub(super) const LOWER: u8 = 32;
/// `\r` or `\n`.
pub(super) const NEWLINE: u8 = 64;

/// The tables behind `Classes::of`.
#[derive(Debug, Clone)]
pub(crate) struct Classes {
    letters: Ranges,
    numbers: Ranges,
    marks: Ranges,
    upper: Ranges,
    lower: Ranges,
}

impl Classes {
    pub(crate) fn new() -> Result<Classes> {
        Ok(Classes {
            letters: Ranges::from_class(r"\p{L}")?,
            numbers: Ranges::from_class(r"\p{N}")?,
            marks: Ranges::from_class(r"\p{M}")?,
            upper: Ranges::from_class(r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]")?,
            lower: Ranges::from_class(r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]")?,
        })
    }

    /// The class bits of `c`.
    pub(super) fn of(&self, c: char) -> u8 {
        if c.is_ascii() {
            // The common case without a table search.
            return if c.is_ascii_uppercase() {
                LETTER | UPPER
            } else if c.is_ascii_lowercase() {
                LETTER | LOWER
            } else if c.is_ascii_digit() {
                NUMBER
            } else if c == '\r' || c == '\n' {
                SPACE | NEWLINE
            } else if c.is_ascii_whitespace() || c == '\x0b' {
                SPACE
            } else {
                0
            };
        }
        if c.is_whitespace() {
            return SPACE;
        }
        let mut bits = 0;
        for (table, bit) in [
            (&self.letters, LETTER),
            (&self.numbers, NUMBER),
            (&self.marks, MARK),
            (&self.upper, UPPER),
            (&self.lower, LOWER),
        ] {
            if table.contains(c) {
                bits |= bit;
            }
        }
        bits
    }
}

/// A text as characters with their classes, and the scans every pattern uses.
pub(super) struct Chars<'t> {
    text: &'t str,
    chars: Vec<(usize, char, u8)>,
}

impl<'t> Chars<'t> {
    pub(super) fn new(text: &'t str, classes: &Classes) -> Chars<'t> {
        Chars {
            text,
            chars: text
                .char_indices()
                .map(|(at, c)| (at, c, classes.of(c)))
                .collect(),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.chars.len()
    }

    /// The character at `i` (`None` past the end).
    pub(super) fn ch(&self, i: usize) -> Option<char> {
        self.chars.get(i).map(|&(_, c, _)| c)
    }

    /// The class bits at `i` (0 past the end).
    pub(super) fn bits(&self, i: usize) -> u8 {
        self.chars.get(i).map_or(0, |&(_, _, b)| b)
    }

    /// Whether the character at `i` has any of `bits`.
    pub(super) fn is(&self, i: usize, bits: u8) -> bool {
        self.bits(i) & bits != 0
    }

    /// Whether the character at `i` exists and has none of `bits`.
    pub(super) fn is_not(&self, i: usize, bits: u8) -> bool {
        i < self.len() && self.bits(i) & bits == 0
    }

    /// The end of the run from `i` of characters with any of `bits`.
    pub(super) fn run(&self, mut i: usize, bits: u8) -> usize {
        while self.is(i, bits) {
            i += 1;
        }
        i
    }

    /// The end of the run from `i` of characters with none of `bits`.
    pub(super) fn run_not(&self, mut i: usize, bits: u8) -> usize {
        while self.is_not(i, bits) {
            i += 1;
        }
        i
    }

    /// The text of characters `from..to`.
    pub(super) fn slice(&self, from: usize, to: usize) -> &'t str {
        let at = |i: usize| self.chars.get(i).map_or(self.text.len(), |&(b, _, _)| b);
        self.text.get(at(from)..at(to)).unwrap_or("")
    }

    /// `\s+(?!\S)|\s+` at a whitespace run from `i`: all of a run that ends the
    /// text, else all but its last character (which may then lead the next
    /// piece), but at least one.
    pub(super) fn spaces(&self, i: usize) -> usize {
        let j = self.run(i, SPACE);
        if j == self.len() || j - i <= 1 {
            j
        } else {
            j - 1
        }
    }

    /// `\s*[\r\n]+` at `i`: through the last newline of the whitespace run from
    /// `i`, or `None` when the run has no newline.
    pub(super) fn spaces_to_newline(&self, i: usize) -> Option<usize> {
        let j = self.run(i, SPACE);
        (i..j).rev().find(|&k| self.is(k, NEWLINE)).map(|k| k + 1)
    }

    /// The length after the apostrophe at `i` of the contraction
    /// `'s|'t|'re|'ve|'m|'ll|'d` (any case when `fold`), or 0.
    pub(super) fn contraction(&self, i: usize, fold: bool) -> usize {
        if self.ch(i) != Some('\'') {
            return 0;
        }
        // Case folding also takes the long s to 's'.
        let low = |c: Option<char>| match c {
            Some('\u{17f}') if fold => Some('s'),
            Some(c) if fold => Some(c.to_ascii_lowercase()),
            c => c,
        };
        match (low(self.ch(i + 1)), low(self.ch(i + 2))) {
            (Some('s' | 't' | 'm' | 'd'), _) => 1,
            (Some('r'), Some('e')) | (Some('v'), Some('e')) | (Some('l'), Some('l')) => 2,
            _ => 0,
        }
    }
}
