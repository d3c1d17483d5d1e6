//! Python bindings of offgraph-kv: the native module `offgraph_kv._native`.
//!
//! Every core error maps onto the exception tree in `offgraph_kv._errors`.

mod args;
mod attention;
mod cell;
mod config;
mod engine;
mod errors;
mod faces;
mod pools;
mod registry;
mod sequence;
mod skeleton;
mod snapshot;
mod spec;
mod window;

use pyo3::prelude::*;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<config::Flat>()?;
    m.add_class::<config::Ring>()?;
    m.add_class::<config::PyLayerConfig>()?;
    m.add_class::<config::PyCacheConfig>()?;
    m.add_class::<sequence::PySequenceCache>()?;
    m.add_class::<sequence::PyKvSequenceCache>()?;
    m.add_class::<sequence::SequenceControl>()?;
    m.add_class::<sequence::SequencePlanner>()?;
    m.add_class::<sequence::PySeqStepPlan>()?;
    m.add_class::<spec::PyAttendSpec>()?;
    m.add_class::<cell::PyCellCache>()?;
    m.add_class::<cell::PyKvCellCache>()?;
    m.add_class::<cell::CellControl>()?;
    m.add_class::<cell::CellPlanner>()?;
    m.add_class::<cell::PyCellStepPlan>()?;
    m.add_function(wrap_pyfunction!(attention::attend, m)?)?;
    m.add_function(wrap_pyfunction!(snapshot::snapshot_info, m)?)?;
    m.add_class::<spec::PoolBuffer>()?;
    m.add_function(wrap_pyfunction!(spec::dequantize, m)?)?;
    m.add_function(wrap_pyfunction!(registry::install, m)?)?;
    m.add_function(wrap_pyfunction!(registry::get, m)?)?;
    m.add_function(wrap_pyfunction!(registry::erase, m)?)?;
    m.add_function(wrap_pyfunction!(registry::erase_if_same, m)?)?;
    m.add_function(wrap_pyfunction!(registry::contains, m)?)?;
    m.add_function(wrap_pyfunction!(registry::keys, m)?)?;
    m.add_function(wrap_pyfunction!(registry::unique_key, m)?)?;
    m.add_function(wrap_pyfunction!(registry::register_builder, m)?)?;
    m.add_function(wrap_pyfunction!(registry::build, m)?)?;
    m.add_function(wrap_pyfunction!(window::ring_keep, m)?)?;
    m.add_function(wrap_pyfunction!(window::first_visible, m)?)?;
    m.add_function(wrap_pyfunction!(window::cells_for_forks, m)?)?;
    m.add_class::<engine::PyGgufModel>()?;
    m.add_class::<engine::PyGgufTokenizer>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
