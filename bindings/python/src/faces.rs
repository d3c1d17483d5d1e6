//! The control and planner faces of the cache classes forward each method to
//! the cache they hold; `face!` writes each face class and those forwarding
//! methods once.

/// A face class holding `cache: Py<Cache>`, and its `#[pymethods]`: the
/// `cache` getter, each listed `fn name(args) -> R` as
/// `Cache::name(self.cache.bind(py), args)`, and with `repr "Label"` a
/// `__repr__` of `Label(<the cache's repr>)`.
macro_rules! face {
    (
        $(#[$doc:meta])*
        $face:ident => $cache:ty $(, repr $label:literal)?;
        $( $(#[$attr:meta])* fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty; )*
    ) => {
        $(#[$doc])*
        #[pyo3::pyclass(module = "offgraph_kv")]
        pub struct $face {
            cache: pyo3::Py<$cache>,
        }

        #[pyo3::pymethods]
        impl $face {
            #[getter]
            fn cache(&self, py: pyo3::Python<'_>) -> pyo3::Py<$cache> {
                self.cache.clone_ref(py)
            }
            $(
                $(#[$attr])*
                fn $name(&self, py: pyo3::Python<'_>, $($arg: $ty),*) -> $ret {
                    <$cache>::$name(self.cache.bind(py), $($arg),*)
                }
            )*
            $(
                fn __repr__(&self, py: pyo3::Python<'_>) -> String {
                    format!(concat!($label, "({})"), <$cache>::__repr__(self.cache.bind(py)))
                }
            )?
        }
    };
}

pub(crate) use face;
