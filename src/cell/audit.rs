//! The cell cache's invariant check (diagnostics, tests and the fuzz target).

use super::CellCache;

impl CellCache {
    /// Checks every internal invariant (diagnostics and tests; O(n_cells x
    /// words + held entries)). `Err` names the first violation.
    pub fn audit(&self) -> std::result::Result<(), String> {
        for (ti, t) in self.tables.iter().enumerate() {
            t.audit().map_err(|e| format!("table {ti}: {e}"))?;
            let mut pairs = 0usize;
            for (ix, s) in self.seqs.iter().enumerate() {
                let Some(list) = s.lists.get(ti) else {
                    continue;
                };
                if !s.live && !list.is_empty() {
                    return Err(format!("table {ti}: dead ix {ix} holds cells"));
                }
                let mut prev: Option<usize> = None;
                for e in list {
                    if prev.is_some_and(|p| p >= e.pos) {
                        return Err(format!(
                            "table {ti}: ix {ix} list not strictly increasing at {}",
                            e.pos
                        ));
                    }
                    prev = Some(e.pos);
                    let c = e.cell as usize;
                    if t.pos.get(c).copied() != Some(e.pos) {
                        return Err(format!(
                            "table {ti}: ix {ix} lists cell {c} at {} but the cell holds {:?}",
                            e.pos,
                            t.pos.get(c)
                        ));
                    }
                    if !t.owns(c, ix) {
                        return Err(format!(
                            "table {ti}: ix {ix} lists cell {c} without owning it"
                        ));
                    }
                }
                pairs = pairs.saturating_add(list.len());
                if Some(ti) == self.ring && list.len() > self.ring_keep {
                    return Err(format!(
                        "ring table: ix {ix} holds {} > {} cells",
                        list.len(),
                        self.ring_keep
                    ));
                }
            }
            let owned: usize = t.n_owners.iter().map(|n| *n as usize).sum();
            if owned != pairs {
                return Err(format!(
                    "table {ti}: {owned} owner bits but {pairs} listed entries"
                ));
            }
        }
        for (ix, s) in self.seqs.iter().enumerate() {
            let mut end = 0usize;
            let mut len = 0usize;
            for (i, &(a, b)) in s.evicted.iter().enumerate() {
                if a >= b || (i > 0 && a <= end) {
                    return Err(format!("ix {ix}: bad evicted ranges {:?}", s.evicted));
                }
                end = b;
                len = len.saturating_add(b.saturating_sub(a));
            }
            if len != s.evicted_len {
                return Err(format!(
                    "ix {ix}: evicted_len {} but ranges hold {len}",
                    s.evicted_len
                ));
            }
            if let Some(r) = self.ring {
                if let Some(front) = s.lists.get(r).and_then(|l| l.front()) {
                    if !s.evicted.is_empty() && end > front.pos {
                        return Err(format!(
                            "ix {ix}: evicted up to {end} but ring holds {}",
                            front.pos
                        ));
                    }
                }
                if let Some(f) = self.full {
                    let full: Vec<usize> = s
                        .lists
                        .get(f)
                        .map(|l| l.iter().map(|e| e.pos).collect())
                        .unwrap_or_default();
                    let mut logical: Vec<usize> =
                        s.evicted.iter().flat_map(|&(a, b)| a..b).collect();
                    logical.extend(
                        s.lists
                            .get(r)
                            .map(|l| l.iter().map(|e| e.pos).collect::<Vec<_>>())
                            .unwrap_or_default(),
                    );
                    if full != logical {
                        return Err(format!(
                            "ix {ix}: full table positions differ from evicted + ring"
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}
