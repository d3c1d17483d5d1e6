//! Added tokens (control and user-defined ones, and the named special tokens)
//! are cut out of the text before the model sees it: scanning left to right,
//! the longest added token starting at the leftmost position wins.

/// One trie node: children sorted by byte, and the token ending here.
type Node = (Vec<(u8, u32)>, Option<u32>);

/// A byte trie over the added tokens' texts.
#[derive(Debug, Clone, Default)]
pub(crate) struct AddedTokens {
    nodes: Vec<Node>,
    /// Whether any added token starts with this byte (skips the trie walk).
    first: Vec<bool>,
    count: usize,
}

/// A part of the text: plain text for the model, or an added token's id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Part<'t> {
    Text(&'t str),
    Token(u32),
}

impl AddedTokens {
    pub(crate) fn new() -> AddedTokens {
        AddedTokens {
            nodes: vec![(Vec::new(), None)],
            first: vec![false; 256],
            count: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.count
    }

    /// Adds `text` as token `id`; the first id given for a text stays.
    pub(crate) fn insert(&mut self, text: &str, id: u32) {
        if text.is_empty() {
            return;
        }
        let mut node = 0usize;
        for b in text.bytes() {
            let next_free = self.nodes.len() as u32;
            let Some((children, _)) = self.nodes.get_mut(node) else {
                return;
            };
            node = match children.binary_search_by_key(&b, |&(k, _)| k) {
                Ok(i) => children.get(i).map_or(0, |&(_, n)| n as usize),
                Err(i) => {
                    children.insert(i, (b, next_free));
                    self.nodes.push((Vec::new(), None));
                    next_free as usize
                }
            };
        }
        if let Some((_, slot @ None)) = self.nodes.get_mut(node) {
            *slot = Some(id);
            self.count += 1;
        }
        if let Some(f) = text
            .bytes()
            .next()
            .and_then(|b| self.first.get_mut(usize::from(b)))
        {
            *f = true;
        }
    }

    /// The longest added token at the start of `bytes`: (its length, id).
    fn longest(&self, bytes: &[u8]) -> Option<(usize, u32)> {
        let mut node = 0usize;
        let mut best = None;
        for (depth, &b) in bytes.iter().enumerate() {
            let Some((children, _)) = self.nodes.get(node) else {
                break;
            };
            let Some(&(_, child)) = children
                .binary_search_by_key(&b, |&(k, _)| k)
                .ok()
                .and_then(|i| children.get(i))
            else {
                break;
            };
            node = child as usize;
            if let Some((_, Some(id))) = self.nodes.get(node) {
                best = Some((depth + 1, *id));
            }
        }
        best
    }

    /// Calls `part` on the text's parts in order.
    pub(crate) fn split<'t>(&self, text: &'t str, part: &mut dyn FnMut(Part<'t>)) {
        let bytes = text.as_bytes();
        let (mut start, mut i) = (0usize, 0usize);
        while i < bytes.len() {
            let starts = bytes
                .get(i)
                .is_some_and(|&b| self.first.get(usize::from(b)) == Some(&true));
            // Tokens are whole UTF-8 strings, so a match can only begin on a char boundary.
            let found = if starts {
                bytes.get(i..).and_then(|rest| self.longest(rest))
            } else {
                None
            };
            match found {
                Some((len, id)) => {
                    if let Some(t) = text.get(start..i).filter(|t| !t.is_empty()) {
                        part(Part::Text(t));
                    }
                    part(Part::Token(id));
                    i += len;
                    start = i;
                }
                None => i += 1,
            }
        }
        if let Some(t) = text.get(start..).filter(|t| !t.is_empty()) {
            part(Part::Text(t));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leftmost_then_longest() {
        let mut a = AddedTokens::new();
        a.insert("\n", 1);
        a.insert("\n\n", 2);
        a.insert("<s>", 3);
        a.insert("<s>x", 4);
        a.insert("<s>xyz", 5);
        let mut parts = Vec::new();
        a.split("a\n\n\nb<s>xy<s", &mut |p| parts.push(p));
        assert_eq!(
            parts,
            [
                Part::Text("a"),
                Part::Token(2),
                Part::Token(1),
                Part::Text("b"),
                Part::Token(4),
                Part::Text("y<s"),
            ]
        );
        assert_eq!(a.len(), 5);
    }
}
