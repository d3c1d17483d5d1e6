//! What the sequence and cell cache classes are over: the Plain/Kv state
//! behind each, what the shared methods and a spec need of either class
//! (`CacheClass`), and the pool verbs both core caches have (`KvPools`).

use offgraph_kv::{AttendSpec, KvCellCache, KvSequenceCache, LayerConfig, Result, RowsIn};
use pyo3::prelude::*;
use pyo3::pyclass::boolean_struct::False;
use pyo3::PyClass;

use crate::errors::{borrow, ErrorClass, IntoPy};
use crate::spec::{PyAttendSpec, SpecOwner};

/// The state behind a Python cache: bookkeeping only (`P`), or with pools (`K`).
pub enum Inner<P, K> {
    Plain(P),
    Kv(K),
}

/// `$body` on whichever core cache `$inner` (an `Inner`) holds, bound as `$c`:
/// for the verbs both have under one name, which a Kv cache must see itself
/// to keep its pools in step.
macro_rules! either {
    ($inner:expr, $c:ident => $body:expr) => {
        match $inner {
            $crate::pools::Inner::Plain($c) => $body,
            $crate::pools::Inner::Kv($c) => $body,
        }
    };
}

pub(crate) use either;

impl<P, K> Inner<P, K> {
    /// The pooled cache; `StepError` naming `kind` for a bookkeeping-only one.
    pub fn kv(&self, kind: &str) -> PyResult<&K> {
        match self {
            Inner::Kv(c) => Ok(c),
            Inner::Plain(_) => Err(ErrorClass::Step.err(format!("not a {kind}"))),
        }
    }
    pub fn kv_mut(&mut self, kind: &str) -> PyResult<&mut K> {
        match self {
            Inner::Kv(c) => Ok(c),
            Inner::Plain(_) => Err(ErrorClass::Step.err(format!("not a {kind}"))),
        }
    }
}

impl<P, K: KvPools> Inner<P, K> {
    /// Runs `f` on the core spec of `layer`; `Ok(false)`, without running
    /// `f`, when step `generation` has closed or there are no pools.
    pub fn with_core_spec(
        &self,
        generation: u64,
        layer: usize,
        f: &mut dyn FnMut(&AttendSpec<'_>) -> PyResult<()>,
    ) -> PyResult<bool> {
        let Inner::Kv(kv) = self else {
            return Ok(false);
        };
        if kv.step_generation() != generation {
            return Ok(false);
        }
        f(&kv.core_spec(layer).py_err()?)?;
        Ok(true)
    }
}

/// A Python cache class (the base class of its Kv subclass), as the shared
/// verbs and the specs it makes need it.
pub trait CacheClass: PyClass<Frozen = False> + Send + Sync {
    type Plain;
    type Kv: KvPools;
    /// The Python class names: the bookkeeping-only class and its Kv subclass.
    const PLAIN_KIND: &'static str;
    const KV_KIND: &'static str;
    /// Whether `spec` borrows the cache exclusively: the cell cache documents
    /// its `spec` among the mutations a running `attend` refuses.
    const SPEC_EXCLUSIVE: bool;
    fn inner(&self) -> &Inner<Self::Plain, Self::Kv>;
    fn inner_mut(&mut self) -> &mut Inner<Self::Plain, Self::Kv>;
    /// The step generation of the bookkeeping.
    fn generation(&self) -> u64;
    /// The dense bool mask of a step's layer; None for a cache whose mask is
    /// analytic.
    const DENSE_MASK: Option<MaskFn<Self>>;
}

/// `(owner, py, generation, layer)`: the dense bool mask of `layer` for step
/// `generation` of `owner`.
pub type MaskFn<C> = fn(&Py<C>, Python<'_>, u64, usize) -> PyResult<Py<PyAny>>;

impl<C: CacheClass> SpecOwner for Py<C> {
    fn generation(&self, py: Python<'_>) -> Option<u64> {
        Some(self.bind(py).try_borrow().ok()?.generation())
    }
    fn dense_mask(
        &self,
        py: Python<'_>,
        generation: u64,
        layer: usize,
    ) -> PyResult<Option<Py<PyAny>>> {
        C::DENSE_MASK
            .map(|mask| mask(self, py, generation, layer))
            .transpose()
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
            .inner()
            .with_core_spec(generation, layer, f)
    }
}

/// The pool verbs both core caches have, under one name each.
pub trait KvPools {
    fn layer_config(&self, layer: usize) -> Result<LayerConfig>;
    /// Tokens of the open step that `layer` writes.
    fn step_tokens(&self, layer: usize) -> Result<usize>;
    fn put_rows(&mut self, layer: usize, k: RowsIn<'_>, v: RowsIn<'_>) -> Result<()>;
    /// Bytes of one layer's pools, or of all when `layer` is None.
    fn pool_bytes(&self, layer: Option<usize>) -> Result<usize>;
    fn slots(&self, layer: usize) -> Result<usize>;
    /// Address space all pools hold.
    fn reserved(&self) -> usize;
    /// Memory the pools hold now.
    fn committed(&self) -> usize;
    /// `"reserve"` or `"grow"` (see `offgraph_kv::PoolMemory`).
    fn memory(&self) -> &'static str;
    fn step_generation(&self) -> u64;
    fn core_spec(&self, layer: usize) -> Result<AttendSpec<'_>>;
    /// The Python spec of `layer` for the open step, made by `owner`.
    fn py_spec(&self, owner: Box<dyn SpecOwner>, layer: usize) -> PyResult<PyAttendSpec>;
}

macro_rules! kv_pools {
    ($cache:ty, $finish:ident, |$c:ident, $l:ident| $tokens:expr) => {
        impl KvPools for $cache {
            fn layer_config(&self, layer: usize) -> Result<LayerConfig> {
                Ok(*self.config().layer(layer)?)
            }
            fn step_tokens(&self, $l: usize) -> Result<usize> {
                let $c = self;
                Ok($tokens)
            }
            fn put_rows(&mut self, layer: usize, k: RowsIn<'_>, v: RowsIn<'_>) -> Result<()> {
                self.update_rows(layer, k, v).map(|_| ())
            }
            fn pool_bytes(&self, layer: Option<usize>) -> Result<usize> {
                match layer {
                    Some(l) => self.nbytes(l),
                    None => Ok(self.nbytes_total()),
                }
            }
            fn slots(&self, layer: usize) -> Result<usize> {
                Ok(self.pool(layer)?.slots())
            }
            fn reserved(&self) -> usize {
                self.reserved_bytes()
            }
            fn committed(&self) -> usize {
                self.committed_bytes()
            }
            fn memory(&self) -> &'static str {
                self.pool_memory().name()
            }
            fn step_generation(&self) -> u64 {
                self.generation()
            }
            fn core_spec(&self, layer: usize) -> Result<AttendSpec<'_>> {
                self.spec(layer)
            }
            fn py_spec(&self, owner: Box<dyn SpecOwner>, layer: usize) -> PyResult<PyAttendSpec> {
                let spec = self.spec(layer).py_err()?;
                let plan = self.plan(layer).py_err()?;
                let buffers = self.pool(layer).py_err()?.buffers();
                let gen = self.generation();
                let base = PyAttendSpec::new(owner, gen, layer, &spec, buffers, plan.window());
                Ok(base.$finish(&spec, &plan))
            }
        }
    };
}

kv_pools!(KvSequenceCache, for_seq, |c, l| c.plan(l)?.n_tokens);
kv_pools!(KvCellCache, for_cells, |c, l| c.plan(l)?.n_tokens());
