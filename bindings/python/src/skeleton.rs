//! The methods the sequence and cell cache classes share, written once:
//! `cache_methods!` for the base classes, `kv_methods!` for their Kv
//! subclasses. Each writes the class's one `#[pymethods]` block, with the
//! class's own methods passed through as written.

/// The `CacheClass` impl of a base cache class over `Inner<Plain, Kv>` (the
/// Python classes are named as the core types: `CellCache`, `KvCellCache`),
/// and its `#[pymethods]`, `inner.$core()` being the bookkeeping cache:
/// `control()` and `planner()` (the face classes, with the docs given),
/// `__repr__` as `Kind(<$repr of the bookkeeping>)`, the `config` getter, `can_extend(n=None)`, `clear()`, each
/// `get` entry as a getter forwarded to the bookkeeping cache, each `call`
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
                crate::pools::repr(slf, |this: &Self| $repr(this.inner.$core()))
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

/// `#[pymethods]` for a Kv cache class: `update`, `spec`, `nbytes` and
/// `pool_slots` over the pools of its base-class object (with the docs
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
                crate::pools::update(slf.as_super(), layer, k, v, bits)
            }
            $(#[$spec_doc])*
            fn spec(
                slf: &Bound<'_, Self>,
                layer: &Bound<'_, PyAny>,
            ) -> PyResult<crate::spec::PyAttendSpec> {
                crate::pools::spec(slf.as_super(), layer)
            }
            $(#[$nbytes_doc])*
            #[pyo3(signature = (layer=None))]
            fn nbytes(slf: &Bound<'_, Self>, layer: Option<&Bound<'_, PyAny>>) -> PyResult<usize> {
                crate::pools::nbytes(slf.as_super(), layer)
            }
            $(#[$slots_doc])*
            fn pool_slots(slf: &Bound<'_, Self>, layer: &Bound<'_, PyAny>) -> PyResult<usize> {
                crate::pools::pool_slots(slf.as_super(), layer)
            }
            $($items)*
        }
    };
}

pub(crate) use {cache_methods, kv_methods};
