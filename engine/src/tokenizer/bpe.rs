//! The merge loop both vocabularies share: a word's symbols merge pair by
//! pair, lowest rank first (leftmost on ties), through a priority queue, so a
//! long word costs O(n log n) rather than a rescan per merge.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// One live or merged-away symbol of a word, linked to its neighbours.
#[derive(Clone, Copy)]
struct Symbol {
    id: u32,
    prev: usize,
    next: usize,
    alive: bool,
}

/// A candidate merge of the symbol at `pos` with its right neighbour.
#[derive(PartialEq, Eq)]
struct Candidate {
    rank: u128,
    pos: usize,
    new_id: u32,
}

impl Ord for Candidate {
    // BinaryHeap is a max-heap: the lowest rank, then the lowest position, must come out first.
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .rank
            .cmp(&self.rank)
            .then_with(|| other.pos.cmp(&self.pos))
    }
}

impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

const NONE: usize = usize::MAX;

/// Merges `ids` in place. `merge(left, right)` gives the pair's rank and the
/// id it merges into, or `None` when the pair does not merge.
///
/// A queued candidate is stale when its symbol died or its pair now merges
/// into a different id; it is then dropped, as the reference BPE does.
pub(crate) fn merge_word(
    ids: &mut Vec<u32>,
    merge: &mut dyn FnMut(u32, u32) -> Option<(u128, u32)>,
) {
    let n = ids.len();
    if n < 2 {
        return;
    }
    let mut syms: Vec<Symbol> = ids
        .iter()
        .enumerate()
        .map(|(i, &id)| Symbol {
            id,
            prev: if i == 0 { NONE } else { i - 1 },
            next: if i + 1 == n { NONE } else { i + 1 },
            alive: true,
        })
        .collect();
    let mut queue = BinaryHeap::with_capacity(n);
    for (pos, pair) in ids.windows(2).enumerate() {
        if let [a, b] = *pair {
            if let Some((rank, new_id)) = merge(a, b) {
                queue.push(Candidate { rank, pos, new_id });
            }
        }
    }
    while let Some(top) = queue.pop() {
        let Some(&cur) = syms.get(top.pos) else {
            continue;
        };
        if !cur.alive || cur.next == NONE {
            continue;
        }
        let Some(&right) = syms.get(cur.next) else {
            continue;
        };
        if merge(cur.id, right.id).map(|(_, id)| id) != Some(top.new_id) {
            continue;
        }
        // The left symbol takes the merged id; the right one dies.
        if let Some(r) = syms.get_mut(cur.next) {
            r.alive = false;
        }
        if let Some(after) = syms.get_mut(right.next) {
            after.prev = top.pos;
        }
        let merged = Symbol {
            id: top.new_id,
            prev: cur.prev,
            next: right.next,
            alive: true,
        };
        if let Some(s) = syms.get_mut(top.pos) {
            *s = merged;
        }
        if let Some(&before) = syms.get(merged.prev) {
            if let Some((rank, new_id)) = merge(before.id, merged.id) {
                queue.push(Candidate {
                    rank,
                    pos: merged.prev,
                    new_id,
                });
            }
        }
        if let Some(&after) = syms.get(merged.next) {
            if let Some((rank, new_id)) = merge(merged.id, after.id) {
                queue.push(Candidate {
                    rank,
                    pos: top.pos,
                    new_id,
                });
            }
        }
    }
    ids.clear();
    ids.extend(syms.iter().filter(|s| s.alive).map(|s| s.id));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_lowest_rank_first_and_leftmost_on_ties() {
        // ids: a=0 b=1 ab=2 bb=3 abb=4; ranks: (a,b)=0, (b,b)=1, (ab,b)=2
        let mut merge = |x: u32, y: u32| match (x, y) {
            (0, 1) => Some((0, 2)),
            (1, 1) => Some((1, 3)),
            (2, 1) => Some((2, 4)),
            _ => None,
        };
        let mut w = vec![0, 1, 1, 0, 1];
        merge_word(&mut w, &mut merge);
        assert_eq!(w, vec![4, 2]);
        let mut w = vec![1, 1, 1];
        merge_word(&mut w, &mut merge);
        assert_eq!(w, vec![3, 1]);
        let mut w = vec![];
        merge_word(&mut w, &mut merge);
        assert!(w.is_empty());
    }
}
