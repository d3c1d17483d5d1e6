//! The per-layer plan of one sequence step.

use crate::config::LayerPolicy;
use crate::runs::{MaskKind, Runs};

/// Where one step's rows go and what its queries read, for one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqStepPlan {
    /// Logical position of the step's first token.
    pub position: usize,
    pub n_tokens: usize,
    /// Slots the step's rows land in, in token order (two runs when a ring wraps).
    pub write: Runs,
    /// Slots holding the visible history plus the step, oldest first.
    pub read: Runs,
    /// Logical position of the first read row (RoPE and masks need it once a ring evicted).
    pub read_base_pos: usize,
    pub mask: MaskKind,
    /// The layer's pool depth in slots.
    pub depth: usize,
    pub policy: LayerPolicy,
}

impl SeqStepPlan {
    pub(crate) fn build(policy: LayerPolicy, depth: usize, position: usize, n: usize) -> Self {
        let end = position.saturating_add(n);
        match policy {
            LayerPolicy::Flat => SeqStepPlan {
                position,
                n_tokens: n,
                write: Runs::ring(position, n, depth),
                read: Runs::ring(0, end, depth),
                read_base_pos: 0,
                // One query sees every row; several see a lower-right causal mask.
                mask: if n == 1 {
                    MaskKind::None
                } else {
                    MaskKind::Causal
                },
                depth,
                policy,
            },
            LayerPolicy::Ring { window } => {
                // The earliest query (at `position`) needs keys from position - window + 1.
                let lo = crate::window::first_visible(position, Some(window));
                let mask = if n == 1 {
                    MaskKind::None
                } else if end.saturating_sub(lo) <= window {
                    // Every read row is within the window of every query.
                    MaskKind::Causal
                } else {
                    MaskKind::Window(window)
                };
                SeqStepPlan {
                    position,
                    n_tokens: n,
                    write: Runs::ring(position, n, depth),
                    read: Runs::ring(lo, end.saturating_sub(lo), depth),
                    read_base_pos: lo,
                    mask,
                    depth,
                    policy,
                }
            }
        }
    }

    /// The window of a ring layer, `None` for a flat one.
    pub fn window(&self) -> Option<usize> {
        self.policy.window()
    }

    /// Rows in the read runs.
    pub fn valid_len(&self) -> usize {
        self.read.total()
    }
}
