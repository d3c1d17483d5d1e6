//! One cell table: per-cell position, owner bitset and free bitmap.
//!
//! Arithmetic here is on cell indices and counts: cells < n_cells <= MAX_CELLS
//! (2^31), owner indices < n_seq_max <= MAX_SEQS (2^16), and
//! n_cells * words <= MAX_OWNER_WORDS (all checked by `CellCache::new`), so no
//! index or count below can overflow; subtractions are guarded by the loop
//! conditions next to them (`used_end > 0`, `occupied != 0`, `tail != 0`).
#![allow(clippy::arithmetic_side_effects)]

/// Marks a free cell in [`Table::pos`].
pub(crate) const FREE: usize = usize::MAX;

/// `n_cells` cells, each free or holding one position and a non-empty owner set.
///
/// Owners are sequence *indices* (not ids), one bit each, `words` u64 words per
/// cell. `free_bits` has a 1 for every free cell; bits past `n_cells` are 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Table {
    pub(crate) n_cells: usize,
    words: usize,
    pub(crate) pos: Vec<usize>,
    pub(crate) n_owners: Vec<u32>,
    owners: Vec<u64>,
    free_bits: Vec<u64>,
    pub(crate) n_free: usize,
    /// No free cell has an index below `hint` (the placement cursor).
    hint: usize,
    /// No occupied cell has an index at or above `used_end` (an upper bound,
    /// tightened at each `begin_step`).
    used_end: usize,
    /// The open step's cell per token.
    pub(crate) step_cells: Vec<u32>,
    /// The open step's read extent: `used_end` after placement.
    pub(crate) read_len: usize,
}

impl Table {
    /// `owner_words` is `n_cells * words`, already checked by the caller.
    pub(crate) fn new(n_cells: usize, words: usize, owner_words: usize) -> Table {
        let mut t = Table {
            n_cells,
            words,
            pos: vec![FREE; n_cells],
            n_owners: vec![0; n_cells],
            owners: vec![0; owner_words],
            free_bits: Vec::new(),
            n_free: n_cells,
            hint: 0,
            used_end: 0,
            step_cells: Vec::new(),
            read_len: 0,
        };
        t.reset_free_bits();
        t
    }

    fn reset_free_bits(&mut self) {
        let n_words = self.n_cells.div_ceil(64);
        self.free_bits.clear();
        self.free_bits.resize(n_words, u64::MAX);
        let tail = self.n_cells % 64;
        if tail != 0 {
            if let Some(last) = self.free_bits.last_mut() {
                *last = (1u64 << tail) - 1;
            }
        }
    }

    /// Frees every cell.
    pub(crate) fn reset(&mut self) {
        self.pos.fill(FREE);
        self.n_owners.fill(0);
        self.owners.fill(0);
        self.reset_free_bits();
        self.n_free = self.n_cells;
        self.hint = 0;
        self.used_end = 0;
        self.step_cells.clear();
        self.read_len = 0;
    }

    /// Takes the lowest free cell at or above the cursor, stores `pos` in it and
    /// returns it. Scans whole words, so the cost is the words skipped.
    pub(crate) fn take_lowest_free(&mut self, pos: usize) -> Option<u32> {
        let mut w = self.hint / 64;
        while let Some(word) = self.free_bits.get_mut(w) {
            if *word != 0 {
                let bit = word.trailing_zeros() as usize;
                let cell = w * 64 + bit;
                let held = self.pos.get_mut(cell)?;
                let id = u32::try_from(cell).ok()?;
                *word &= !(1u64 << bit);
                *held = pos;
                self.n_free = self.n_free.saturating_sub(1);
                self.hint = cell + 1;
                self.used_end = self.used_end.max(cell + 1);
                return Some(id);
            }
            w += 1;
        }
        self.hint = self.n_cells;
        None
    }

    fn owner_word(&self, cell: usize, ix: usize) -> Option<u64> {
        self.owners
            .get(cell.checked_mul(self.words)? + ix / 64)
            .copied()
    }

    pub(crate) fn owns(&self, cell: usize, ix: usize) -> bool {
        self.owner_word(cell, ix)
            .is_some_and(|w| w & (1u64 << (ix % 64)) != 0)
    }

    /// The owner word range of `cell`.
    pub(crate) fn owner_words(&self, cell: usize) -> &[u64] {
        let start = cell.saturating_mul(self.words);
        self.owners
            .get(start..start.saturating_add(self.words))
            .unwrap_or(&[])
    }

    /// Sets `ix`'s bit on an occupied cell.
    pub(crate) fn add_owner(&mut self, cell: usize, ix: usize) {
        let idx = cell.saturating_mul(self.words).saturating_add(ix / 64);
        if let Some(w) = self.owners.get_mut(idx) {
            let bit = 1u64 << (ix % 64);
            if *w & bit == 0 {
                *w |= bit;
                if let Some(n) = self.n_owners.get_mut(cell) {
                    *n = n.saturating_add(1);
                }
            }
        }
    }

    /// Clears `ix`'s bit; a cell whose owner set empties is freed.
    pub(crate) fn remove_owner(&mut self, cell: usize, ix: usize) {
        let idx = cell.saturating_mul(self.words).saturating_add(ix / 64);
        let Some(w) = self.owners.get_mut(idx) else {
            return;
        };
        let bit = 1u64 << (ix % 64);
        if *w & bit == 0 {
            return;
        }
        *w &= !bit;
        let Some(n) = self.n_owners.get_mut(cell) else {
            return;
        };
        *n = n.saturating_sub(1);
        if *n == 0 {
            self.free(cell);
        }
    }

    fn free(&mut self, cell: usize) {
        if let Some(p) = self.pos.get_mut(cell) {
            if *p == FREE {
                return;
            }
            *p = FREE;
        }
        if let Some(word) = self.free_bits.get_mut(cell / 64) {
            *word |= 1u64 << (cell % 64);
            self.n_free = self.n_free.saturating_add(1);
            self.hint = self.hint.min(cell);
        }
    }

    pub(crate) fn used_end(&self) -> usize {
        self.used_end
    }

    /// Lowers `used_end` to one past the highest occupied cell.
    pub(crate) fn shrink_used_end(&mut self) {
        while self.used_end > 0 {
            let c = self.used_end - 1;
            let w = c / 64;
            let Some(&word) = self.free_bits.get(w) else {
                return;
            };
            let upto = c % 64 + 1;
            let mask = if upto == 64 {
                u64::MAX
            } else {
                (1u64 << upto) - 1
            };
            let occupied = !word & mask;
            if occupied == 0 {
                self.used_end = w * 64;
            } else {
                let highest = 63 - occupied.leading_zeros() as usize;
                self.used_end = w * 64 + highest + 1;
                return;
            }
        }
    }

    /// Internal consistency of this table alone (diagnostics).
    pub(crate) fn audit(&self) -> Result<(), String> {
        let mut n_free = 0usize;
        for cell in 0..self.n_cells {
            let p = self.pos.get(cell).copied().unwrap_or(FREE);
            let bit_free = self
                .free_bits
                .get(cell / 64)
                .is_some_and(|w| w & (1u64 << (cell % 64)) != 0);
            let pop: u32 = self.owner_words(cell).iter().map(|w| w.count_ones()).sum();
            let n = self.n_owners.get(cell).copied().unwrap_or(0);
            if pop != n {
                return Err(format!("cell {cell}: {pop} owner bits but count {n}"));
            }
            if (p == FREE) != bit_free {
                return Err(format!("cell {cell}: position {p} but free bit {bit_free}"));
            }
            if p == FREE {
                n_free += 1;
                if n != 0 {
                    return Err(format!("free cell {cell} has {n} owners"));
                }
                if cell < self.hint {
                    return Err(format!("free cell {cell} below the cursor {}", self.hint));
                }
            } else {
                if n == 0 {
                    return Err(format!("cell {cell} holds position {p} with no owner"));
                }
                if cell >= self.used_end {
                    return Err(format!(
                        "occupied cell {cell} at or above used_end {}",
                        self.used_end
                    ));
                }
            }
        }
        if n_free != self.n_free {
            return Err(format!(
                "free count {} but {n_free} free cells",
                self.n_free
            ));
        }
        Ok(())
    }
}
