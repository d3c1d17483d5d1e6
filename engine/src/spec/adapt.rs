//! Draft length from measured acceptance: a verification costs about one
//! step however many tokens it scores (the weights are read once), but
//! every rejected token is wasted attention and K/V writes, and at a full
//! batch the step's width is better spent on other sequences. So each
//! sequence grows its draft after a fully accepted one and shrinks it after
//! an early rejection, within `[min, max]`.

/// One sequence's current draft length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DraftLen {
    k: usize,
    min: usize,
    max: usize,
}

impl DraftLen {
    /// Starts at `max / 2` (at least `min`); `1 <= min <= max` is the caller's
    /// check.
    pub fn new(min: usize, max: usize) -> DraftLen {
        DraftLen {
            k: (max / 2).clamp(min, max),
            min,
            max,
        }
    }

    pub fn get(&self) -> usize {
        self.k
    }

    /// Records a verification of `drafted` tokens that kept `accepted`.
    pub fn record(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        if accepted == drafted {
            // Only a full draft at the current length says longer would pay.
            if drafted >= self.k {
                self.k = (self.k + 2).min(self.max);
            }
        } else if accepted * 2 < drafted {
            self.k = (accepted + 1).max(self.k / 2).clamp(self.min, self.max);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_on_full_accepts_and_shrinks_on_early_rejects_within_bounds() {
        let mut d = DraftLen::new(1, 8);
        assert_eq!(d.get(), 4);
        d.record(4, 4);
        assert_eq!(d.get(), 6);
        d.record(6, 6);
        d.record(8, 8);
        assert_eq!(d.get(), 8);
        // A short draft (the lookup found fewer) fully kept does not grow it.
        let mut e = DraftLen::new(1, 8);
        e.record(2, 2);
        assert_eq!(e.get(), 4);
        d.record(8, 0);
        assert_eq!(d.get(), 4);
        d.record(4, 0);
        d.record(2, 0);
        d.record(1, 0);
        assert_eq!(d.get(), 1);
        // A late rejection keeps the length.
        d.record(1, 1);
        d.record(3, 2);
        assert_eq!(d.get(), 3);
    }
}
