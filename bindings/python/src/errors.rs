//! Maps core errors onto the Python exception tree in `offgraph_kv._errors`.

use offgraph_kv::CacheError;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;
use pyo3::PyClass;

static ERRORS: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// The exception classes of `offgraph_kv._errors` the native module raises.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorClass {
    Config,
    InvalidArgument,
    Shape,
    DType,
    NotFound,
    KeyExists,
    Capacity,
    Step,
    UnknownSequence,
    Backend,
    Snapshot,
    Engine,
}

impl ErrorClass {
    /// The Python class name: the one place each is spelled.
    fn name(self) -> &'static str {
        match self {
            ErrorClass::Config => "ConfigError",
            ErrorClass::InvalidArgument => "InvalidArgumentError",
            ErrorClass::Shape => "ShapeError",
            ErrorClass::DType => "DTypeError",
            ErrorClass::NotFound => "NotFoundError",
            ErrorClass::KeyExists => "KeyExistsError",
            ErrorClass::Capacity => "CapacityError",
            ErrorClass::Step => "StepError",
            ErrorClass::UnknownSequence => "UnknownSequenceError",
            ErrorClass::Backend => "BackendError",
            ErrorClass::Snapshot => "SnapshotError",
            ErrorClass::Engine => "EngineError",
        }
    }

    /// The class a core error is raised as.
    fn of(err: &CacheError) -> Self {
        match err {
            CacheError::InvalidConfig(_) => ErrorClass::Config,
            CacheError::InvalidArgument(_) => ErrorClass::InvalidArgument,
            CacheError::Shape(_) => ErrorClass::Shape,
            CacheError::NotFound(_) => ErrorClass::NotFound,
            CacheError::KeyExists(_) => ErrorClass::KeyExists,
            CacheError::OutOfCapacity(_) => ErrorClass::Capacity,
            CacheError::UnknownSequence(_) => ErrorClass::UnknownSequence,
            CacheError::StepProtocol(_) => ErrorClass::Step,
            CacheError::Backend(_) => ErrorClass::Backend,
            CacheError::Snapshot(_) => ErrorClass::Snapshot,
        }
    }

    fn class(self, py: Python<'_>) -> PyResult<Py<PyType>> {
        let module =
            ERRORS.get_or_try_init(py, || py.import("offgraph_kv._errors").map(Bound::unbind))?;
        Ok(module
            .bind(py)
            .getattr(self.name())?
            .cast_into::<PyType>()?
            .unbind())
    }

    /// An exception of this class carrying `msg`.
    pub fn err(self, msg: impl Into<String>) -> PyErr {
        let msg = msg.into();
        Python::attach(|py| match self.class(py) {
            Ok(cls) => PyErr::from_type(cls.into_bound(py), (msg,)),
            Err(e) => PyRuntimeError::new_err(format!(
                "{msg} (and the error classes failed to load: {e})"
            )),
        })
    }
}

/// The Python exception for a core error.
pub fn to_py(err: CacheError) -> PyErr {
    ErrorClass::of(&err).err(err.message().to_string())
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
    ErrorClass::InvalidArgument.err(msg)
}

pub fn dtype_err(msg: impl Into<String>) -> PyErr {
    ErrorClass::DType.err(msg)
}

pub fn shape_err(msg: impl Into<String>) -> PyErr {
    ErrorClass::Shape.err(msg)
}

pub fn config_err(msg: impl Into<String>) -> PyErr {
    ErrorClass::Config.err(msg)
}

/// The refusal for a cache that is in use: a mutation while another thread
/// runs `attend` on it (attend releases the GIL but keeps a shared borrow), or
/// a callback (an `__index__`, an iterator) re-entering the cache. It is a
/// `StepError`; the call changes nothing.
pub fn busy(what: &str) -> PyErr {
    ErrorClass::Step.err(format!(
            "{what}: the cache is in use by another call (attend running in another thread with the GIL released, or a re-entrant callback); a cache is not for concurrent use: serialize calls on it with a lock"
    ))
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
