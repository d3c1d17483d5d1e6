//! Snapshot arguments and the module-level `snapshot_info`.

use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::{PyBytes, PyDict};

use crate::errors::{dtype_err, IntoPy};

/// `bytes`, `bytearray` (copied) or `memoryview` as owned-or-borrowed bytes.
pub fn data(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<PyBackedBytes> {
    if let Ok(b) = obj.extract::<PyBackedBytes>() {
        return Ok(b);
    }
    if obj.is_instance_of::<pyo3::types::PyMemoryView>() {
        let b = obj.call_method0("tobytes")?;
        return Ok(b.extract::<PyBackedBytes>()?);
    }
    Err(dtype_err(format!(
        "{what}: expected bytes, bytearray or memoryview, got {}",
        obj.get_type().name()?
    )))
}

/// One snapshot, or a list/tuple of them (a chain).
pub fn chain(obj: &Bound<'_, PyAny>) -> PyResult<Vec<PyBackedBytes>> {
    if obj.is_instance_of::<pyo3::types::PyList>() || obj.is_instance_of::<pyo3::types::PyTuple>() {
        return obj
            .try_iter()?
            .enumerate()
            .map(|(i, o)| data(&o?, &format!("data[{i}]")))
            .collect();
    }
    Ok(vec![data(obj, "data")?])
}

pub fn to_bytes(py: Python<'_>, v: Vec<u8>) -> Py<PyBytes> {
    PyBytes::new(py, &v).unbind()
}

/// What a snapshot holds, read without a cache: `kind` ("sequence" or
/// "cell"), `version`, `n_layers`, `start`, `end` and `complete` (every ring
/// layer carries the tail its next step needs). `SnapshotError` when the data
/// is not a snapshot this build reads.
#[pyfunction]
pub fn snapshot_info<'py>(
    py: Python<'py>,
    data: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyDict>> {
    let d = self::data(data, "data")?;
    let info = offgraph_kv::snapshot_info(&d).py_err()?;
    let out = PyDict::new(py);
    out.set_item("kind", if info.kind == 0 { "sequence" } else { "cell" })?;
    out.set_item("version", info.version)?;
    out.set_item("n_layers", info.n_layers)?;
    out.set_item("start", info.start)?;
    out.set_item("end", info.end)?;
    out.set_item("complete", info.complete)?;
    Ok(out)
}
