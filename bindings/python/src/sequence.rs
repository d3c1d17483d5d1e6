//! `SequenceCache` (bookkeeping) and `KvSequenceCache` (plus pools), their
//! control and planner faces, and `SeqStepPlan`.

use offgraph_kv::{AttendSpec, KvSequenceCache, Runs, SeqStepPlan, SequenceCache};
use pyo3::prelude::*;

use crate::args::index;
use crate::config::PyCacheConfig;
use crate::errors::{borrow, borrow_mut, IntoPy};
use crate::faces::face;
use crate::pools::{update_args, write_step, Inner, KvPools};
use crate::spec::{PyAttendSpec, SpecOwner};

/// The state behind a Python sequence cache: bookkeeping only, or with pools.
pub type SeqInner = Inner<SequenceCache, KvSequenceCache>;

const KV_KIND: &str = "KvSequenceCache";

impl SeqInner {
    pub fn seq(&self) -> &SequenceCache {
        match self {
            SeqInner::Plain(c) => c,
            SeqInner::Kv(c) => c.sequence(),
        }
    }
    fn begin_step(&mut self, n: usize) -> offgraph_kv::Result<usize> {
        match self {
            SeqInner::Plain(c) => c.begin_step(n),
            SeqInner::Kv(c) => c.begin_step(n),
        }
    }
    fn rewind(&mut self, n: usize) -> offgraph_kv::Result<()> {
        match self {
            SeqInner::Plain(c) => c.rewind(n),
            SeqInner::Kv(c) => c.rewind(n),
        }
    }
    fn clear(&mut self) {
        match self {
            SeqInner::Plain(c) => c.clear(),
            SeqInner::Kv(c) => c.clear(),
        }
    }
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
#[pymethods]
impl PySequenceCache {
    #[new]
    fn new(cfg: PyRef<'_, PyCacheConfig>) -> PyResult<Self> {
        Ok(PySequenceCache {
            inner: SeqInner::Plain(SequenceCache::new(cfg.inner.clone()).py_err()?),
        })
    }

    /// The runner's face: length, capacity, can_extend, begin_step, rewind, clear.
    /// The face holds a reference: it keeps the cache alive.
    fn control(slf: Bound<'_, Self>) -> SequenceControl {
        SequenceControl {
            cache: slf.unbind(),
        }
    }

    /// The backend's face: plan(layer). It keeps the cache alive.
    fn planner(slf: Bound<'_, Self>) -> SequencePlanner {
        SequencePlanner {
            cache: slf.unbind(),
        }
    }

    #[getter]
    fn config(slf: &Bound<'_, Self>) -> PyResult<PyCacheConfig> {
        Ok(PyCacheConfig {
            inner: borrow(slf, "config")?.inner.seq().config().clone(),
        })
    }
    #[getter]
    fn length(slf: &Bound<'_, Self>) -> PyResult<usize> {
        Ok(borrow(slf, "length")?.inner.seq().length())
    }
    #[getter]
    fn capacity(slf: &Bound<'_, Self>) -> PyResult<usize> {
        Ok(borrow(slf, "capacity")?.inner.seq().capacity())
    }
    /// Highest length reached since the last clear.
    #[getter]
    fn high_water(slf: &Bound<'_, Self>) -> PyResult<usize> {
        Ok(borrow(slf, "high_water")?.inner.seq().high_water())
    }
    /// The lowest length `rewind` accepts now.
    #[getter]
    fn min_rewind(slf: &Bound<'_, Self>) -> PyResult<usize> {
        Ok(borrow(slf, "min_rewind")?.inner.seq().min_rewind())
    }
    #[getter]
    fn step_open(slf: &Bound<'_, Self>) -> PyResult<bool> {
        Ok(borrow(slf, "step_open")?.inner.seq().step_open())
    }
    #[pyo3(signature = (n=None))]
    fn can_extend(slf: &Bound<'_, Self>, n: Option<&Bound<'_, PyAny>>) -> PyResult<bool> {
        let n = match n {
            Some(n) => index(n, "n")?,
            None => 1,
        };
        Ok(borrow(slf, "can_extend")?.inner.seq().can_extend(n))
    }
    /// Admission and commit: returns the step's first position.
    fn begin_step(slf: &Bound<'_, Self>, n_tokens: &Bound<'_, PyAny>) -> PyResult<usize> {
        let n = index(n_tokens, "n_tokens")?;
        borrow_mut(slf, "begin_step")?.inner.begin_step(n).py_err()
    }
    fn rewind(slf: &Bound<'_, Self>, new_len: &Bound<'_, PyAny>) -> PyResult<()> {
        let n = index(new_len, "new_len")?;
        borrow_mut(slf, "rewind")?.inner.rewind(n).py_err()
    }
    fn clear(slf: &Bound<'_, Self>) -> PyResult<()> {
        borrow_mut(slf, "clear")?.inner.clear();
        Ok(())
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
    fn __repr__(slf: &Bound<'_, Self>) -> String {
        let Ok(this) = slf.try_borrow() else {
            return "SequenceCache(<in use>)".to_string();
        };
        let s = this.inner.seq();
        let kind = match this.inner {
            SeqInner::Plain(_) => "SequenceCache",
            SeqInner::Kv(_) => "KvSequenceCache",
        };
        format!(
            "{kind}(length={}, capacity={}, n_layers={}, step_open={})",
            s.length(),
            s.capacity(),
            s.config().n_layers,
            s.step_open()
        )
    }
    fn __len__(slf: &Bound<'_, Self>) -> PyResult<usize> {
        Ok(borrow(slf, "len")?.inner.seq().length())
    }
}

impl SpecOwner for Py<PySequenceCache> {
    fn generation(&self, py: Python<'_>) -> Option<u64> {
        let c = self.bind(py).try_borrow().ok()?;
        Some(c.inner.seq().generation())
    }
    /// A sequence step's mask is analytic (`mask_kind`, `window`).
    fn dense_mask(&self, _: Python<'_>, _: u64, _: usize) -> PyResult<Option<Py<PyAny>>> {
        Ok(None)
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

/// A SequenceCache plus per-layer K/V pools.
#[pyclass(module = "offgraph_kv", name = "KvSequenceCache", extends = PySequenceCache)]
pub struct PyKvSequenceCache;

#[pymethods]
impl PyKvSequenceCache {
    #[new]
    fn new(cfg: PyRef<'_, PyCacheConfig>) -> PyResult<PyClassInitializer<Self>> {
        let kv = KvSequenceCache::new(cfg.inner.clone()).py_err()?;
        Ok(PyClassInitializer::from(PySequenceCache {
            inner: SeqInner::Kv(kv),
        })
        .add_subclass(PyKvSequenceCache))
    }

    /// Writes the open step's rows of `layer` and returns its AttendSpec.
    /// `k`, `v`: `[n_kv_heads, T, head_dim]` float32, float16 or bfloat16
    /// (`ml_dtypes`), or uint16 bfloat16 bits with `bits="bfloat16"` (a leading
    /// batch of 1 is accepted; non-contiguous input is copied). Rows are rounded
    /// once into the pool's dtype. A refused call writes nothing.
    #[pyo3(signature = (layer, k, v, *, bits=None))]
    fn update(
        slf: &Bound<'_, Self>,
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
        PyAttendSpec::from_seq(owner, cache, layer)
    }

    /// The open step's spec for `layer`, without writing.
    fn spec(slf: &Bound<'_, Self>, layer: &Bound<'_, PyAny>) -> PyResult<PyAttendSpec> {
        let layer = index(layer, "layer")?;
        let owner = Box::new(slf.as_super().clone().unbind());
        let this = borrow(slf.as_super(), "spec")?;
        PyAttendSpec::from_seq(owner, this.inner.kv(KV_KIND)?, layer)
    }

    /// Bytes the pools hold: of one layer, or of all when `layer` is None.
    #[pyo3(signature = (layer=None))]
    fn nbytes(slf: &Bound<'_, Self>, layer: Option<&Bound<'_, PyAny>>) -> PyResult<usize> {
        let layer = crate::args::opt_index(layer, "layer")?;
        let this = borrow(slf.as_super(), "nbytes")?;
        this.inner.kv(KV_KIND)?.pool_bytes(layer).py_err()
    }

    /// Slots the pool of `layer` has now (it doubles up to its depth).
    fn pool_slots(slf: &Bound<'_, Self>, layer: &Bound<'_, PyAny>) -> PyResult<usize> {
        let layer = index(layer, "layer")?;
        let this = borrow(slf.as_super(), "pool_slots")?;
        this.inner.kv(KV_KIND)?.slots(layer).py_err()
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
        let this = borrow(slf.as_super(), "save_state")?;
        let cache = this.inner.kv(KV_KIND)?;
        let data = match start {
            None => cache.save_state(upto).py_err()?,
            Some(s) => cache
                .save_range(s, upto.unwrap_or(cache.length()))
                .py_err()?,
        };
        Ok(crate::snapshot::to_bytes(slf.py(), data))
    }

    /// Restores a snapshot, or a chain of ranges (a list), all or nothing:
    /// `SnapshotError` for anything truncated, damaged, foreign, newer or not
    /// continuing this cache's length; the cache is then unchanged.
    fn load_state(slf: &Bound<'_, Self>, data: &Bound<'_, PyAny>) -> PyResult<()> {
        let chain = crate::snapshot::chain(data)?;
        let refs: Vec<&[u8]> = chain.iter().map(|b| &b[..]).collect();
        let mut this = borrow_mut(slf.as_super(), "load_state")?;
        this.inner.kv_mut(KV_KIND)?.load_states(&refs).py_err()
    }
}

/// The runner's face of a sequence cache. It holds a reference to its cache:
/// the cache stays alive (and usable through the face) while the face lives.
#[pyclass(module = "offgraph_kv")]
pub struct SequenceControl {
    cache: Py<PySequenceCache>,
}

face! {
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

/// The backend's face of a sequence cache. It keeps its cache alive.
#[pyclass(module = "offgraph_kv")]
pub struct SequencePlanner {
    cache: Py<PySequenceCache>,
}

face! {
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
