//! The process-global registry for Python objects (`offgraph_kv.registry`
//! wraps these functions).

use std::sync::{Arc, OnceLock};

use offgraph_kv::registry::Registry;
use pyo3::prelude::*;

use crate::config::PyCacheConfig;
use crate::errors::IntoPy;

fn reg() -> &'static Registry<Arc<Py<PyAny>>> {
    static REG: OnceLock<Registry<Arc<Py<PyAny>>>> = OnceLock::new();
    REG.get_or_init(Registry::new)
}

/// Stores `cache` under `key`; a taken key raises `KeyExistsError`.
#[pyfunction]
pub fn install(key: &str, cache: Py<PyAny>) -> PyResult<()> {
    reg().install(key, Arc::new(cache)).py_err()
}

/// The cache under `key`; `NotFoundError` when there is none.
#[pyfunction]
pub fn get(py: Python<'_>, key: &str) -> PyResult<Py<PyAny>> {
    Ok(reg().get(key).py_err()?.clone_ref(py))
}

/// Removes `key`; `NotFoundError` when there is none.
#[pyfunction]
pub fn erase(key: &str) -> PyResult<()> {
    // Drop the Python object with the GIL held (we hold it here).
    reg().erase(key).py_err().map(drop)
}

#[pyfunction]
pub fn contains(key: &str) -> bool {
    reg().contains(key)
}

#[pyfunction]
pub fn keys() -> Vec<String> {
    reg().keys()
}

/// A key no other call in this process returned, starting with `prefix`.
#[pyfunction]
#[pyo3(signature = (prefix="cache-"))]
pub fn unique_key(py: Python<'_>, prefix: &str) -> String {
    py.detach(|| reg().unique_key(prefix))
}

/// Registers `fn(config) -> cache` for the pair `(backend_id, kind)`.
#[pyfunction]
pub fn register_builder(backend_id: &str, kind: &str, builder: Py<PyAny>) -> PyResult<()> {
    let builder = Arc::new(builder);
    reg().register_builder(
        backend_id,
        kind,
        Arc::new(move |cfg: &offgraph_kv::CacheConfig| {
            Python::attach(|py| {
                let arg = PyCacheConfig { inner: cfg.clone() };
                builder
                    .call1(py, (arg,))
                    .map(Arc::new)
                    .map_err(|e| offgraph_kv::CacheError::Backend(format!("builder raised: {e}")))
            })
        }),
    );
    Ok(())
}

/// Validates `config`, then builds with the builder for `(backend_id, kind)`.
#[pyfunction]
pub fn build(
    py: Python<'_>,
    backend_id: &str,
    kind: &str,
    config: PyRef<'_, PyCacheConfig>,
) -> PyResult<Py<PyAny>> {
    config.inner.validate().py_err()?;
    Ok(reg()
        .build(backend_id, kind, &config.inner)
        .py_err()?
        .clone_ref(py))
}
