//! What the sequence and cell cache classes share: the Plain/Kv state behind
//! each, what a spec needs of either class (`CacheClass`), and the pool verbs
//! (`update`, `spec`, `nbytes`, `pool_slots`) of their Kv subclasses over
//! either core cache.

use offgraph_kv::{AttendSpec, KvCellCache, KvSequenceCache, LayerConfig, Result, RowsIn};
use pyo3::prelude::*;
use pyo3::pyclass::boolean_struct::False;
use pyo3::PyClass;

use crate::args::{index, kv_rows, opt_index, text};
use crate::errors::{borrow, borrow_mut, ErrorClass, IntoPy};
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

/// `Kind(<fields>)`, the kind being the cache's class; `Kind(<in use>)`
/// while another call holds the cache exclusively.
pub fn repr<C: CacheClass>(slf: &Bound<'_, C>, fields: impl FnOnce(&C) -> String) -> String {
    let Ok(this) = slf.try_borrow() else {
        return format!("{}(<in use>)", C::PLAIN_KIND);
    };
    let kind = match this.inner() {
        Inner::Plain(_) => C::PLAIN_KIND,
        Inner::Kv(_) => C::KV_KIND,
    };
    format!("{kind}({})", fields(&this))
}

/// Runs `f` on the pools of `base`, borrowed shared (`what` names the call
/// in the refusal of a busy or bookkeeping-only cache).
pub fn read_kv<C: CacheClass, R>(
    base: &Bound<'_, C>,
    what: &str,
    f: impl FnOnce(&C::Kv) -> Result<R>,
) -> PyResult<R> {
    f(borrow(base, what)?.inner().kv(C::KV_KIND)?).py_err()
}

/// Runs `f` on the pools of `base`, borrowed exclusively.
pub fn write_kv<C: CacheClass, R>(
    base: &Bound<'_, C>,
    what: &str,
    f: impl FnOnce(&mut C::Kv) -> Result<R>,
) -> PyResult<R> {
    f(borrow_mut(base, what)?.inner_mut().kv_mut(C::KV_KIND)?).py_err()
}

/// `update(layer, k, v, *, bits=None)`: writes the open step's rows of
/// `layer` and returns its spec; a refused call writes nothing.
pub fn update<C: CacheClass>(
    base: &Bound<'_, C>,
    layer: &Bound<'_, PyAny>,
    k: &Bound<'_, PyAny>,
    v: &Bound<'_, PyAny>,
    bits: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyAttendSpec> {
    let (layer, bits) = update_args(layer, bits)?;
    let owner = Box::new(base.clone().unbind());
    let mut this = borrow_mut(base, "update")?;
    let cache = this.inner_mut().kv_mut(C::KV_KIND)?;
    write_step(cache, layer, k, v, bits.as_deref())?;
    cache.py_spec(owner, layer)
}

/// `spec(layer)`: the open step's spec for `layer`, without writing.
pub fn spec<C: CacheClass>(
    base: &Bound<'_, C>,
    layer: &Bound<'_, PyAny>,
) -> PyResult<PyAttendSpec> {
    let layer = index(layer, "layer")?;
    let owner = Box::new(base.clone().unbind());
    if C::SPEC_EXCLUSIVE {
        borrow_mut(base, "spec")?
            .inner()
            .kv(C::KV_KIND)?
            .py_spec(owner, layer)
    } else {
        borrow(base, "spec")?
            .inner()
            .kv(C::KV_KIND)?
            .py_spec(owner, layer)
    }
}

/// `nbytes(layer=None)`: bytes of one layer's pools, or of all.
pub fn nbytes<C: CacheClass>(
    base: &Bound<'_, C>,
    layer: Option<&Bound<'_, PyAny>>,
) -> PyResult<usize> {
    let layer = opt_index(layer, "layer")?;
    read_kv(base, "nbytes", |c| c.pool_bytes(layer))
}

/// `pool_slots(layer)`: slots the pool of `layer` has now.
pub fn pool_slots<C: CacheClass>(base: &Bound<'_, C>, layer: &Bound<'_, PyAny>) -> PyResult<usize> {
    let layer = index(layer, "layer")?;
    read_kv(base, "pool_slots", |c| c.slots(layer))
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

/// `update(layer, k, v, *, bits=None)`'s arguments, converted before any borrow.
fn update_args(
    layer: &Bound<'_, PyAny>,
    bits: Option<&Bound<'_, PyAny>>,
) -> PyResult<(usize, Option<String>)> {
    let layer = index(layer, "layer")?;
    let bits = match bits.filter(|b| !b.is_none()) {
        Some(b) => Some(text(b, "bits")?),
        None => None,
    };
    Ok((layer, bits))
}

/// Converts `k`, `v` for the open step of `layer` and writes them; a refused
/// call writes nothing.
fn write_step<C: KvPools>(
    cache: &mut C,
    layer: usize,
    k: &Bound<'_, PyAny>,
    v: &Bound<'_, PyAny>,
    bits: Option<&str>,
) -> PyResult<()> {
    let tokens = cache.step_tokens(layer).py_err()?;
    let l = cache.layer_config(layer).py_err()?;
    let (kb, vb) = kv_rows(k, v, &l, tokens, bits)?;
    cache.put_rows(layer, kb.as_rows(), vb.as_rows()).py_err()
}
