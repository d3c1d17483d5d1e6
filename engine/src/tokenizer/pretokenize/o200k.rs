//! The GPT-4o split (o200k; also Llama 4's and others'), and Tekken's variant
//! of it: words whose case the pattern reads, with an English contraction
//! glued on,
//! `[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?`,
//! `|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?`,
//! then `|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`.
//! Tekken glues no contraction and takes one digit at a time.

use super::classes::{Chars, LETTER, LOWER, NEWLINE, NUMBER, SPACE, UPPER};

/// Which variant of the pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct O200k {
    /// Whether a contraction joins the word before it (GPT-4o, not Tekken).
    pub(crate) contractions: bool,
    /// The longest digit run one piece takes.
    pub(crate) digits: usize,
}

impl O200k {
    /// The end of the piece starting at character `i`.
    pub(super) fn piece_end(self, t: &Chars<'_>, i: usize) -> usize {
        let lead = t.is_not(i, NEWLINE | LETTER | NUMBER);
        // The first word form, with the optional leading character, then without.
        for form in [lower_ending, upper_led] {
            if lead {
                if let Some(end) = form(t, i + 1) {
                    return self.glue(t, end);
                }
            }
            if let Some(end) = form(t, i) {
                return self.glue(t, end);
            }
        }
        if t.is(i, NUMBER) {
            return t.run(i, NUMBER).min(i + self.digits);
        }
        let other = SPACE | LETTER | NUMBER;
        let lead = usize::from(t.ch(i) == Some(' ') && t.is_not(i + 1, other));
        if t.is_not(i + lead, other) {
            let mut end = t.run_not(i + lead, other);
            while t.is(end, NEWLINE) || t.ch(end) == Some('/') {
                end += 1;
            }
            return end;
        }
        t.spaces_to_newline(i).unwrap_or_else(|| t.spaces(i))
    }

    /// `end` with a contraction after it taken in.
    fn glue(self, t: &Chars<'_>, end: usize) -> usize {
        match t.contraction(end, true) {
            n if n > 0 && self.contractions => end + 1 + n,
            _ => end,
        }
    }
}

/// `[U]*[L]+` from `s`: the greedy upper run gives back characters until a
/// lower one can follow.
fn lower_ending(t: &Chars<'_>, s: usize) -> Option<usize> {
    let upper_end = t.run(s, UPPER);
    if t.is(upper_end, LOWER) {
        return Some(t.run(upper_end, LOWER));
    }
    // The last character of the upper run that is also lower ends the word;
    // the ones after it are not lower, and neither is the one past the run.
    (s..upper_end)
        .rev()
        .find(|&q| t.is(q, LOWER))
        .map(|q| q + 1)
}

/// `[U]+[L]*` from `s`.
fn upper_led(t: &Chars<'_>, s: usize) -> Option<usize> {
    let upper_end = t.run(s, UPPER);
    (upper_end > s).then(|| t.run(upper_end, LOWER))
}
