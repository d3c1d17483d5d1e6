//! Snapshot arguments and the module-level `snapshot_info`.

use numpy::PyReadonlyArray1;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::{PyBytes, PyDict};

use crate::errors::{dtype_err, IntoPy};

/// Snapshot bytes: a `bytes` object's own buffer, a copy of a `bytearray`, or a
/// C-contiguous `memoryview` read in place (a numpy view of its buffer), so a
/// store value's slices reach the core without a copy.
pub enum Data<'py> {
    Bytes(PyBackedBytes),
    View(PyReadonlyArray1<'py, u8>),
}

impl std::ops::Deref for Data<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Data::Bytes(b) => b,
            // Contiguity is checked when the view is taken (`data`).
            Data::View(a) => a.as_slice().unwrap_or(&[]),
        }
    }
}

/// `bytes`, `bytearray` (copied) or `memoryview` (in place when C-contiguous).
pub fn data<'py>(obj: &Bound<'py, PyAny>, what: &str) -> PyResult<Data<'py>> {
    if let Ok(b) = obj.extract::<PyBackedBytes>() {
        return Ok(Data::Bytes(b));
    }
    if obj.is_instance_of::<pyo3::types::PyMemoryView>() {
        let contiguous = obj.getattr("c_contiguous")?.is_truthy()?;
        let flat = obj.getattr("ndim")?.extract::<usize>()? == 1
            && obj.getattr("itemsize")?.extract::<usize>()? == 1;
        if contiguous && flat {
            let np = obj.py().import("numpy")?;
            let arr = np.getattr("frombuffer")?.call1((obj, "uint8"))?;
            let view = arr.extract::<PyReadonlyArray1<'py, u8>>()?;
            if view.as_slice().is_ok() {
                return Ok(Data::View(view));
            }
        }
        let b = obj.call_method0("tobytes")?;
        return Ok(Data::Bytes(b.extract::<PyBackedBytes>()?));
    }
    Err(dtype_err(format!(
        "{what}: expected bytes, bytearray or memoryview, got {}",
        obj.get_type().name()?
    )))
}

/// One snapshot, or a list/tuple of them (a chain).
pub fn chain<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Vec<Data<'py>>> {
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
/// "cell" or "chunk"), `version`, `n_layers`, `start`, `end`, `complete` (every
/// ring layer carries the tail its next step needs) and `ring_from` (the first
/// position every ring layer carries). `SnapshotError` when the data
/// is not a snapshot this build reads.
#[pyfunction]
pub fn snapshot_info<'py>(
    py: Python<'py>,
    data: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyDict>> {
    let d = self::data(data, "data")?;
    let info = offgraph_kv::snapshot_info(&d).py_err()?;
    let out = PyDict::new(py);
    let kind = match info.kind {
        0 => "sequence",
        1 => "cell",
        _ => "chunk",
    };
    out.set_item("kind", kind)?;
    out.set_item("version", info.version)?;
    out.set_item("n_layers", info.n_layers)?;
    out.set_item("start", info.start)?;
    out.set_item("end", info.end)?;
    out.set_item("complete", info.complete)?;
    out.set_item("ring_from", info.ring_from)?;
    Ok(out)
}
