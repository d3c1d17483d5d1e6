//! `SequenceCache` (bookkeeping) and `KvSequenceCache` (plus pools), their
//! control and planner faces, and `SeqStepPlan`.

use offgraph_kv::{KvSequenceCache, Runs, SeqStepPlan, SequenceCache};
use pyo3::prelude::*;

use crate::args::index;
use crate::config::PyCacheConfig;
use crate::errors::{borrow, borrow_mut, IntoPy};
use crate::faces::face;
use crate::pools::{either, Inner};
use crate::skeleton::{cache_methods, kv_methods, read_kv, write_kv};

/// The state behind a Python sequence cache: bookkeeping only, or with pools.
pub type SeqInner = Inner<SequenceCache, KvSequenceCache>;

impl SeqInner {
    pub fn seq(&self) -> &SequenceCache {
        match self {
            SeqInner::Plain(c) => c,
            SeqInner::Kv(c) => c.sequence(),
        }
    }
    fn begin_step(&mut self, n: usize) -> offgraph_kv::Result<usize> {
        either!(self, c => c.begin_step(n))
    }
    fn rewind(&mut self, n: usize) -> offgraph_kv::Result<()> {
        either!(self, c => c.rewind(n))
    }
    fn clear(&mut self) {
        either!(self, c => c.clear())
    }
}

/// Runs a mutation `f` on the cache's state, borrowed exclusively.
fn write<R>(
    slf: &Bound<'_, PySequenceCache>,
    what: &str,
    f: impl FnOnce(&mut SeqInner) -> offgraph_kv::Result<R>,
) -> PyResult<R> {
    f(&mut borrow_mut(slf, what)?.inner).py_err()
}

/// The fields of a sequence cache's repr.
fn describe(s: &SequenceCache) -> String {
    format!(
        "length={}, capacity={}, n_layers={}, step_open={}",
        s.length(),
        s.capacity(),
        s.config().n_layers,
        s.step_open()
    )
}

fn runs_list(r: &Runs) -> Vec<(usize, usize)> {
    r.as_slice().iter().map(|r| (r.start, r.len)).collect()
}

/// One sequence's bookkeeping: one logical length, per-layer plans.
///
/// Threads: every method runs whole with the GIL held, so calls from several
/// Python threads never interleave inside the cache and never see a torn
/// state. The one exception is `attend`, which releases the GIL while it
/// computes and keeps a shared borrow of the cache meanwhile: reads (`length`,
/// `plan`, `spec`, another `attend`) proceed, and a mutation (`begin_step`,
/// `rewind`, `clear`, `update`) from another thread is refused with
/// `StepError` ("the cache is in use ...") and changes nothing. Retry after
/// the attend returns, or serialize the threads with your own lock; the step
/// protocol (begin_step, then every layer) is the caller's to keep in order.
/// The `control()` and `planner()` faces hold a reference: they keep the
/// cache alive after every other reference to it is gone.
#[pyclass(module = "offgraph_kv", name = "SequenceCache", subclass)]
pub struct PySequenceCache {
    pub inner: SeqInner,
}

// Every method takes `slf: &Bound<Self>` and borrows through `borrow`/`borrow_mut`, so a
// borrow conflict is a `StepError`, never PyO3's `RuntimeError` or a panic.
// Arguments are converted before the borrow: Python code they run (an
// `__index__`) never sees the cache mid-call.
cache_methods! {
    PySequenceCache(seq): SequenceCache, KvSequenceCache;
    spec_exclusive = false, dense_mask = None, repr = describe;
    /// The runner's face: length, capacity, can_extend, begin_step, rewind, clear.
    /// The face holds a reference: it keeps the cache alive.
    control -> SequenceControl;
    /// The backend's face: plan(layer). It keeps the cache alive.
    planner -> SequencePlanner;
    get {
        length: usize,
        capacity: usize,
        /// Highest length reached since the last clear.
        high_water: usize,
        /// The lowest length `rewind` accepts now.
        min_rewind: usize,
        step_open: bool,
    }
    call {
        /// Admission and commit: returns the step's first position.
        fn begin_step(n_tokens: index) -> usize = write;
        fn rewind(new_len: index) -> () = write;
    }

    #[new]
    fn new(cfg: PyRef<'_, PyCacheConfig>) -> PyResult<Self> {
        Ok(PySequenceCache {
            inner: SeqInner::Plain(SequenceCache::new(cfg.inner.clone()).py_err()?),
        })
    }
    /// The open step's plan for `layer`.
    fn plan(slf: &Bound<'_, Self>, layer: &Bound<'_, PyAny>) -> PyResult<PySeqStepPlan> {
        let layer = index(layer, "layer")?;
        Ok(PySeqStepPlan(
            borrow(slf, "plan")?.inner.seq().plan(layer).py_err()?,
        ))
    }
    /// Positions `(lo, hi)` whose rows `layer` holds now: `[lo, hi)`, with or
    /// without an open step (a ring loses its oldest positions as it wraps).
    fn held_range(slf: &Bound<'_, Self>, layer: &Bound<'_, PyAny>) -> PyResult<(usize, usize)> {
        let layer = index(layer, "layer")?;
        let r = borrow(slf, "held_range")?
            .inner
            .seq()
            .held_range(layer)
            .py_err()?;
        Ok((r.start, r.end))
    }
    /// Pool slot runs `(start, length)` holding positions `[lo, hi)` of
    /// `layer`, oldest first. `InvalidArgumentError` unless the range is held.
    fn held_runs(
        slf: &Bound<'_, Self>,
        layer: &Bound<'_, PyAny>,
        lo: &Bound<'_, PyAny>,
        hi: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<(usize, usize)>> {
        let layer = index(layer, "layer")?;
        let lo = index(lo, "lo")?;
        let hi = index(hi, "hi")?;
        let runs = borrow(slf, "held_runs")?
            .inner
            .seq()
            .held_runs(layer, lo, hi)
            .py_err()?;
        Ok(runs_list(&runs))
    }
    fn __len__(slf: &Bound<'_, Self>) -> PyResult<usize> {
        Ok(borrow(slf, "len")?.inner.seq().length())
    }
}

/// A SequenceCache plus per-layer K/V pools.
#[pyclass(module = "offgraph_kv", name = "KvSequenceCache", extends = PySequenceCache)]
pub struct PyKvSequenceCache;

kv_methods! {
    PyKvSequenceCache;
    /// Writes the open step's rows of `layer` and returns its AttendSpec.
    /// `k`, `v`: `[n_kv_heads, T, head_dim]` float32, float16 or bfloat16
    /// (`ml_dtypes`), or uint16 bfloat16 bits with `bits="bfloat16"` (a leading
    /// batch of 1 is accepted; non-contiguous input is copied). Rows are rounded
    /// once into the pool's dtype. A refused call writes nothing.
    update,
    /// The open step's spec for `layer`, without writing. `StepError` when no
    /// step is open or the open step has not updated `layer` yet.
    spec,
    /// Bytes the rows need at the high-water mark since the last clear: of
    /// one layer, or of all when `layer` is None.
    nbytes,
    /// The row stride of the pool of `layer`: its depth when reserved, else
    /// the slots it has grown to (doubling up to its depth).
    pool_slots;

    #[new]
    fn new(cfg: PyRef<'_, PyCacheConfig>) -> PyResult<PyClassInitializer<Self>> {
        let kv = KvSequenceCache::new(cfg.inner.clone()).py_err()?;
        Ok(PyClassInitializer::from(PySequenceCache {
            inner: SeqInner::Kv(kv),
        })
        .add_subclass(PyKvSequenceCache))
    }

    /// A snapshot (bytes) of positions `[0, upto)` (`upto=None`: the length)
    /// that restores into an empty cache; refused when a ring layer no longer
    /// holds the tail `upto` needs. With `start`, a range `[start, upto)` (a
    /// prefix chunk) that continues a cache of length `start`, alone or in a
    /// chain (`load_state([a, b, ...])`); its ring layers carry what they still
    /// hold, so an early range may load only inside a chain.
    #[pyo3(signature = (upto=None, *, start=None))]
    fn save_state(
        slf: &Bound<'_, Self>,
        upto: Option<&Bound<'_, PyAny>>,
        start: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<pyo3::types::PyBytes>> {
        let upto = crate::args::opt_index(upto, "upto")?;
        let start = crate::args::opt_index(start, "start")?;
        let data = read_kv(slf.as_super(), "save_state", |c| match start {
            None => c.save_state(upto),
            Some(s) => c.save_range(s, upto.unwrap_or(c.length())),
        })?;
        Ok(crate::snapshot::to_bytes(slf.py(), data))
    }

    /// Restores a snapshot, or a chain of ranges (a list), all or nothing:
    /// `SnapshotError` for anything truncated, damaged, foreign, newer or not
    /// continuing this cache's length; the cache is then unchanged.
    fn load_state(slf: &Bound<'_, Self>, data: &Bound<'_, PyAny>) -> PyResult<()> {
        let chain = crate::snapshot::chain(data)?;
        let refs: Vec<&[u8]> = chain.iter().map(|b| &b[..]).collect();
        write_kv(slf.as_super(), "load_state", |c| c.load_states(&refs))
    }
}

face! {
    /// The runner's face of a sequence cache. It holds a reference to its cache:
    /// the cache stays alive (and usable through the face) while the face lives.
    SequenceControl => PySequenceCache, repr "SequenceControl";
    #[getter]
    fn length() -> PyResult<usize>;
    #[getter]
    fn capacity() -> PyResult<usize>;
    #[pyo3(signature = (n=None))]
    fn can_extend(n: Option<&Bound<'_, PyAny>>) -> PyResult<bool>;
    fn begin_step(n_tokens: &Bound<'_, PyAny>) -> PyResult<usize>;
    fn rewind(new_len: &Bound<'_, PyAny>) -> PyResult<()>;
    fn clear() -> PyResult<()>;
}

face! {
    /// The backend's face of a sequence cache. It keeps its cache alive.
    SequencePlanner => PySequenceCache, repr "SequencePlanner";
    fn plan(layer: &Bound<'_, PyAny>) -> PyResult<PySeqStepPlan>;
}

/// Where one step's rows go and what its queries read, for one layer.
#[pyclass(module = "offgraph_kv", name = "SeqStepPlan", frozen, eq)]
#[derive(PartialEq)]
pub struct PySeqStepPlan(pub SeqStepPlan);

#[pymethods]
impl PySeqStepPlan {
    #[getter]
    fn position(&self) -> usize {
        self.0.position
    }
    #[getter]
    fn n_tokens(&self) -> usize {
        self.0.n_tokens
    }
    /// Slot runs `(start, length)` the step's rows land in, in token order.
    #[getter]
    fn write(&self) -> Vec<(usize, usize)> {
        runs_list(&self.0.write)
    }
    /// Slot runs holding the visible history, oldest first.
    #[getter]
    fn read(&self) -> Vec<(usize, usize)> {
        runs_list(&self.0.read)
    }
    #[getter]
    fn read_base_pos(&self) -> usize {
        self.0.read_base_pos
    }
    /// "none" | "causal" | "window".
    #[getter]
    fn mask_kind(&self) -> &'static str {
        self.0.mask.name()
    }
    #[getter]
    fn window(&self) -> Option<usize> {
        self.0.window()
    }
    #[getter]
    fn depth(&self) -> usize {
        self.0.depth
    }
    #[getter]
    fn valid_len(&self) -> usize {
        self.0.valid_len()
    }
    fn __repr__(&self) -> String {
        format!(
            "SeqStepPlan(position={}, n_tokens={}, write={:?}, read={:?}, read_base_pos={}, mask_kind={:?}, window={})",
            self.0.position,
            self.0.n_tokens,
            runs_list(&self.0.write),
            runs_list(&self.0.read),
            self.0.read_base_pos,
            self.0.mask.name(),
            crate::args::py_opt(self.0.window())
        )
    }
}
