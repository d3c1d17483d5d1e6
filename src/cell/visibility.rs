//! Per-step visibility of the cell cache in dense form: the `[T, read_len]`
//! mask, memoized per distinct policy for the open step.

use std::fmt;

use super::{plan, CellCache};
use crate::error::{CacheError, Result};

/// Dense masks of the open step, one buffer per distinct policy (derived data:
/// neither compared nor printed in full).
#[derive(Clone, Default)]
pub(super) struct Masks {
    pub(super) built: Vec<bool>,
    pub(super) bufs: Vec<Vec<u8>>,
}

impl fmt::Debug for Masks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Masks").field("built", &self.built).finish()
    }
}

impl PartialEq for Masks {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl CellCache {
    /// The open step's dense mask for `layer`: `[T, read_len]` row-major, 1 where
    /// token i sees cell j. Built on the first call for each distinct policy of
    /// the step, then served from memory (buffers are reused across steps).
    pub fn dense_mask(&mut self, layer: usize) -> Result<&[u8]> {
        let (t, read_len, window, table) = {
            let pl = self.plan(layer)?;
            (pl.n_tokens(), pl.read_len(), pl.window(), pl.table())
        };
        let pi = self.policy_index(layer)?;
        if !self.masks.built.get(pi).copied().unwrap_or(false) {
            let size = t.checked_mul(read_len).ok_or_else(|| {
                CacheError::OutOfCapacity(format!("dense_mask: {t} x {read_len} overflows"))
            })?;
            let Some(buf) = self.masks.bufs.get_mut(pi) else {
                return Err(self.layer_error(layer));
            };
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
            if let Some(b) = self.masks.built.get_mut(pi) {
                *b = true;
            }
        }
        self.masks
            .bufs
            .get(pi)
            .map(|b| b.as_slice())
            .ok_or_else(|| self.layer_error(layer))
    }
}
