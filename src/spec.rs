//! `AttendSpec`: what the byte layer hands attention for one layer-step.
//!
//! It borrows the cache's pools, so while a spec is alive the borrow checker
//! forbids another step (or growth, clear, rewind) on that cache: a spec can
//! never point at memory that moved.

use crate::dtype::KvRows;
use crate::runs::{MaskKind, Run, Runs};

/// Which keys each query of the step sees.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KeyLayout<'a> {
    /// A sequence step: the visible history lives in `read` (slot runs, oldest
    /// first); row `r` of the concatenated runs holds logical position
    /// `read_base_pos + r`; `mask` is applied analytically against the
    /// query positions.
    Runs {
        read: Runs,
        read_base_pos: usize,
        mask: MaskKind,
    },
    /// A cell step: token `i` sees exactly the cells in
    /// `runs[offsets[i]..offsets[i + 1]]` (disjoint, in the keys' position
    /// order, oldest first: attention sums in that order, whatever the cells'
    /// order in the pool); nothing else.
    Cells {
        offsets: &'a [usize],
        runs: &'a [Run],
        /// Cells `[0, read_len)` bound every run.
        read_len: usize,
    },
}

/// K/V pools of one layer plus what one step may read of them.
///
/// `k` and `v` are the whole pools as stored, `[n_kv_heads, slots, row]`
/// row-major in their dtypes (head h's row s starts at byte
/// `(h * slots + s) * dtype.row_bytes(head_dim)`); K and V may differ in dtype. Only rows named by
/// `keys` hold live data; the rest may be anything (even NaN) and are never read.
#[derive(Debug, Clone, Copy)]
pub struct AttendSpec<'a> {
    pub k: KvRows<'a>,
    pub v: KvRows<'a>,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Row stride of the pools, in rows.
    pub slots: usize,
    /// Logical position of each query token of the step.
    pub positions: &'a [usize],
    pub keys: KeyLayout<'a>,
}

impl AttendSpec<'_> {
    /// Tokens in the step.
    pub fn n_tokens(&self) -> usize {
        self.positions.len()
    }
}
