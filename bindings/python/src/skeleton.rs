//! The methods the sequence and cell cache classes share, written once:
//! `cache_methods!` for the base classes, `kv_methods!` for their Kv
//! subclasses. Each writes the class's one `#[pymethods]` block, with the
//! class's own methods passed through as written; the functions here are
//! their bodies, generic over the class.

use pyo3::prelude::*;

use crate::args::{index, kv_rows, opt_index, text};
use crate::errors::{borrow, borrow_mut, IntoPy};
use crate::pools::{CacheClass, Inner, KvPools};
use crate::spec::PyAttendSpec;

/// The `CacheClass` impl of a base cache class over `Inner<Plain, Kv>` (the
/// Python classes are named as the core types: `CellCache`, `KvCellCache`),
/// and its `#[pymethods]`, `inner.$core()` being the bookkeeping cache:
/// `control()` and `planner()` (the face classes, with the docs given),
/// `__repr__` as `Kind(<$repr of the bookkeeping>)`, the `config` getter,
/// `can_extend(n=None)`, `clear()`, each `get` entry as a getter forwarded to
/// the bookkeeping cache, each `call`
/// entry `fn name(arg: convert, ...) -> R = how` as
/// `how(slf, "name", |c| c.name(args))` after converting each argument with
/// `convert(arg, "arg")`, and then the class's own methods.
macro_rules! cache_methods {
    (
        $class:ident($core:ident): $plain:ident, $kv:ident;
        spec_exclusive = $exclusive:literal, dense_mask = $mask:expr, repr = $repr:path;
        $(#[$control_doc:meta])* control -> $control:ident;
        $(#[$planner_doc:meta])* planner -> $planner:ident;
        get { $( $(#[$get_doc:meta])* $get:ident: $get_ty:ty, )* }
        call { $(
            $(#[$call_doc:meta])*
            fn $call:ident($($arg:ident: $conv:ident),*) -> $ret:ty = $how:ident;
        )* }
        $($items:tt)*
    ) => {
        impl crate::pools::CacheClass for $class {
            type Plain = $plain;
            type Kv = $kv;
            const PLAIN_KIND: &'static str = stringify!($plain);
            const KV_KIND: &'static str = stringify!($kv);
            const SPEC_EXCLUSIVE: bool = $exclusive;
            fn inner(&self) -> &crate::pools::Inner<$plain, $kv> {
                &self.inner
            }
            fn inner_mut(&mut self) -> &mut crate::pools::Inner<$plain, $kv> {
                &mut self.inner
            }
            fn generation(&self) -> u64 {
                self.inner.$core().generation()
            }
            const DENSE_MASK: Option<crate::pools::MaskFn<Self>> = $mask;
        }

        #[pyo3::pymethods]
        impl $class {
            $(#[$control_doc])*
            fn control(slf: Bound<'_, Self>) -> $control {
                $control { cache: slf.unbind() }
            }
            $(#[$planner_doc])*
            fn planner(slf: Bound<'_, Self>) -> $planner {
                $planner { cache: slf.unbind() }
            }
            #[getter]
            fn config(slf: &Bound<'_, Self>) -> PyResult<crate::config::PyCacheConfig> {
                let this = crate::errors::borrow(slf, "config")?;
                Ok(crate::config::PyCacheConfig { inner: this.inner.$core().config().clone() })
            }
            #[pyo3(signature = (n=None))]
            fn can_extend(slf: &Bound<'_, Self>, n: Option<&Bound<'_, PyAny>>) -> PyResult<bool> {
                let n = crate::args::opt_index(n, "n")?.unwrap_or(1);
                Ok(crate::errors::borrow(slf, "can_extend")?.inner.$core().can_extend(n))
            }
            fn __repr__(slf: &Bound<'_, Self>) -> String {
                crate::skeleton::repr(slf, |this: &Self| $repr(this.inner.$core()))
            }
            fn clear(slf: &Bound<'_, Self>) -> PyResult<()> {
                crate::errors::borrow_mut(slf, "clear")?.inner.clear();
                Ok(())
            }
            $(
                $(#[$get_doc])*
                #[getter]
                fn $get(slf: &Bound<'_, Self>) -> PyResult<$get_ty> {
                    Ok(crate::errors::borrow(slf, stringify!($get))?.inner.$core().$get())
                }
            )*
            $(
                $(#[$call_doc])*
                fn $call(slf: &Bound<'_, Self>, $($arg: &Bound<'_, PyAny>),*) -> PyResult<$ret> {
                    $( let $arg = $conv($arg, stringify!($arg))?; )*
                    $how(slf, stringify!($call), |c| c.$call($($arg),*))
                }
            )*
            $($items)*
        }
    };
}

/// `#[pymethods]` for a Kv cache class: `update`, `spec`, `nbytes`,
/// `pool_slots`, `reserved_bytes` and `pool_memory` over the pools of its base-class object (with the docs
/// given), and then the class's own methods.
macro_rules! kv_methods {
    (
        $class:ident;
        $(#[$update_doc:meta])* update,
        $(#[$spec_doc:meta])* spec,
        $(#[$nbytes_doc:meta])* nbytes,
        $(#[$slots_doc:meta])* pool_slots;
        $($items:tt)*
    ) => {
        #[pyo3::pymethods]
        impl $class {
            $(#[$update_doc])*
            #[pyo3(signature = (layer, k, v, *, bits=None))]
            fn update(
                slf: &Bound<'_, Self>,
                layer: &Bound<'_, PyAny>,
                k: &Bound<'_, PyAny>,
                v: &Bound<'_, PyAny>,
                bits: Option<&Bound<'_, PyAny>>,
            ) -> PyResult<crate::spec::PyAttendSpec> {
                crate::skeleton::update(slf.as_super(), layer, k, v, bits)
            }
            $(#[$spec_doc])*
            fn spec(
                slf: &Bound<'_, Self>,
                layer: &Bound<'_, PyAny>,
            ) -> PyResult<crate::spec::PyAttendSpec> {
                crate::skeleton::spec(slf.as_super(), layer)
            }
            $(#[$nbytes_doc])*
            #[pyo3(signature = (layer=None))]
            fn nbytes(slf: &Bound<'_, Self>, layer: Option<&Bound<'_, PyAny>>) -> PyResult<usize> {
                crate::skeleton::nbytes(slf.as_super(), layer)
            }
            $(#[$slots_doc])*
            fn pool_slots(slf: &Bound<'_, Self>, layer: &Bound<'_, PyAny>) -> PyResult<usize> {
                crate::skeleton::pool_slots(slf.as_super(), layer)
            }
            /// Address space the pools hold: their whole depth when reserved
            /// (the OS commits a page when a row on it is first written), the
            /// grown buffers otherwise. `nbytes()` is what the rows need.
            fn reserved_bytes(slf: &Bound<'_, Self>) -> PyResult<usize> {
                crate::skeleton::read_kv(slf.as_super(), "reserved_bytes", |c| Ok(crate::pools::KvPools::reserved(c)))
            }
            /// Memory the pools hold now: the resident pages of reserved pools
            /// (rows written and not given back by `clear`/`trim`), the whole
            /// buffers of grown ones; at most `reserved_bytes()`.
            fn committed_bytes(slf: &Bound<'_, Self>) -> PyResult<usize> {
                crate::skeleton::read_kv(slf.as_super(), "committed_bytes", |c| Ok(crate::pools::KvPools::committed(c)))
            }
            /// `"reserve"`: every pool reserved its depth once (growth never
            /// copies, views keep their address); `"grow"`: pools grow by
            /// doubling and copying (the OS refused the reservation, or
            /// `OFFGRAPH_KV_POOLS=grow` asked for it).
            #[getter]
            fn pool_memory(slf: &Bound<'_, Self>) -> PyResult<&'static str> {
                crate::skeleton::read_kv(slf.as_super(), "pool_memory", |c| Ok(crate::pools::KvPools::memory(c)))
            }
            $($items)*
        }
    };
}

pub(crate) use {cache_methods, kv_methods};

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
    f: impl FnOnce(&C::Kv) -> offgraph_kv::Result<R>,
) -> PyResult<R> {
    f(borrow(base, what)?.inner().kv(C::KV_KIND)?).py_err()
}

/// Runs `f` on the pools of `base`, borrowed exclusively.
pub fn write_kv<C: CacheClass, R>(
    base: &Bound<'_, C>,
    what: &str,
    f: impl FnOnce(&mut C::Kv) -> offgraph_kv::Result<R>,
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

/// `spec(layer)`: the open step's spec for `layer`, without writing (refused
/// for a layer the open step has not updated).
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
