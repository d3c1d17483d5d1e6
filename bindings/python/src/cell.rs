//! `CellCache` (bookkeeping) and `KvCellCache` (plus pools), their batch and
//! planner faces, and `CellStepPlan`.

use numpy::{PyArray1, PyArray2, PyArrayMethods};
use offgraph_kv::{AttendSpec, CellCache, KvCellCache, SeqId};
use pyo3::prelude::*;

use crate::args::{index, index_list, opt_index};
use crate::config::PyCacheConfig;
use crate::errors::{borrow, borrow_mut, ErrorClass, IntoPy};
use crate::faces::face;
use crate::pools::{update_args, write_step, Inner, KvPools};
use crate::spec::{PyAttendSpec, SpecOwner};

/// The state behind a Python cell cache: bookkeeping only, or with pools.
pub type CellInner = Inner<CellCache, KvCellCache>;

const KV_KIND: &str = "KvCellCache";

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
#[pymethods]
impl PyCellCache {
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

    /// The runner's face: the sequence verbs and the step gate. The face
    /// holds a reference: it keeps the cache alive.
    fn control(slf: Bound<'_, Self>) -> CellControl {
        CellControl {
            cache: slf.unbind(),
        }
    }

    /// The backend's face: plan(layer). It keeps the cache alive.
    fn planner(slf: Bound<'_, Self>) -> CellPlanner {
        CellPlanner {
            cache: slf.unbind(),
        }
    }

    #[getter]
    fn config(slf: &Bound<'_, Self>) -> PyResult<PyCacheConfig> {
        Ok(PyCacheConfig {
            inner: borrow(slf, "config")?.inner.cells().config().clone(),
        })
    }
    fn seq_new(slf: &Bound<'_, Self>) -> PyResult<SeqId> {
        borrow_mut(slf, "seq_new")?
            .inner
            .cells_mut()
            .seq_new()
            .py_err()
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
        borrow_mut(slf, "seq_clone")?
            .inner
            .cells_mut()
            .seq_clone(src, upto)
            .py_err()
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
        borrow_mut(slf, "seq_rm")?
            .inner
            .cells_mut()
            .seq_rm(seq, p0, p1)
            .py_err()
    }
    fn seq_free(slf: &Bound<'_, Self>, seq: &Bound<'_, PyAny>) -> PyResult<()> {
        let seq = seq_id(seq, "seq")?;
        borrow_mut(slf, "seq_free")?
            .inner
            .cells_mut()
            .seq_free(seq)
            .py_err()
    }
    /// 1 + the highest position `seq` holds (0 when empty).
    fn next_pos(slf: &Bound<'_, Self>, seq: &Bound<'_, PyAny>) -> PyResult<usize> {
        let seq = seq_id(seq, "seq")?;
        borrow(slf, "next_pos")?
            .inner
            .cells()
            .next_pos(seq)
            .py_err()
    }
    fn seq_len(slf: &Bound<'_, Self>, seq: &Bound<'_, PyAny>) -> PyResult<usize> {
        let seq = seq_id(seq, "seq")?;
        borrow(slf, "seq_len")?.inner.cells().seq_len(seq).py_err()
    }
    #[getter]
    fn live_seqs(slf: &Bound<'_, Self>) -> PyResult<Vec<SeqId>> {
        Ok(borrow(slf, "live_seqs")?.inner.cells().live_seqs())
    }
    #[getter]
    fn free_cells(slf: &Bound<'_, Self>) -> PyResult<usize> {
        Ok(borrow(slf, "free_cells")?.inner.cells().free_cells())
    }
    /// Free cells of one table (`free_cells` is the tightest table's figure).
    fn free_cells_in(slf: &Bound<'_, Self>, table: &Bound<'_, PyAny>) -> PyResult<usize> {
        let table = index(table, "table")?;
        borrow(slf, "free_cells_in")?
            .inner
            .cells()
            .free_cells_in(table)
            .py_err()
    }
    #[getter]
    fn capacity(slf: &Bound<'_, Self>) -> PyResult<usize> {
        Ok(borrow(slf, "capacity")?.inner.cells().capacity())
    }
    #[getter]
    fn n_seq_max(slf: &Bound<'_, Self>) -> PyResult<usize> {
        Ok(borrow(slf, "n_seq_max")?.inner.cells().n_seq_max())
    }
    #[getter]
    fn n_tables(slf: &Bound<'_, Self>) -> PyResult<usize> {
        Ok(borrow(slf, "n_tables")?.inner.cells().n_tables())
    }
    #[getter]
    fn step_open(slf: &Bound<'_, Self>) -> PyResult<bool> {
        Ok(borrow(slf, "step_open")?.inner.cells().step_open())
    }
    /// Cells owned by two sequences or more, in `table` (default: table 0).
    #[pyo3(signature = (table=None))]
    fn shared_cells(slf: &Bound<'_, Self>, table: Option<&Bound<'_, PyAny>>) -> PyResult<usize> {
        let table = opt_index(table, "table")?.unwrap_or(0);
        borrow(slf, "shared_cells")?
            .inner
            .cells()
            .shared_cells(table)
            .py_err()
    }
    /// Which cell table a layer reads (flat layers: full; ring layers: ring).
    fn table_of(slf: &Bound<'_, Self>, layer: &Bound<'_, PyAny>) -> PyResult<usize> {
        let layer = index(layer, "layer")?;
        borrow(slf, "table_of")?
            .inner
            .cells()
            .table_of(layer)
            .py_err()
    }
    #[pyo3(signature = (n=None))]
    fn can_extend(slf: &Bound<'_, Self>, n: Option<&Bound<'_, PyAny>>) -> PyResult<bool> {
        let n = opt_index(n, "n")?.unwrap_or(1);
        Ok(borrow(slf, "can_extend")?.inner.cells().can_extend(n))
    }
    fn clear(slf: &Bound<'_, Self>) -> PyResult<()> {
        borrow_mut(slf, "clear")?.inner.cells_mut().clear();
        Ok(())
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
        match &mut this.inner {
            CellInner::Plain(c) => c.begin_step(&ids, &pos).py_err(),
            CellInner::Kv(c) => c.begin_step(&ids, &pos).py_err(),
        }
    }
    fn __repr__(slf: &Bound<'_, Self>) -> String {
        let Ok(this) = slf.try_borrow() else {
            return "CellCache(<in use>)".to_string();
        };
        let c = this.inner.cells();
        let kind = match this.inner {
            CellInner::Plain(_) => "CellCache",
            CellInner::Kv(_) => "KvCellCache",
        };
        format!(
            "{kind}(capacity={}, free_cells={}, live_seqs={:?}, step_open={})",
            c.capacity(),
            c.free_cells(),
            c.live_seqs(),
            c.step_open()
        )
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

#[pymethods]
impl PyKvCellCache {
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

    /// Writes the open step's rows of `layer` to the tokens' cells and returns
    /// the AttendSpec. `k`, `v`: as `KvSequenceCache.update` (float32, float16,
    /// bfloat16, or bfloat16 bits with `bits="bfloat16"`).
    #[pyo3(signature = (layer, k, v, *, bits=None))]
    fn update(
        slf: Bound<'_, Self>,
        layer: &Bound<'_, PyAny>,
        k: &Bound<'_, PyAny>,
        v: &Bound<'_, PyAny>,
        bits: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyAttendSpec> {
        let (layer, bits) = update_args(layer, bits)?;
        let owner = Box::new(slf.as_super().clone().unbind());
        let mut this = borrow_mut(slf.as_super(), "update")?;
        let cache = this.inner.kv_mut(KV_KIND)?;
        write_step(cache, layer, k, v, bits.as_deref())?;
        PyAttendSpec::from_cells(owner, cache, layer)
    }

    /// The open step's spec for `layer`, without writing.
    fn spec(slf: Bound<'_, Self>, layer: &Bound<'_, PyAny>) -> PyResult<PyAttendSpec> {
        let layer = index(layer, "layer")?;
        let owner = Box::new(slf.as_super().clone().unbind());
        let mut this = borrow_mut(slf.as_super(), "spec")?;
        let cache = this.inner.kv_mut(KV_KIND)?;
        PyAttendSpec::from_cells(owner, cache, layer)
    }

    #[pyo3(signature = (layer=None))]
    fn nbytes(slf: &Bound<'_, Self>, layer: Option<&Bound<'_, PyAny>>) -> PyResult<usize> {
        let layer = opt_index(layer, "layer")?;
        let this = borrow(slf.as_super(), "nbytes")?;
        this.inner.kv(KV_KIND)?.pool_bytes(layer).py_err()
    }

    fn pool_slots(slf: &Bound<'_, Self>, layer: &Bound<'_, PyAny>) -> PyResult<usize> {
        let layer = index(layer, "layer")?;
        let this = borrow(slf.as_super(), "pool_slots")?;
        this.inner.kv(KV_KIND)?.slots(layer).py_err()
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
        let this = borrow(slf.as_super(), "save_seq")?;
        let data = this.inner.kv(KV_KIND)?.save_seq(seq, upto).py_err()?;
        Ok(crate::snapshot::to_bytes(slf.py(), data))
    }

    /// Restores a `save_seq` snapshot as a new sequence; returns its id. All
    /// or nothing (`SnapshotError`, `CapacityError`; the cache unchanged).
    fn load_seq(slf: &Bound<'_, Self>, blob: &Bound<'_, PyAny>) -> PyResult<SeqId> {
        let data = crate::snapshot::data(blob, "blob")?;
        let mut this = borrow_mut(slf.as_super(), "load_seq")?;
        this.inner.kv_mut(KV_KIND)?.load_seq(&data).py_err()
    }
}

/// The runner's face of a cell cache. It holds a reference to its cache:
/// the cache stays alive (and usable through the face) while the face lives.
#[pyclass(module = "offgraph_kv")]
pub struct CellControl {
    cache: Py<PyCellCache>,
}

face! {
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

/// The backend's face of a cell cache. It keeps its cache alive.
#[pyclass(module = "offgraph_kv")]
pub struct CellPlanner {
    cache: Py<PyCellCache>,
}

face! {
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
    positions: Vec<usize>,
    seq_ids: Vec<SeqId>,
    read_len: usize,
    window: Option<usize>,
    table: usize,
}

fn stale(layer: usize) -> PyErr {
    ErrorClass::Step.err(format!(
        "the step this object was made for (layer {layer}) has been closed"
    ))
}

/// The dense `[T, read_len]` bool mask of `layer` for the open step of `owner`.
pub fn dense_mask_py<'py>(
    py: Python<'py>,
    owner: &Py<PyCellCache>,
    generation: u64,
    layer: usize,
) -> PyResult<Bound<'py, PyArray2<bool>>> {
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
    PyArray1::from_vec(py, flat).reshape([t, read_len])
}

impl SpecOwner for Py<PyCellCache> {
    fn generation(&self, py: Python<'_>) -> Option<u64> {
        let c = self.bind(py).try_borrow().ok()?;
        Some(c.inner.cells().generation())
    }
    fn dense_mask(
        &self,
        py: Python<'_>,
        generation: u64,
        layer: usize,
    ) -> PyResult<Option<Py<PyAny>>> {
        let m = dense_mask_py(py, self, generation, layer)?;
        Ok(Some(m.into_any().unbind()))
    }
    fn with_core_spec(
        &self,
        py: Python<'_>,
        generation: u64,
        layer: usize,
        what: &str,
        f: &mut dyn FnMut(&AttendSpec<'_>) -> PyResult<()>,
    ) -> PyResult<bool> {
        borrow(self.bind(py), what)?
            .inner
            .with_core_spec(generation, layer, f)
    }
}

#[pymethods]
impl PyCellStepPlan {
    /// int32 `[T]`: the cell each token writes (in this layer's table).
    #[getter]
    fn cells<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i32>> {
        PyArray1::from_slice(py, &self.cells)
    }
    #[getter]
    fn positions(&self) -> Vec<usize> {
        self.positions.clone()
    }
    #[getter]
    fn seq_ids(&self) -> Vec<SeqId> {
        self.seq_ids.clone()
    }
    #[getter]
    fn n_tokens(&self) -> usize {
        self.positions.len()
    }
    /// Cells `[0, read_len)` are the read extent.
    #[getter]
    fn read_len(&self) -> usize {
        self.read_len
    }
    #[getter]
    fn window(&self) -> Option<usize> {
        self.window
    }
    #[getter]
    fn table(&self) -> usize {
        self.table
    }
    /// bool `[T, read_len]`: token i sees cell j.
    #[getter]
    fn mask<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<bool>>> {
        dense_mask_py(py, &self.owner, self.generation, self.layer)
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
