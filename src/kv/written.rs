//! Which layers the open step has written. A layer's spec (and so its
//! attention) is served only once the open step has written it: before that,
//! its pool holds an earlier step's rows (or zeros) where this step's keys
//! belong, and a runtime that forgot an update must hear it, not get
//! plausible numbers.

use crate::error::{CacheError, Result};

/// Per layer, the step generation that last wrote it.
#[derive(Debug, Clone)]
pub(crate) struct Written(Vec<Option<u64>>);

impl Written {
    pub(crate) fn new(n_layers: usize) -> Self {
        Written(vec![None; n_layers])
    }

    /// `layer` was written in the step of `generation`.
    pub(crate) fn mark(&mut self, layer: usize, generation: u64) {
        if let Some(w) = self.0.get_mut(layer) {
            *w = Some(generation);
        }
    }

    /// `StepProtocol` unless `layer` was written in the step of `generation`.
    pub(crate) fn check(&self, layer: usize, generation: u64) -> Result<()> {
        if self.0.get(layer).copied().flatten() == Some(generation) {
            return Ok(());
        }
        Err(CacheError::StepProtocol(format!(
            "layer {layer} was not updated in the open step: update it before attending (its pool holds no rows of this step)"
        )))
    }
}
