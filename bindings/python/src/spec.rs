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
use offgraph_kv::{AttendSpec, CellStepPlan, KeyLayout, KvDtype, SeqStepPlan};
use pyo3::prelude::*;

/// Keeps a pool buffer alive for the numpy views based on it.
#[pyclass(module = "offgraph_kv", frozen)]
pub struct PoolBuffer {
    buf: Arc<Buffer>,
}

#[pymethods]
impl PoolBuffer {
    #[getter]
    fn nbytes(&self) -> usize {
        self.buf.len()
    }
}

/// A read-only numpy view of `buf` holding `[heads, slots, head_dim]` values of
/// `dtype`: float32 and float16 pools as those numpy types, bfloat16 as
/// `ml_dtypes.bfloat16` when it imports (else uint16 bits), q8_0 as uint8
/// `[heads, slots, head_dim / 32 * 34]` blocks.
pub fn view<'py>(
    py: Python<'py>,
    buf: &Arc<Buffer>,
    dtype: KvDtype,
    shape: (usize, usize, usize),
) -> PyResult<Bound<'py, PyAny>> {
    let (h, s, d) = shape;
    let row = dtype.row_bytes(d);
    if h * s * row != buf.len() {
        return Err(crate::errors::ErrorClass::Step.err(format!(
            "view: shape {shape:?} of {} does not match the buffer ({} bytes)",
            dtype.name(),
            buf.len()
        )));
    }
    let owner = Bound::new(py, PoolBuffer { buf: buf.clone() })?;
    // SAFETY: ptr is valid for h*s*row bytes (checked above) for as long as
    // `owner` lives, and numpy keeps `owner` as the array's base.
    let arr = unsafe {
        let v = ArrayView3::from_shape_ptr((h, s, row), buf.as_ptr());
        PyArray3::borrow_from_array(&v, owner.into_any())
    };
    arr.getattr("flags")?.setattr("writeable", false)?;
    let np = py.import("numpy")?;
    let as_type = |t: Bound<'py, PyAny>| arr.call_method1("view", (t,));
    match dtype {
        KvDtype::Float32 => as_type(np.getattr("float32")?),
        KvDtype::Float16 => as_type(np.getattr("float16")?),
        KvDtype::Bfloat16 => match py.import("ml_dtypes") {
            Ok(m) => as_type(m.getattr("bfloat16")?),
            Err(_) => as_type(np.getattr("uint16")?),
        },
        KvDtype::Q8_0 => Ok(arr.into_any()),
    }
}

/// The cache a spec was made for, as the spec and `attend` need it. `pools`
/// implements it for both Python cache classes, so this module names neither
/// and the bindings' module dependencies point one way.
pub trait SpecOwner: Send + Sync {
    /// The cache's step generation now (None while it is mutably borrowed).
    fn generation(&self, py: Python<'_>) -> Option<u64>;
    /// The dense bool mask of `layer` for step `generation`; None for a cache
    /// whose mask is analytic.
    fn dense_mask(
        &self,
        py: Python<'_>,
        generation: u64,
        layer: usize,
    ) -> PyResult<Option<Py<PyAny>>>;
    /// Runs `f` on the core spec of `layer` with the cache borrowed (a busy
    /// cache is refused with `what`); `Ok(false)`, without running `f`, when
    /// step `generation` has closed or the cache has no pools.
    fn with_core_spec(
        &self,
        py: Python<'_>,
        generation: u64,
        layer: usize,
        what: &str,
        f: &mut dyn FnMut(&AttendSpec<'_>) -> PyResult<()>,
    ) -> PyResult<bool>;
}

/// What one layer's step may read, with views of the pools.
#[pyclass(module = "offgraph_kv", name = "AttendSpec", frozen)]
pub struct PyAttendSpec {
    /// The cache that made it: attention checks the step is still open.
    pub owner: Box<dyn SpecOwner>,
    pub generation: u64,
    #[pyo3(get)]
    pub layer: usize,
    #[pyo3(get)]
    pub n_kv_heads: usize,
    #[pyo3(get)]
    pub head_dim: usize,
    #[pyo3(get)]
    pub slots: usize,
    /// Slot runs `(start, length)` holding the visible history, oldest first.
    #[pyo3(get)]
    pub read: Vec<(usize, usize)>,
    #[pyo3(get)]
    pub read_base_pos: usize,
    /// Logical position of each query token.
    #[pyo3(get)]
    pub positions: Vec<usize>,
    /// "none" | "causal" | "window" (sequence steps), "explicit" (cell steps).
    #[pyo3(get)]
    pub mask_kind: &'static str,
    #[pyo3(get)]
    pub window: Option<usize>,
    pub k_buf: Arc<Buffer>,
    pub v_buf: Arc<Buffer>,
    pub k_dtype: KvDtype,
    pub v_dtype: KvDtype,
}

impl PyAttendSpec {
    /// The spec of `layer` for step `generation`, from the core spec, the
    /// pool buffers and the layer's window. It reads as a cell step's (mask
    /// "explicit", no read runs): `for_seq` and `for_cells` finish it.
    pub fn new(
        owner: Box<dyn SpecOwner>,
        generation: u64,
        layer: usize,
        spec: &AttendSpec<'_>,
        (k_buf, v_buf): (Arc<Buffer>, Arc<Buffer>),
        window: Option<usize>,
    ) -> Self {
        PyAttendSpec {
            owner,
            generation,
            layer,
            n_kv_heads: spec.n_kv_heads,
            head_dim: spec.head_dim,
            slots: spec.slots,
            read: Vec::new(),
            read_base_pos: 0,
            positions: spec.positions.to_vec(),
            mask_kind: "explicit",
            window,
            k_buf,
            v_buf,
            k_dtype: spec.k.dtype,
            v_dtype: spec.v.dtype,
        }
    }

    /// A sequence step's spec: its read runs and its analytic mask.
    pub fn for_seq(self, spec: &AttendSpec<'_>, plan: &SeqStepPlan) -> Self {
        let (read, read_base_pos) = match &spec.keys {
            KeyLayout::Runs {
                read,
                read_base_pos,
                ..
            } => (
                read.as_slice().iter().map(|r| (r.start, r.len)).collect(),
                *read_base_pos,
            ),
            KeyLayout::Cells { .. } => (Vec::new(), 0),
        };
        PyAttendSpec {
            read,
            read_base_pos,
            mask_kind: plan.mask.name(),
            ..self
        }
    }

    /// A view of the K or V pool, `[n_kv_heads, slots, head_dim]` rows of `dtype`.
    fn pool_view<'py>(
        &self,
        py: Python<'py>,
        buf: &Arc<Buffer>,
        dtype: KvDtype,
    ) -> PyResult<Bound<'py, PyAny>> {
        view(py, buf, dtype, (self.n_kv_heads, self.slots, self.head_dim))
    }

    /// A cell step's spec: one read run over the read extent (the core spec's
    /// keys add nothing: the mask says which cells each token sees).
    pub fn for_cells(self, _: &AttendSpec<'_>, plan: &CellStepPlan<'_>) -> Self {
        PyAttendSpec {
            read: vec![(0, plan.read_len())],
            ..self
        }
    }
}

#[pymethods]
impl PyAttendSpec {
    /// Read-only view of the K pool, `[n_kv_heads, slots, head_dim]` in its
    /// dtype (q8_0: uint8 blocks `[n_kv_heads, slots, head_dim / 32 * 34]`).
    #[getter]
    fn k<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.pool_view(py, &self.k_buf, self.k_dtype)
    }
    /// Read-only view of the V pool (see `k`).
    #[getter]
    fn v<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.pool_view(py, &self.v_buf, self.v_dtype)
    }
    /// The K pool's storage type name.
    #[getter]
    fn k_dtype(&self) -> &'static str {
        self.k_dtype.name()
    }
    /// The V pool's storage type name.
    #[getter]
    fn v_dtype(&self) -> &'static str {
        self.v_dtype.name()
    }
    /// Cell steps: the dense bool mask `[T, read_len]` (built on first request,
    /// `StepError` once the step closed). Sequence steps: `None` (their mask is
    /// analytic: see `mask_kind` and `window`).
    #[getter]
    fn mask(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        self.owner.dense_mask(py, self.generation, self.layer)
    }
    /// Whether the step this spec was made for is still open.
    #[getter]
    fn is_current(&self, py: Python<'_>) -> bool {
        self.owner.generation(py) == Some(self.generation)
    }
    fn __repr__(&self) -> String {
        format!(
            "AttendSpec(layer={}, slots={}, read={:?}, read_base_pos={}, positions={:?}, mask_kind={:?}, window={})",
            self.layer, self.slots, self.read, self.read_base_pos, self.positions, self.mask_kind, crate::args::py_opt(self.window)
        )
    }
}

/// `dequantize(view, dtype)`: a pool view (or any array of stored rows) of
/// `dtype` as a new float32 `[n_kv_heads, slots, head_dim]` array. `view` is
/// what `spec.k` / `spec.v` give: float32, float16, bfloat16 (`ml_dtypes` or
/// uint16 bits) `[h, s, head_dim]`, or q8_0 uint8 `[h, s, head_dim / 32 * 34]`.
#[pyfunction]
pub fn dequantize<'py>(
    py: Python<'py>,
    view: &Bound<'py, PyAny>,
    dtype: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyArray3<f32>>> {
    use numpy::{PyArrayDyn, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods};
    let name = crate::args::text(dtype, "dtype")?;
    let dt = KvDtype::parse(&name).map_err(|_| {
        crate::errors::dtype_err(format!(
            "dtype: expected one of \"float32\", \"float16\", \"bfloat16\", \"q8_0\", got {name:?}"
        ))
    })?;
    let arr = view
        .cast::<PyUntypedArray>()
        .map_err(|_| crate::errors::dtype_err("view: expected a numpy array of stored rows"))?;
    let got = arr.dtype().str()?.to_string();
    let want_ok = match dt {
        KvDtype::Float32 => got == "float32",
        KvDtype::Float16 => got == "float16",
        KvDtype::Bfloat16 => got == "bfloat16" || got == "uint16",
        KvDtype::Q8_0 => got == "uint8",
    };
    if !want_ok {
        return Err(crate::errors::dtype_err(format!(
            "view: a {} view has dtype {}, got {got}",
            dt.name(),
            match dt {
                KvDtype::Float32 => "float32",
                KvDtype::Float16 => "float16",
                KvDtype::Bfloat16 => "bfloat16 or uint16",
                KvDtype::Q8_0 => "uint8",
            }
        )));
    }
    let shape = arr.shape().to_vec();
    let (h, s, last) = match shape.as_slice() {
        [h, s, d] => (*h, *s, *d),
        other => {
            return Err(crate::errors::shape_err(format!(
                "view: expected shape [n_kv_heads, slots, row], got {other:?}"
            )))
        }
    };
    let head_dim = match dt {
        KvDtype::Q8_0 => {
            if !last.is_multiple_of(offgraph_kv::dtype::Q8_0_BLOCK_BYTES) {
                return Err(crate::errors::shape_err(format!(
                    "view: a q8_0 row is a multiple of 34 bytes, got {last}"
                )));
            }
            last / offgraph_kv::dtype::Q8_0_BLOCK_BYTES * offgraph_kv::dtype::QK8_0
        }
        _ => last,
    };
    let np = py.import("numpy")?;
    let bytes = np
        .call_method1("ascontiguousarray", (view,))?
        .call_method1("view", (np.getattr("uint8")?,))?;
    let bytes = bytes
        .cast::<PyArrayDyn<u8>>()
        .map_err(|_| crate::errors::dtype_err("view: not readable as bytes"))?;
    let ro = bytes.try_readonly()?;
    let src = ro
        .as_slice()
        .map_err(|e| crate::errors::shape_err(e.to_string()))?;
    let out = PyArray3::<f32>::zeros(py, [h, s, head_dim], false);
    {
        // SAFETY: `out` was just created here and no other reference to it exists.
        let dst =
            unsafe { out.as_slice_mut() }.map_err(|e| crate::errors::shape_err(e.to_string()))?;
        if !offgraph_kv::dtype::decode(dt, src, dst) {
            return Err(crate::errors::shape_err(format!(
                "view: {} bytes do not hold {h}*{s} {} rows of {head_dim}",
                src.len(),
                dt.name()
            )));
        }
    }
    Ok(out)
}
