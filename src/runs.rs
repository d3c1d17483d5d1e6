//! Runs of slots: the unit every plan and spec speaks in.

/// A contiguous range of slots (or cells): `[start, start + len)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct Run {
    pub start: usize,
    pub len: usize,
}

impl Run {
    pub fn new(start: usize, len: usize) -> Self {
        Run { start, len }
    }

    /// One past the last slot.
    pub fn end(&self) -> usize {
        self.start.saturating_add(self.len)
    }
}

/// One or two runs without a heap allocation (a ring that wraps has two).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct Runs {
    runs: [Run; 2],
    n: u8,
}

impl Runs {
    pub fn one(r: Run) -> Self {
        Runs {
            runs: [r, Run::default()],
            n: 1,
        }
    }

    pub fn two(a: Run, b: Run) -> Self {
        Runs { runs: [a, b], n: 2 }
    }

    /// The runs `[start, start+len)` of a ring of `depth` slots, split where it wraps.
    /// Empty runs are dropped, so a zero `len` gives no runs.
    pub fn ring(start: usize, len: usize, depth: usize) -> Self {
        if len == 0 || depth == 0 {
            return Runs::default();
        }
        // depth > 0 (checked above), so start < depth and first <= len.
        let start = start.checked_rem(depth).unwrap_or(0);
        let first = len.min(depth.saturating_sub(start));
        if first == len {
            Runs::one(Run::new(start, len))
        } else {
            Runs::two(
                Run::new(start, first),
                Run::new(0, len.saturating_sub(first)),
            )
        }
    }

    pub fn as_slice(&self) -> &[Run] {
        self.runs.get(..usize::from(self.n)).unwrap_or(&[])
    }

    /// Total slots covered.
    pub fn total(&self) -> usize {
        self.as_slice().iter().map(|r| r.len).sum()
    }

    pub fn len(&self) -> usize {
        usize::from(self.n)
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }
}

/// The mask a sequence step declares. Kernels apply it analytically over
/// positions; no dense mask is built for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MaskKind {
    /// Every read row is visible to every query of the step.
    None,
    /// Query at position q sees read rows at positions <= q.
    Causal,
    /// Causal and at most `w` back: q sees positions in `[q - w + 1, q]`.
    Window(usize),
}

impl MaskKind {
    /// The Python spelling.
    pub fn name(&self) -> &'static str {
        match self {
            MaskKind::None => "none",
            MaskKind::Causal => "causal",
            MaskKind::Window(_) => "window",
        }
    }

    /// Whether a key at logical position `k` is visible to a query at `q`.
    pub fn visible(&self, q: usize, k: usize) -> bool {
        match *self {
            MaskKind::None => true,
            MaskKind::Causal => k <= q,
            MaskKind::Window(w) => k <= q && k.saturating_add(w) > q,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_runs_split_on_wrap() {
        let r = Runs::ring(6, 4, 8);
        assert_eq!(r.as_slice(), &[Run::new(6, 2), Run::new(0, 2)]);
        assert_eq!(r.total(), 4);
        assert_eq!(Runs::ring(9, 3, 8).as_slice(), &[Run::new(1, 3)]);
        assert!(Runs::ring(0, 0, 8).is_empty());
    }

    #[test]
    fn window_mask_bounds() {
        let m = MaskKind::Window(3);
        assert!(m.visible(5, 3) && m.visible(5, 5));
        assert!(!m.visible(5, 2) && !m.visible(5, 6));
    }
}
