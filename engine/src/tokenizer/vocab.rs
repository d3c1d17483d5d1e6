//! The vocabulary in two flat buffers: every piece's text in one string, and
//! an open-addressing table of ids keyed by that text. A 262,144-token
//! vocabulary (Gemma 3) costs about 5 MiB this way, against about 36 MiB as a
//! `Vec<String>` plus a `HashMap<String, u32>` of copies.

use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};

/// An empty table slot.
const EMPTY: u32 = u32::MAX;

pub(crate) struct Vocab {
    /// Every piece's text, one after another.
    text: String,
    /// Where piece `i` ends in `text` (it starts where piece `i - 1` ends).
    ends: Vec<u32>,
    /// Ids by the hash of their text, probed linearly; at most half full, so a
    /// look-up of text that is not a piece stops at an empty slot soon.
    slots: Vec<u32>,
}

/// SipHash with fixed keys: the table is built from the file, so a query
/// cannot place colliding keys in it.
fn hash(s: &str) -> u64 {
    BuildHasherDefault::<DefaultHasher>::default().hash_one(s)
}

impl Vocab {
    /// The pieces in id order. On a repeated piece the last id wins, as in the
    /// reference tokenizer's dictionary. `None` when the pieces' total length or
    /// count does not fit in `u32` (the caller reports the file as broken).
    pub(crate) fn new<S: AsRef<str>>(pieces: impl IntoIterator<Item = S>) -> Option<Vocab> {
        let mut text = String::new();
        let mut ends = Vec::new();
        for p in pieces {
            text.push_str(p.as_ref());
            ends.push(u32::try_from(text.len()).ok()?);
        }
        let n = u32::try_from(ends.len()).ok().filter(|&n| n < EMPTY)?;
        let size = (ends.len() * 2).max(2).next_power_of_two();
        let mut v = Vocab {
            text,
            ends,
            slots: vec![EMPTY; size],
        };
        for id in 0..n {
            let slot = v.find(v.piece(id)?);
            *v.slots.get_mut(slot)? = id;
        }
        Some(v)
    }

    pub(crate) fn len(&self) -> usize {
        self.ends.len()
    }

    /// Piece `id`'s text.
    pub(crate) fn piece(&self, id: u32) -> Option<&str> {
        let i = id as usize;
        let end = *self.ends.get(i)? as usize;
        let start = match i.checked_sub(1) {
            None => 0,
            Some(before) => *self.ends.get(before)? as usize,
        };
        self.text.get(start..end)
    }

    /// The id spelled `piece`.
    pub(crate) fn get(&self, piece: &str) -> Option<u32> {
        match self.slot(self.find(piece)) {
            EMPTY => None,
            id => Some(id),
        }
    }

    pub(crate) fn contains(&self, piece: &str) -> bool {
        self.get(piece).is_some()
    }

    /// Slot `at`'s id; `find` only asks for slots under the mask.
    fn slot(&self, at: usize) -> u32 {
        self.slots.get(at).copied().unwrap_or(EMPTY)
    }

    /// The slot holding `piece`'s id, or the empty slot where it would go.
    fn find(&self, piece: &str) -> usize {
        let mask = self.slots.len() - 1;
        let mut at = hash(piece) as usize & mask;
        loop {
            match self.slot(at) {
                EMPTY => return at,
                id if self.piece(id) == Some(piece) => return at,
                _ => at = (at + 1) & mask,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vocabulary of `pieces`, which every test here keeps small enough to build.
    fn built<S: AsRef<str>>(pieces: impl IntoIterator<Item = S>) -> Vocab {
        let v = Vocab::new(pieces);
        assert!(v.is_some(), "a small vocabulary fits");
        v.unwrap_or(Vocab {
            text: String::new(),
            ends: Vec::new(),
            slots: vec![EMPTY; 2],
        })
    }

    #[test]
    fn looks_up_every_piece_and_refuses_others() {
        let pieces = ["", "a", "ab", "▁the", "<0x0A>", "b"];
        let v = built(pieces);
        assert_eq!(v.len(), pieces.len());
        for (id, p) in (0u32..).zip(pieces) {
            assert_eq!(v.piece(id), Some(p));
            assert_eq!(v.get(p), Some(id));
        }
        assert_eq!(v.piece(6), None);
        for other in ["c", "abc", "▁", "A"] {
            assert_eq!(v.get(other), None, "{other:?}");
            assert!(!v.contains(other));
        }
    }

    #[test]
    fn a_repeated_piece_names_its_last_id() {
        let v = built(["x", "y", "x", "z", "x"]);
        assert_eq!(v.get("x"), Some(4));
        assert_eq!(v.piece(0), Some("x"));
        assert_eq!(v.get("y"), Some(1));
    }

    #[test]
    fn many_pieces_with_shared_prefixes() {
        let pieces: Vec<String> = (0..5000).map(|i| format!("tok{i}")).collect();
        let v = built(&pieces);
        for (id, p) in (0u32..).zip(&pieces) {
            assert_eq!(v.get(p), Some(id));
        }
        assert_eq!(v.get("tok5000"), None);
        let empty = built(Vec::<String>::new());
        assert_eq!((empty.len(), empty.get("a")), (0, None));
    }
}
