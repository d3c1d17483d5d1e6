//! `CellCache` (bookkeeping) and `KvCellCache` (plus pools), their batch and
//! planner faces, and `CellStepPlan`.

use numpy::{PyArray1, PyArrayMethods};
use offgraph_kv::{CellCache, KvCellCache, SeqId};
use pyo3::prelude::*;

use crate::args::{index, index_list, opt_index};
use crate::config::PyCacheConfig;
use crate::errors::{borrow, borrow_mut, ErrorClass, IntoPy};
use crate::faces::face;
use crate::pools::{either, Inner};
use crate::skeleton::{cache_methods, kv_methods, read_kv, write_kv};

/// The state behind a Python cell cache: bookkeeping only, or with pools.
pub type CellInner = Inner<CellCache, KvCellCache>;

impl CellInner {
    pub fn cells(&self) -> &CellCache {
        match self {
            CellInner::Plain(c) => c,
            CellInner::Kv(c) => c.cells(),
        }
    }
    fn cells_mut(&mut self) -> &mut CellCache {
        match self {
            CellInner::Plain(c) => c,
            CellInner::Kv(c) => c.cells_mut(),
        }
    }
    pub fn dense_mask(&mut self, layer: usize) -> offgraph_kv::Result<&[u8]> {
        self.cells_mut().dense_mask(layer)
    }
    /// A Kv cache clears through its own `clear`, which gives pages back.
    fn clear(&mut self) {
        either!(self, c => c.clear())
    }
}

/// Runs `f` on the bookkeeping, borrowed shared.
fn read<R>(
    slf: &Bound<'_, PyCellCache>,
    what: &str,
    f: impl FnOnce(&CellCache) -> offgraph_kv::Result<R>,
) -> PyResult<R> {
    f(borrow(slf, what)?.inner.cells()).py_err()
}

/// Runs a mutation `f` on the bookkeeping, borrowed exclusively.
fn write<R>(
    slf: &Bound<'_, PyCellCache>,
    what: &str,
    f: impl FnOnce(&mut CellCache) -> offgraph_kv::Result<R>,
) -> PyResult<R> {
    f(borrow_mut(slf, what)?.inner.cells_mut()).py_err()
}

/// A sequence id from Python: ints beyond `SeqId` cannot be ours.
fn seq_id(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<SeqId> {
    to_seq_id(index(obj, what)?, what)
}

fn to_seq_id(v: usize, what: &str) -> PyResult<SeqId> {
    SeqId::try_from(v).map_err(|_| {
        ErrorClass::UnknownSequence.err(format!(
            "{what}: sequence {v} was not handed out by this cache"
        ))
    })
}

/// `n_cells` and `n_seq_max` (default 256) of a new cell cache.
fn sizes(
    n_cells: &Bound<'_, PyAny>,
    n_seq_max: Option<&Bound<'_, PyAny>>,
) -> PyResult<(usize, usize)> {
    let n_cells = crate::args::index_with(n_cells, "n_cells", crate::errors::config_err)?;
    let n_seq_max = match n_seq_max.filter(|o| !o.is_none()) {
        Some(o) => crate::args::index_with(o, "n_seq_max", crate::errors::config_err)?,
        None => 256,
    };
    Ok((n_cells, n_seq_max))
}

/// The fields of a cell cache's repr.
fn describe(c: &CellCache) -> String {
    format!(
        "capacity={}, free_cells={}, live_seqs={:?}, step_open={}",
        c.capacity(),
        c.free_cells(),
        c.live_seqs(),
        c.step_open()
    )
}

fn runs_py(runs: &[offgraph_kv::Run]) -> Vec<(usize, usize)> {
    runs.iter().map(|r| (r.start, r.len)).collect()
}

/// Many sequences in one pool of cells, each cell owned by a set of sequences.
///
/// Threads: every method runs whole with the GIL held, so calls from several
/// Python threads never interleave inside the cache and never see a torn
/// state. The one exception is `attend`, which releases the GIL while it
/// computes and keeps a shared borrow of the cache meanwhile: reads
/// (`seq_len`, `planner().plan`, `CellStepPlan.visible`, another `attend`)
/// proceed, and a call that mutates (`seq_*`, `begin_step`, `clear`, `update`,
/// `KvCellCache.spec`, and `CellStepPlan.mask`/`AttendSpec.mask`, which
/// memoize the mask) from another thread is refused with `StepError` ("the
/// cache is in use ...") and changes nothing. Retry after the attend returns,
/// or serialize the threads with your own lock. The `control()` and
/// `planner()` faces hold a reference: they keep the cache alive.
#[pyclass(module = "offgraph_kv", name = "CellCache", subclass)]
pub struct PyCellCache {
    pub inner: CellInner,
}

// Every method takes `slf: &Bound<Self>` and borrows through `borrow`/`borrow_mut`, so a
// borrow conflict is a `StepError`, never PyO3's `RuntimeError` or a panic.
// Arguments are converted before the borrow.
cache_methods! {
    PyCellCache(cells): CellCache, KvCellCache;
    spec_exclusive = true, dense_mask = Some(dense_mask_py), repr = describe;
    /// The runner's face: the sequence verbs and the step gate. The face
    /// holds a reference: it keeps the cache alive.
    control -> CellControl;
    /// The backend's face: plan(layer). It keeps the cache alive.
    planner -> CellPlanner;
    get {
        live_seqs: Vec<SeqId>,
        free_cells: usize,
        capacity: usize,
        n_seq_max: usize,
        n_tables: usize,
        step_open: bool,
    }
    call {
        fn seq_new() -> SeqId = write;
        fn seq_free(seq: seq_id) -> () = write;
        /// 1 + the highest position `seq` holds (0 when empty).
        fn next_pos(seq: seq_id) -> usize = read;
        fn seq_len(seq: seq_id) -> usize = read;
        /// Free cells of one table (`free_cells` is the tightest table's figure).
        fn free_cells_in(table: index) -> usize = read;
        /// Which cell table a layer reads (flat layers: full; ring layers: ring).
        fn table_of(layer: index) -> usize = read;
    }

    #[new]
    #[pyo3(signature = (cfg, n_cells, n_seq_max=None))]
    fn new(
        cfg: PyRef<'_, PyCacheConfig>,
        n_cells: &Bound<'_, PyAny>,
        n_seq_max: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let (n_cells, n_seq_max) = sizes(n_cells, n_seq_max)?;
        Ok(PyCellCache {
            inner: CellInner::Plain(
                CellCache::new(cfg.inner.clone(), n_cells, n_seq_max).py_err()?,
            ),
        })
    }
    /// A new sequence owning `src`'s cells with position < `upto` (all when
    /// None): sets a bit per cell, copies no K/V.
    #[pyo3(signature = (src, upto=None))]
    fn seq_clone(
        slf: &Bound<'_, Self>,
        src: &Bound<'_, PyAny>,
        upto: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<SeqId> {
        let src = seq_id(src, "src")?;
        let upto = opt_index(upto, "upto")?;
        write(slf, "seq_clone", |c| c.seq_clone(src, upto))
    }
    /// Drops `seq`'s positions in [p0, p1) (p1=None: to the end).
    #[pyo3(signature = (seq, p0=None, p1=None))]
    fn seq_rm(
        slf: &Bound<'_, Self>,
        seq: &Bound<'_, PyAny>,
        p0: Option<&Bound<'_, PyAny>>,
        p1: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let seq = seq_id(seq, "seq")?;
        let p0 = opt_index(p0, "p0")?.unwrap_or(0);
        let p1 = opt_index(p1, "p1")?;
        write(slf, "seq_rm", |c| c.seq_rm(seq, p0, p1))
    }
    /// Cells owned by two sequences or more, in `table` (default: table 0).
    #[pyo3(signature = (table=None))]
    fn shared_cells(slf: &Bound<'_, Self>, table: Option<&Bound<'_, PyAny>>) -> PyResult<usize> {
        let table = opt_index(table, "table")?.unwrap_or(0);
        read(slf, "shared_cells", |c| c.shared_cells(table))
    }
    /// Checks every invariant of the bookkeeping (diagnostics and tests;
    /// O(n_cells x words + held entries)): None when they hold, else the
    /// first violation.
    fn audit(slf: &Bound<'_, Self>) -> PyResult<Option<String>> {
        Ok(borrow(slf, "audit")?.inner.cells().audit().err())
    }
    /// Admission and placement, all or nothing: one entry per token.
    fn begin_step(
        slf: &Bound<'_, Self>,
        seq_ids: &Bound<'_, PyAny>,
        positions: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let ids = index_list(seq_ids, "seq_ids")?;
        let ids: Vec<SeqId> = ids
            .into_iter()
            .map(|v| to_seq_id(v, "seq_ids"))
            .collect::<PyResult<_>>()?;
        let pos = index_list(positions, "positions")?;
        let mut this = borrow_mut(slf, "begin_step")?;
        either!(&mut this.inner, c => c.begin_step(&ids, &pos)).py_err()
    }
}

impl PyCellCache {
    /// The plan object for `layer` of the open step.
    fn plan(slf: &Bound<'_, Self>, layer: &Bound<'_, PyAny>) -> PyResult<PyCellStepPlan> {
        let layer = index(layer, "layer")?;
        let this = borrow(slf, "plan")?;
        let c = this.inner.cells();
        let p = c.plan(layer).py_err()?;
        Ok(PyCellStepPlan {
            owner: slf.clone().unbind(),
            generation: c.generation(),
            layer,
            cells: p.cells().iter().map(|&x| x as i32).collect(),
            positions: p.positions().to_vec(),
            seq_ids: p.seq_ids().to_vec(),
            read_len: p.read_len(),
            window: p.window(),
            table: p.table(),
        })
    }
}

/// A CellCache plus per-layer K/V pools.
#[pyclass(module = "offgraph_kv", name = "KvCellCache", extends = PyCellCache)]
pub struct PyKvCellCache;

kv_methods! {
    PyKvCellCache;
    /// Writes the open step's rows of `layer` to the tokens' cells and returns
    /// the AttendSpec. `k`, `v`: as `KvSequenceCache.update` (float32, float16,
    /// bfloat16, or bfloat16 bits with `bits="bfloat16"`).
    update,
    /// The open step's spec for `layer`, without writing. `StepError` when no
    /// step is open or the open step has not updated `layer` yet.
    spec,
    nbytes,
    pool_slots;

    #[new]
    #[pyo3(signature = (cfg, n_cells, n_seq_max=None))]
    fn new(
        cfg: PyRef<'_, PyCacheConfig>,
        n_cells: &Bound<'_, PyAny>,
        n_seq_max: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyClassInitializer<Self>> {
        let (n_cells, n_seq_max) = sizes(n_cells, n_seq_max)?;
        let kv = KvCellCache::new(cfg.inner.clone(), n_cells, n_seq_max).py_err()?;
        Ok(PyClassInitializer::from(PyCellCache {
            inner: CellInner::Kv(kv),
        })
        .add_subclass(PyKvCellCache))
    }

    /// A snapshot (bytes) of `seq`'s positions below `upto` (`None`: all),
    /// restored by `load_seq` here or in a cache of the same layout.
    #[pyo3(signature = (seq, upto=None))]
    fn save_seq(
        slf: &Bound<'_, Self>,
        seq: &Bound<'_, PyAny>,
        upto: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<pyo3::types::PyBytes>> {
        let seq = seq_id(seq, "seq")?;
        let upto = opt_index(upto, "upto")?;
        let data = read_kv(slf.as_super(), "save_seq", |c| c.save_seq(seq, upto))?;
        Ok(crate::snapshot::to_bytes(slf.py(), data))
    }

    /// Restores a `save_seq` snapshot as a new sequence; returns its id. All
    /// or nothing (`SnapshotError`, `CapacityError`; the cache unchanged).
    fn load_seq(slf: &Bound<'_, Self>, blob: &Bound<'_, PyAny>) -> PyResult<SeqId> {
        let data = crate::snapshot::data(blob, "blob")?;
        write_kv(slf.as_super(), "load_seq", |c| c.load_seq(&data))
    }

    /// A chunk snapshot (bytes) of `seq`'s positions `[start, end)`, all of
    /// which it must hold: flat rows of the whole range, ring rows of what the
    /// ring table still holds of it (its tail). Chunks of `[0, e1), [e1, e2),
    /// ...` restore as one sequence with `load_seq_chunks`. The GIL is
    /// released for the copy.
    fn save_seq_chunk(
        slf: &Bound<'_, Self>,
        seq: &Bound<'_, PyAny>,
        start: &Bound<'_, PyAny>,
        end: &Bound<'_, PyAny>,
    ) -> PyResult<Py<pyo3::types::PyBytes>> {
        let seq = seq_id(seq, "seq")?;
        let (start, end) = (index(start, "start")?, index(end, "end")?);
        let py = slf.py();
        let this = borrow(slf.as_super(), "save_seq_chunk")?;
        let kv = this.inner.kv("KvCellCache")?;
        let data = py.detach(|| kv.save_seq_chunk(seq, start, end)).py_err()?;
        drop(this);
        Ok(crate::snapshot::to_bytes(py, data))
    }

    /// Restores chunk snapshots `parts` (a list of `save_seq_chunk` bytes
    /// covering `[0, end)` end to end) as one new sequence; returns its id.
    /// All or nothing: damaged, foreign, non-consecutive or ring-incomplete
    /// parts are `SnapshotError`, no room `CapacityError`; the cache is
    /// unchanged. The GIL is released for the copy.
    fn load_seq_chunks(slf: &Bound<'_, Self>, parts: &Bound<'_, PyAny>) -> PyResult<SeqId> {
        if !(parts.is_instance_of::<pyo3::types::PyList>()
            || parts.is_instance_of::<pyo3::types::PyTuple>())
        {
            return Err(crate::errors::dtype_err(format!(
                "parts: expected a list or tuple of bytes, got {}",
                parts.get_type().name()?
            )));
        }
        let data = crate::snapshot::chain(parts)?;
        let slices: Vec<&[u8]> = data.iter().map(|d| &**d).collect();
        let py = slf.py();
        let mut this = borrow_mut(slf.as_super(), "load_seq_chunks")?;
        let kv = this.inner.kv_mut("KvCellCache")?;
        py.detach(|| kv.load_seq_chunks(&slices)).py_err()
    }

    /// Gives back to the OS the pool pages no live cell touches (rows of
    /// freed cells), and lowers `nbytes()` to the highest live cell. Changes
    /// no bookkeeping. O(n_cells): call it after freeing sequences, not per
    /// step. Pools that grow by copying keep their memory until `clear()`.
    fn trim(slf: &Bound<'_, Self>) -> PyResult<()> {
        write_kv(slf.as_super(), "trim", |c| c.trim())
    }
}

face! {
    /// The runner's face of a cell cache. It holds a reference to its cache:
    /// the cache stays alive (and usable through the face) while the face lives.
    CellControl => PyCellCache, repr "CellControl";
    fn seq_new() -> PyResult<SeqId>;
    #[pyo3(signature = (src, upto=None))]
    fn seq_clone(src: &Bound<'_, PyAny>, upto: Option<&Bound<'_, PyAny>>) -> PyResult<SeqId>;
    #[pyo3(signature = (seq, p0=None, p1=None))]
    fn seq_rm(
        seq: &Bound<'_, PyAny>,
        p0: Option<&Bound<'_, PyAny>>,
        p1: Option<&Bound<'_, PyAny>>
    ) -> PyResult<()>;
    fn seq_free(seq: &Bound<'_, PyAny>) -> PyResult<()>;
    fn next_pos(seq: &Bound<'_, PyAny>) -> PyResult<usize>;
    fn seq_len(seq: &Bound<'_, PyAny>) -> PyResult<usize>;
    #[getter]
    fn free_cells() -> PyResult<usize>;
    #[getter]
    fn capacity() -> PyResult<usize>;
    #[getter]
    fn live_seqs() -> PyResult<Vec<SeqId>>;
    #[pyo3(signature = (n=None))]
    fn can_extend(n: Option<&Bound<'_, PyAny>>) -> PyResult<bool>;
    fn clear() -> PyResult<()>;
    fn begin_step(seq_ids: &Bound<'_, PyAny>, positions: &Bound<'_, PyAny>) -> PyResult<()>;
}

face! {
    /// The backend's face of a cell cache. It keeps its cache alive.
    CellPlanner => PyCellCache;
    fn plan(layer: &Bound<'_, PyAny>) -> PyResult<PyCellStepPlan>;
}

/// One layer's view of an open cell step. `cells` is a snapshot; `mask` and
/// `visible(i)` read the cache and raise `StepError` once the step is closed.
#[pyclass(module = "offgraph_kv", name = "CellStepPlan", frozen)]
pub struct PyCellStepPlan {
    owner: Py<PyCellCache>,
    generation: u64,
    layer: usize,
    cells: Vec<i32>,
    #[pyo3(get)]
    positions: Vec<usize>,
    #[pyo3(get)]
    seq_ids: Vec<SeqId>,
    /// Cells `[0, read_len)` are the read extent.
    #[pyo3(get)]
    read_len: usize,
    #[pyo3(get)]
    window: Option<usize>,
    #[pyo3(get)]
    table: usize,
}

fn stale(layer: usize) -> PyErr {
    ErrorClass::Step.err(format!(
        "the step this object was made for (layer {layer}) has been closed"
    ))
}

/// The dense `[T, read_len]` bool mask of `layer` for the open step of `owner`.
pub fn dense_mask_py(
    owner: &Py<PyCellCache>,
    py: Python<'_>,
    generation: u64,
    layer: usize,
) -> PyResult<Py<PyAny>> {
    let mut c = borrow_mut(owner.bind(py), "mask")?;
    if c.inner.cells().generation() != generation {
        return Err(stale(layer));
    }
    let (t, read_len) = {
        let p = c.inner.cells().plan(layer).py_err()?;
        (p.n_tokens(), p.read_len())
    };
    let bytes = c.inner.dense_mask(layer).py_err()?;
    let flat: Vec<bool> = bytes.iter().map(|&b| b != 0).collect();
    let mask = PyArray1::from_vec(py, flat).reshape([t, read_len])?;
    Ok(mask.into_any().unbind())
}

#[pymethods]
impl PyCellStepPlan {
    /// int32 `[T]`: the cell each token writes (in this layer's table).
    #[getter]
    fn cells<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i32>> {
        PyArray1::from_slice(py, &self.cells)
    }
    #[getter]
    fn n_tokens(&self) -> usize {
        self.positions.len()
    }
    /// bool `[T, read_len]`: token i sees cell j.
    #[getter]
    fn mask(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        dense_mask_py(&self.owner, py, self.generation, self.layer)
    }
    /// Token i's visible cells as sorted runs `(start, length)`.
    fn visible(&self, py: Python<'_>, i: &Bound<'_, PyAny>) -> PyResult<Vec<(usize, usize)>> {
        let i = index(i, "i")?;
        let c = borrow(self.owner.bind(py), "visible")?;
        if c.inner.cells().generation() != self.generation {
            return Err(stale(self.layer));
        }
        let p = c.inner.cells().plan(self.layer).py_err()?;
        Ok(runs_py(&p.visible(i).py_err()?))
    }
    fn __repr__(&self) -> String {
        format!(
            "CellStepPlan(layer={}, cells={:?}, positions={:?}, seq_ids={:?}, read_len={}, window={})",
            self.layer, self.cells, self.positions, self.seq_ids, self.read_len, crate::args::py_opt(self.window)
        )
    }
}
