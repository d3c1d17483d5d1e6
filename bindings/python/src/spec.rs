//! `AttendSpec` for Python: the step's read metadata plus zero-copy, read-only
//! numpy views of the K and V pools.
//!
//! View lifetime: each view's base object holds a reference to the pool buffer
//! it was taken from, so growth (which allocates a new buffer), `clear`,
//! `rewind` and dropping the cache all leave earlier views readable with the
//! bytes they had. Rows a later step writes into the *same* buffer (no growth in
//! between) are visible through the view, as with any in-place cache.

use std::sync::Arc;

use numpy::ndarray::ArrayView3;
use numpy::PyArray3;
use offgraph_kv::kv::Buffer;
use offgraph_kv::{KeyLayout, KvCellCache, KvSequenceCache};
use pyo3::prelude::*;

use crate::errors::IntoPy;

/// Keeps a pool buffer alive for the numpy views based on it.
#[pyclass(module = "offgraph_kv", frozen)]
pub struct PoolBuffer {
    buf: Arc<Buffer>,
}

#[pymethods]
impl PoolBuffer {
    #[getter]
    fn nbytes(&self) -> usize {
        self.buf.len() * 4
    }
}

/// A read-only `[heads, slots, dim]` numpy view of `buf`.
pub fn view<'py>(
    py: Python<'py>,
    buf: &Arc<Buffer>,
    shape: (usize, usize, usize),
) -> PyResult<Bound<'py, PyArray3<f32>>> {
    let (h, s, d) = shape;
    if h * s * d != buf.len() {
        return Err(crate::errors::make(
            "StepError",
            format!(
                "view: shape {shape:?} does not match the buffer ({} values)",
                buf.len()
            ),
        ));
    }
    let owner = Bound::new(py, PoolBuffer { buf: buf.clone() })?;
    // SAFETY: ptr is valid for h*s*d f32 (checked above) for as long as `owner`
    // lives, and numpy keeps `owner` as the array's base.
    let arr = unsafe {
        let v = ArrayView3::from_shape_ptr((h, s, d), buf.as_ptr());
        PyArray3::borrow_from_array(&v, owner.into_any())
    };
    arr.getattr("flags")?.setattr("writeable", false)?;
    Ok(arr)
}

/// What one layer's step may read, with views of the pools.
#[pyclass(module = "offgraph_kv", name = "AttendSpec", frozen)]
pub struct PyAttendSpec {
    /// The cache that made it: attention checks the step is still open.
    pub owner: Py<PyAny>,
    pub generation: u64,
    pub layer: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub slots: usize,
    pub read: Vec<(usize, usize)>,
    pub read_base_pos: usize,
    pub positions: Vec<usize>,
    pub mask_kind: &'static str,
    pub window: Option<usize>,
    pub k_buf: Arc<Buffer>,
    pub v_buf: Arc<Buffer>,
    /// Cell steps: the read extent (cells `[0, read_len)`); their mask is explicit.
    pub cell: Option<usize>,
}

impl PyAttendSpec {
    pub fn from_seq(owner: Py<PyAny>, cache: &KvSequenceCache, layer: usize) -> PyResult<Self> {
        let spec = cache.spec(layer).py_err()?;
        let pool = cache.pool(layer).py_err()?;
        let plan = cache.plan(layer).py_err()?;
        let (k_buf, v_buf) = pool.buffers();
        let (read, read_base_pos) = match spec.keys {
            KeyLayout::Runs {
                read,
                read_base_pos,
                ..
            } => (
                read.as_slice().iter().map(|r| (r.start, r.len)).collect(),
                read_base_pos,
            ),
            KeyLayout::Cells { .. } => (Vec::new(), 0),
        };
        Ok(PyAttendSpec {
            owner,
            generation: cache.generation(),
            layer,
            n_kv_heads: spec.n_kv_heads,
            head_dim: spec.head_dim,
            slots: spec.slots,
            read,
            read_base_pos,
            positions: spec.positions.to_vec(),
            mask_kind: plan.mask.name(),
            window: plan.window(),
            k_buf,
            v_buf,
            cell: None,
        })
    }

    pub fn from_cells(owner: Py<PyAny>, cache: &KvCellCache, layer: usize) -> PyResult<Self> {
        let spec = cache.spec_prepared(layer).py_err()?;
        let plan = cache.plan(layer).py_err()?;
        let (k_buf, v_buf) = cache.pool(layer).py_err()?.buffers();
        Ok(PyAttendSpec {
            owner,
            generation: cache.generation(),
            layer,
            n_kv_heads: spec.n_kv_heads,
            head_dim: spec.head_dim,
            slots: spec.slots,
            read: vec![(0, plan.read_len())],
            read_base_pos: 0,
            positions: spec.positions.to_vec(),
            mask_kind: "explicit",
            window: plan.window(),
            k_buf,
            v_buf,
            cell: Some(plan.read_len()),
        })
    }
}

#[pymethods]
impl PyAttendSpec {
    /// Read-only view of the K pool, `[n_kv_heads, slots, head_dim]`.
    #[getter]
    fn k<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray3<f32>>> {
        view(
            py,
            &self.k_buf,
            (self.n_kv_heads, self.slots, self.head_dim),
        )
    }
    /// Read-only view of the V pool, `[n_kv_heads, slots, head_dim]`.
    #[getter]
    fn v<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray3<f32>>> {
        view(
            py,
            &self.v_buf,
            (self.n_kv_heads, self.slots, self.head_dim),
        )
    }
    #[getter]
    fn slots(&self) -> usize {
        self.slots
    }
    #[getter]
    fn layer(&self) -> usize {
        self.layer
    }
    #[getter]
    fn n_kv_heads(&self) -> usize {
        self.n_kv_heads
    }
    #[getter]
    fn head_dim(&self) -> usize {
        self.head_dim
    }
    /// Slot runs `(start, length)` holding the visible history, oldest first.
    #[getter]
    fn read(&self) -> Vec<(usize, usize)> {
        self.read.clone()
    }
    #[getter]
    fn read_base_pos(&self) -> usize {
        self.read_base_pos
    }
    /// Logical position of each query token.
    #[getter]
    fn positions(&self) -> Vec<usize> {
        self.positions.clone()
    }
    /// "none" | "causal" | "window" (sequence steps), "explicit" (cell steps).
    #[getter]
    fn mask_kind(&self) -> &'static str {
        self.mask_kind
    }
    #[getter]
    fn window(&self) -> Option<usize> {
        self.window
    }
    /// Cell steps: the dense bool mask `[T, read_len]` (built on first request,
    /// `StepError` once the step closed). Sequence steps: `None` (their mask is
    /// analytic: see `mask_kind` and `window`).
    #[getter]
    fn mask(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        if self.cell.is_none() {
            return Ok(None);
        }
        let owner = self
            .owner
            .bind(py)
            .cast::<crate::cell::PyCellCache>()?
            .clone()
            .unbind();
        let m = crate::cell::dense_mask_py(py, &owner, self.generation, self.layer)?;
        Ok(Some(m.into_any().unbind()))
    }
    /// Whether the step this spec was made for is still open.
    #[getter]
    fn is_current(&self, py: Python<'_>) -> bool {
        crate::attention::current_generation(py, &self.owner) == Some(self.generation)
    }
    fn __repr__(&self) -> String {
        format!(
            "AttendSpec(layer={}, slots={}, read={:?}, read_base_pos={}, positions={:?}, mask_kind={:?}, window={})",
            self.layer, self.slots, self.read, self.read_base_pos, self.positions, self.mask_kind, crate::args::py_opt(self.window)
        )
    }
}
