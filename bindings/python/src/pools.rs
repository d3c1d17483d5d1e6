//! What the sequence and cell cache classes share: the Plain/Kv state behind
//! each, and the pool verbs (`update`, `nbytes`, `pool_slots`) of their Kv
//! subclasses over either core cache.

use offgraph_kv::{AttendSpec, KvCellCache, KvSequenceCache, LayerConfig, Result, RowsIn};
use pyo3::prelude::*;

use crate::args::{index, kv_rows, text};
use crate::errors::{ErrorClass, IntoPy};

/// The state behind a Python cache: bookkeeping only (`P`), or with pools (`K`).
pub enum Inner<P, K> {
    Plain(P),
    Kv(K),
}

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
}

macro_rules! kv_pools {
    ($cache:ty, |$c:ident, $l:ident| $tokens:expr) => {
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
        }
    };
}

kv_pools!(KvSequenceCache, |c, l| c.plan(l)?.n_tokens);
kv_pools!(KvCellCache, |c, l| c.plan(l)?.n_tokens());

/// `update(layer, k, v, *, bits=None)`'s arguments, converted before any borrow.
pub fn update_args(
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
pub fn write_step<C: KvPools>(
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
