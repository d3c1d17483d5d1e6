//! What each token of the open step sees, memoized per distinct policy: the
//! visible cells as runs (what attention reads) and, on request, the same as a
//! dense `[T, read_len]` mask. One memo with one invalidation: every entry is
//! keyed by the step generation it was built for, so opening or closing a step
//! makes it stale without touching it, and its buffers are reused.

use std::fmt;

use super::{plan, CellCache};
use crate::error::{CacheError, Result};
use crate::runs::Run;

/// One distinct policy's visibility for one step (derived data: neither
/// compared nor printed in full).
#[derive(Clone, Default)]
pub(super) struct Views {
    /// Generation the runs were built for (`None`: never).
    runs_for: Option<u64>,
    /// Token i sees `runs[offsets[i]..offsets[i + 1]]`.
    offsets: Vec<usize>,
    runs: Vec<Run>,
    /// Generation the dense mask was built for.
    mask_for: Option<u64>,
    mask: Vec<u8>,
}

impl fmt::Debug for Views {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Views")
            .field("runs_for", &self.runs_for)
            .field("mask_for", &self.mask_for)
            .finish()
    }
}

impl PartialEq for Views {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl CellCache {
    fn views_mut(&mut self, layer: usize) -> Result<&mut Views> {
        let pi = self.policy_index(layer)?;
        // The error only on the error path: this runs every step, allocation-free.
        let table = &self.table;
        self.views
            .get_mut(pi)
            .ok_or_else(|| table.layer_error(layer))
    }

    /// Builds the open step's visible runs of `layer`'s policy, once per step
    /// (in time proportional to what the step's sequences hold).
    pub fn build_runs(&mut self, layer: usize) -> Result<()> {
        let gen = self.generation;
        self.plan(layer)?; // refuses a closed step before anything changes
        let v = self.views_mut(layer)?;
        if v.runs_for == Some(gen) {
            return Ok(());
        }
        // Taken out so the plan can borrow the cache while they fill.
        let mut offsets = std::mem::take(&mut v.offsets);
        let mut runs = std::mem::take(&mut v.runs);
        v.runs_for = None;
        offsets.clear();
        runs.clear();
        offsets.push(0);
        let filled = (|| {
            let plan = self.plan(layer)?;
            for i in 0..plan.n_tokens() {
                plan.visible_in_order_into(i, &mut runs)?;
                offsets.push(runs.len());
            }
            Ok(())
        })();
        let v = self.views_mut(layer)?;
        v.offsets = offsets;
        v.runs = runs;
        if filled.is_ok() {
            v.runs_for = Some(gen);
        }
        filled
    }

    /// The open step's visible runs of `layer` (token i sees
    /// `runs[offsets[i]..offsets[i + 1]]`), once [`Self::build_runs`] ran for
    /// it in this step; `StepProtocol` otherwise.
    pub fn runs(&self, layer: usize) -> Result<(&[usize], &[Run])> {
        let pi = self.policy_index(layer)?;
        match self.views.get(pi) {
            Some(v) if self.step_open && v.runs_for == Some(self.generation) => {
                Ok((&v.offsets, &v.runs))
            }
            _ => Err(CacheError::StepProtocol(format!(
                "runs: layer {layer}'s visibility is not built for an open step"
            ))),
        }
    }

    /// The open step's dense mask for `layer`: `[T, read_len]` row-major, 1 where
    /// token i sees cell j. Built on the first call for each distinct policy of
    /// the step, then served from memory (buffers are reused across steps).
    pub fn dense_mask(&mut self, layer: usize) -> Result<&[u8]> {
        let (t, read_len, window, table) = {
            let pl = self.plan(layer)?;
            (pl.n_tokens(), pl.read_len(), pl.window(), pl.table())
        };
        let gen = self.generation;
        let pi = self.policy_index(layer)?;
        let built = self.views.get(pi).is_some_and(|v| v.mask_for == Some(gen));
        if !built {
            let size = t.checked_mul(read_len).ok_or_else(|| {
                CacheError::OutOfCapacity(format!("dense_mask: {t} x {read_len} overflows"))
            })?;
            let mut buf = std::mem::take(&mut self.views_mut(layer)?.mask);
            buf.clear();
            buf.resize(size, 0);
            for (i, (&ix, &p)) in self.step_indices.iter().zip(&self.step_pos).enumerate() {
                let Some(list) = self.seqs.get(ix as usize).and_then(|s| s.lists.get(table)) else {
                    continue;
                };
                // i < t and cell < read_len, so row + cell < t * read_len (checked above).
                let row = i.saturating_mul(read_len);
                for e in plan::visible_range(list, p, window) {
                    if let Some(b) = buf.get_mut(row.saturating_add(e.cell as usize)) {
                        *b = 1;
                    }
                }
            }
            let v = self.views_mut(layer)?;
            v.mask = buf;
            v.mask_for = Some(gen);
        }
        Ok(self.views_mut(layer)?.mask.as_slice())
    }
}
