//! The process-global registry for Python objects (`offgraph_kv.registry`
//! wraps these functions).

use std::sync::{Arc, OnceLock};

use offgraph_kv::registry::Registry;
use pyo3::prelude::*;

use crate::args::text;
use crate::config::PyCacheConfig;
use crate::errors::IntoPy;

fn reg() -> &'static Registry<Arc<Py<PyAny>>> {
    static REG: OnceLock<Registry<Arc<Py<PyAny>>>> = OnceLock::new();
    REG.get_or_init(Registry::new)
}

/// Stores `cache` under `key`; a taken key raises `KeyExistsError`.
#[pyfunction]
pub fn install(key: &Bound<'_, PyAny>, cache: Py<PyAny>) -> PyResult<()> {
    let key = text(key, "key")?;
    reg().install(&key, Arc::new(cache)).py_err()
}

/// The cache under `key`; `NotFoundError` when there is none.
#[pyfunction]
pub fn get(py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
    let key = text(key, "key")?;
    Ok(reg().get(&key).py_err()?.clone_ref(py))
}

/// Removes `key`; `NotFoundError` when there is none.
#[pyfunction]
pub fn erase(key: &Bound<'_, PyAny>) -> PyResult<()> {
    let key = text(key, "key")?;
    // Drop the Python object with the GIL held (we hold it here).
    reg().erase(&key).py_err().map(drop)
}

/// Removes `key` only if it still holds `cache` itself (identity), atomically;
/// returns whether it did. A session erases its own entry this way.
#[pyfunction]
pub fn erase_if_same(key: &Bound<'_, PyAny>, cache: &Bound<'_, PyAny>) -> PyResult<bool> {
    let key = text(key, "key")?;
    let ptr = cache.as_ptr();
    // The removed object (if any) drops here, with the GIL held.
    Ok(reg().erase_if(&key, |held| held.as_ptr() == ptr))
}

#[pyfunction]
pub fn contains(key: &Bound<'_, PyAny>) -> PyResult<bool> {
    Ok(reg().contains(&text(key, "key")?))
}

#[pyfunction]
pub fn keys() -> Vec<String> {
    reg().keys()
}

/// A key no other call in this process returned, starting with `prefix`.
#[pyfunction]
#[pyo3(signature = (prefix=None))]
pub fn unique_key(py: Python<'_>, prefix: Option<&Bound<'_, PyAny>>) -> PyResult<String> {
    let prefix = match prefix {
        Some(p) => text(p, "prefix")?,
        None => "cache-".to_string(),
    };
    Ok(py.detach(|| reg().unique_key(&prefix)))
}

/// Registers `fn(config) -> cache` for the pair `(backend_id, kind)`.
#[pyfunction]
pub fn register_builder(
    backend_id: &Bound<'_, PyAny>,
    kind: &Bound<'_, PyAny>,
    builder: Py<PyAny>,
) -> PyResult<()> {
    let backend_id = text(backend_id, "backend_id")?;
    let kind = text(kind, "kind")?;
    let builder = Arc::new(builder);
    reg().register_builder(
        &backend_id,
        &kind,
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
    backend_id: &Bound<'_, PyAny>,
    kind: &Bound<'_, PyAny>,
    config: PyRef<'_, PyCacheConfig>,
) -> PyResult<Py<PyAny>> {
    let backend_id = text(backend_id, "backend_id")?;
    let kind = text(kind, "kind")?;
    config.inner.validate().py_err()?;
    Ok(reg()
        .build(&backend_id, &kind, &config.inner)
        .py_err()?
        .clone_ref(py))
}
