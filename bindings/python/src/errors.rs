//! Maps core errors onto the Python exception tree in `offgraph_kv._errors`.

use offgraph_kv::CacheError;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;
use pyo3::PyClass;

static ERRORS: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// The exception class `name` of `offgraph_kv._errors`.
fn class(py: Python<'_>, name: &str) -> PyResult<Py<PyType>> {
    let module =
        ERRORS.get_or_try_init(py, || py.import("offgraph_kv._errors").map(Bound::unbind))?;
    Ok(module
        .bind(py)
        .getattr(name)?
        .cast_into::<PyType>()?
        .unbind())
}

/// Builds an exception of class `name` carrying `msg`.
pub fn make(name: &str, msg: impl Into<String>) -> PyErr {
    let msg = msg.into();
    Python::attach(|py| match class(py, name) {
        Ok(cls) => PyErr::from_type(cls.into_bound(py), (msg,)),
        Err(e) => {
            PyRuntimeError::new_err(format!("{msg} (and the error classes failed to load: {e})"))
        }
    })
}

/// The Python exception for a core error.
pub fn to_py(err: CacheError) -> PyErr {
    let name = match &err {
        CacheError::InvalidConfig(_) => "ConfigError",
        CacheError::InvalidArgument(_) => "InvalidArgumentError",
        CacheError::Shape(_) => "ShapeError",
        CacheError::NotFound(_) => "NotFoundError",
        CacheError::KeyExists(_) => "KeyExistsError",
        CacheError::OutOfCapacity(_) => "CapacityError",
        CacheError::UnknownSequence(_) => "UnknownSequenceError",
        CacheError::StepProtocol(_) => "StepError",
        CacheError::Backend(_) => "BackendError",
        CacheError::Snapshot(_) => "SnapshotError",
    };
    make(name, err.message().to_string())
}

/// `?`-friendly conversion for core results.
pub trait IntoPy<T> {
    fn py_err(self) -> PyResult<T>;
}

impl<T> IntoPy<T> for offgraph_kv::Result<T> {
    fn py_err(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}

pub fn invalid_arg(msg: impl Into<String>) -> PyErr {
    make("InvalidArgumentError", msg)
}

pub fn dtype_err(msg: impl Into<String>) -> PyErr {
    make("DTypeError", msg)
}

pub fn shape_err(msg: impl Into<String>) -> PyErr {
    make("ShapeError", msg)
}

pub fn config_err(msg: impl Into<String>) -> PyErr {
    make("ConfigError", msg)
}

/// The refusal for a cache that is in use: a mutation while another thread
/// runs `attend` on it (attend releases the GIL but keeps a shared borrow), or
/// a callback (an `__index__`, an iterator) re-entering the cache. It is a
/// `StepError`; the call changes nothing.
pub fn busy(what: &str) -> PyErr {
    make(
        "StepError",
        format!(
            "{what}: the cache is in use by another call (attend running in another thread with the GIL released, or a re-entrant callback); a cache is not for concurrent use: serialize calls on it with a lock"
        ),
    )
}

/// Shared borrow of a cache object, `StepError` (not PyO3's `RuntimeError`,
/// never a panic) when it is mutably borrowed.
pub fn borrow<'py, T: PyClass>(b: &Bound<'py, T>, what: &str) -> PyResult<PyRef<'py, T>> {
    b.try_borrow().map_err(|_| busy(what))
}

/// Exclusive borrow of a cache object, `StepError` when borrowed elsewhere.
pub fn borrow_mut<'py, T: PyClass<Frozen = pyo3::pyclass::boolean_struct::False>>(
    b: &Bound<'py, T>,
    what: &str,
) -> PyResult<PyRefMut<'py, T>> {
    b.try_borrow_mut().map_err(|_| busy(what))
}
