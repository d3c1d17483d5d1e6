//! Ring arithmetic for Python: the core's `window` module, so that the demo and
//! the transformers adapter never repeat its formulas.

use pyo3::prelude::*;

use crate::args::{index, opt_index};
use crate::config::PyCacheConfig;
use crate::errors::IntoPy;

/// Positions a ring layer keeps for steps of up to `max_step` tokens:
/// `window + max_step - 1`.
#[pyfunction]
pub fn ring_keep(window: &Bound<'_, PyAny>, max_step: &Bound<'_, PyAny>) -> PyResult<usize> {
    Ok(offgraph_kv::window::ring_keep(
        index(window, "window")?,
        index(max_step, "max_step")?,
    ))
}

/// The first position a query at `pos` sees: `max(pos + 1 - window, 0)`, or 0
/// for a flat layer (`window=None`).
#[pyfunction]
#[pyo3(signature = (pos, window=None))]
pub fn first_visible(pos: &Bound<'_, PyAny>, window: Option<&Bound<'_, PyAny>>) -> PyResult<usize> {
    Ok(offgraph_kv::window::first_visible(
        index(pos, "pos")?,
        opt_index(window, "window")?,
    ))
}

/// Cells a `CellCache` of `cfg` needs for `n_seqs` sequences forked from one
/// `prefix`-token sequence, each then growing by `new_tokens` positions. A
/// count that overflows the platform's size is `InvalidArgumentError`.
#[pyfunction]
pub fn cells_for_forks(
    cfg: &Bound<'_, PyCacheConfig>,
    prefix: &Bound<'_, PyAny>,
    n_seqs: &Bound<'_, PyAny>,
    new_tokens: &Bound<'_, PyAny>,
) -> PyResult<usize> {
    cfg.get()
        .inner
        .try_cells_for_forks(
            index(prefix, "prefix")?,
            index(n_seqs, "n_seqs")?,
            index(new_tokens, "new_tokens")?,
        )
        .py_err()
}
