//! The task geometry of one call: which query rows and keys each task covers.
//!
//! A task is one KV head × one block of ≤ `RB` query rows (row `r` of a KV
//! head is token `r / g`, group head `r % g`; with a cell layout a block never
//! spans tokens). Keys are never split over tasks: a row's sum then runs
//! over its keys in one fixed order whatever the thread count (see
//! `kernel/mod.rs` on invariance). [`Block`] is what a backend receives for
//! one task.

use super::softcap::Softcap;
use crate::dtype::KvRows;
use crate::runs::{MaskKind, Run, Runs};
use crate::spec::{AttendSpec, KeyLayout};

#[derive(Clone, Copy)]
enum Keys<'a> {
    Runs {
        runs: Runs,
        base: usize,
        mask: MaskKind,
        positions: &'a [usize],
    },
    Cells {
        offsets: &'a [usize],
        runs: &'a [Run],
    },
}

/// The task geometry of one call (see the module docs).
pub(super) struct Geometry<'a> {
    pub(super) q: &'a [f32],
    pub(super) k: KvRows<'a>,
    pub(super) v: KvRows<'a>,
    pub(super) hd: usize,
    pub(super) slots: usize,
    t: usize,
    g: usize,
    pub(super) n_kv: usize,
    /// `scale · log2(e)`: the kernel works in the log2 domain.
    pub(super) qscale: f32,
    /// The score cap, if any.
    pub(super) softcap: Option<Softcap>,
    keys: Keys<'a>,
    /// Rows per block.
    pub(super) rb: usize,
    /// Cells: blocks per token.
    bpt: usize,
    pub(super) blocks_per_head: usize,
    nkeys: usize,
    /// The position of concatenated key 0, modulo `KT` (runs; 0 for cells,
    /// whose keys are indexed from each token's first visible one): the
    /// kernel's tiles start where a key's position (index) is a multiple of `KT`.
    pub(super) anchor: usize,
}

// Task geometry: bounded by the validated shapes ("Arithmetic bounds" in validate.rs).
#[allow(clippy::arithmetic_side_effects)]
impl<'a> Geometry<'a> {
    pub(super) fn new(
        q: &'a [f32],
        q_shape: [usize; 3],
        spec: &AttendSpec<'a>,
        scale: f32,
        softcap: Option<Softcap>,
        rb: usize,
    ) -> Self {
        let [n_q, t, hd] = q_shape;
        let n_kv = spec.n_kv_heads;
        let g = n_q / n_kv;
        let (keys, bpt, blocks_per_head, nkeys) = match spec.keys {
            KeyLayout::Runs {
                read,
                read_base_pos,
                mask,
            } => (
                Keys::Runs {
                    runs: read,
                    base: read_base_pos,
                    mask,
                    positions: spec.positions,
                },
                0,
                (t * g).div_ceil(rb),
                read.total(),
            ),
            KeyLayout::Cells { offsets, runs, .. } => {
                let bpt = g.div_ceil(rb);
                (Keys::Cells { offsets, runs }, bpt, t * bpt, 0)
            }
        };
        let anchor = match keys {
            Keys::Runs { base, .. } => base % super::kernel::KT,
            Keys::Cells { .. } => 0,
        };
        Geometry {
            q,
            k: spec.k,
            v: spec.v,
            hd,
            slots: spec.slots,
            t,
            g,
            n_kv,
            qscale: scale * std::f32::consts::LOG2_E,
            softcap,
            keys,
            rb,
            bpt,
            blocks_per_head,
            nkeys,
            anchor,
        }
    }

    pub(super) fn n_tasks(&self) -> usize {
        self.n_kv * self.blocks_per_head
    }

    /// (kv head, block within head)
    pub(super) fn task(&self, idx: usize) -> (usize, usize) {
        (idx / self.blocks_per_head, idx % self.blocks_per_head)
    }

    /// First row (within the KV head: row `r` is token `r / g`, group head `r % g`) and count.
    pub(super) fn block_rows(&self, blk: usize) -> (usize, usize) {
        match self.keys {
            Keys::Runs { .. } => {
                let r0 = blk * self.rb;
                (r0, self.rb.min(self.t * self.g - r0))
            }
            Keys::Cells { .. } => {
                let tok = blk / self.bpt;
                let h0 = (blk % self.bpt) * self.rb;
                (tok * self.g + h0, self.rb.min(self.g - h0))
            }
        }
    }

    /// Offset of row `r` of KV head `kvh` in q / out.
    pub(super) fn row_off(&self, kvh: usize, r: usize) -> usize {
        ((kvh * self.g + r % self.g) * self.t + r / self.g) * self.hd
    }

    pub(super) fn token_runs(&self, tok: usize) -> &'a [Run] {
        match self.keys {
            Keys::Runs { .. } => &[],
            Keys::Cells { offsets, runs } => {
                let a = offsets.get(tok).copied().unwrap_or(0);
                let b = offsets.get(tok + 1).copied().unwrap_or(a);
                runs.get(a..b).unwrap_or(&[])
            }
        }
    }

    pub(super) fn segs(&self, blk: usize) -> &[Run] {
        match &self.keys {
            Keys::Runs { runs, .. } => runs.as_slice(),
            Keys::Cells { .. } => self.token_runs(blk / self.bpt),
        }
    }

    /// Visible keys `[lo, hi)` of row `r`, in concatenated key index.
    pub(super) fn interval(&self, r: usize) -> (usize, usize) {
        let tok = r / self.g;
        match self.keys {
            Keys::Runs {
                base,
                mask,
                positions,
                ..
            } => {
                let n = self.nkeys;
                let p = positions.get(tok).copied().unwrap_or(0);
                let hi_causal = p.saturating_add(1).saturating_sub(base).min(n);
                match mask {
                    MaskKind::None => (0, n),
                    MaskKind::Causal => (0, hi_causal),
                    MaskKind::Window(0) => (0, 0),
                    MaskKind::Window(w) => {
                        let lo = crate::window::first_visible(p, Some(w)).saturating_sub(base);
                        (lo.min(hi_causal), hi_causal)
                    }
                }
            }
            Keys::Cells { .. } => (0, self.token_runs(tok).iter().map(|r| r.len).sum()),
        }
    }
}

/// One unit of work: query rows of one KV head against key segments.
pub(super) struct Block<'a> {
    /// K and V rows of this KV head as stored: `slots` rows each.
    pub k: KvRows<'a>,
    pub v: KvRows<'a>,
    pub hd: usize,
    /// Scaled query rows, `nr * hd`.
    pub qs: &'a [f32],
    pub nr: usize,
    /// Visible interval `[lo, hi)` of each row, in concatenated key index.
    pub lo: &'a [usize],
    pub hi: &'a [usize],
    /// Key segments in concatenated (position) order.
    pub segs: &'a [Run],
    /// Tiles start at concatenated index `j` with `(j + anchor) % KT == 0`.
    pub anchor: usize,
    /// Applied to every score before the mask and the softmax.
    pub softcap: Option<Softcap>,
}

impl Block<'_> {
    /// The keys any row of the block sees, `[lo, hi)` in concatenated key
    /// index; `None` when that is empty.
    pub(super) fn key_span(&self) -> Option<(usize, usize)> {
        let rows = self.lo.iter().zip(self.hi).take(self.nr);
        let (lo, hi) = rows
            .filter(|(lo, hi)| lo < hi)
            .fold((usize::MAX, 0), |(a, b), (lo, hi)| (a.min(*lo), b.max(*hi)));
        (lo < hi).then_some((lo, hi))
    }
}
