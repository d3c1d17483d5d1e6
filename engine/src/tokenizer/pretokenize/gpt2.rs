//! The GPT-2 split: contractions, letter runs, digit runs and punctuation runs
//! (each may take one leading space), and whitespace runs that leave their
//! last character to the next piece. It is the pattern
//! `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.

use super::classes::{Chars, LETTER, NUMBER, SPACE};

/// The end of the piece starting at character `i`.
pub(super) fn piece_end(t: &Chars<'_>, i: usize) -> usize {
    let c = t.contraction(i, false);
    if c > 0 {
        return i + 1 + c;
    }
    // A space joins the run after it; the run is of the class of its first character.
    let lead = usize::from(t.ch(i) == Some(' ') && t.is_not(i + 1, SPACE));
    let k = i + lead;
    for class in [LETTER, NUMBER] {
        if t.is(k, class) {
            return t.run(k, class);
        }
    }
    if t.is_not(k, SPACE | LETTER | NUMBER) {
        return t.run_not(k, SPACE | LETTER | NUMBER);
    }
    t.spaces(i)
}
