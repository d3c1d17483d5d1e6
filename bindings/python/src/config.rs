//! `Flat`, `Ring`, `LayerConfig`, `CacheConfig`.

use offgraph_kv::{CacheConfig, KvDtype, LayerConfig, LayerPolicy};
use pyo3::prelude::*;
use pyo3::types::PyList;

use crate::args::index_with;
use crate::errors::{config_err, dtype_err, IntoPy};

fn cfg_index(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<usize> {
    index_with(obj, what, config_err)
}

/// An optional config field: absent or `None` stays `None`.
fn opt_cfg_index(obj: Option<&Bound<'_, PyAny>>, what: &str) -> PyResult<Option<usize>> {
    obj.filter(|o| !o.is_none())
        .map(|o| cfg_index(o, what))
        .transpose()
}

/// `#[pymethods]` for a class wrapping a core config as `inner`: each `get`
/// entry `name: T` as a getter of the field `inner.name`, then the class's own
/// methods.
macro_rules! wrapper_methods {
    ($class:ident; get { $( $get:ident: $ty:ty, )* } $($items:tt)*) => {
        #[pymethods]
        impl $class {
            $(
                #[getter]
                fn $get(&self) -> $ty {
                    self.inner.$get
                }
            )*
            $($items)*
        }
    };
}

/// `LayerConfig(<policy>, n_kv_heads=.., head_dim=..)`.
fn layer_repr(l: &LayerConfig) -> String {
    format!(
        "LayerConfig({}, n_kv_heads={}, head_dim={})",
        policy_repr(l.policy),
        l.n_kv_heads,
        l.head_dim
    )
}

/// Keeps every position up to the cache's capacity.
#[pyclass(module = "offgraph_kv", frozen, eq, hash)]
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Flat;

#[pymethods]
impl Flat {
    #[new]
    fn new() -> Self {
        Flat
    }
    fn __repr__(&self) -> String {
        "Flat()".to_string()
    }
    #[getter]
    fn window(&self) -> Option<usize> {
        None
    }
}

/// A sliding window: a query at position p sees keys in [p - window + 1, p].
#[pyclass(module = "offgraph_kv", frozen, eq, hash)]
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Ring {
    #[pyo3(get)]
    window: usize,
}

#[pymethods]
impl Ring {
    #[new]
    #[pyo3(signature = (window))]
    fn new(window: &Bound<'_, PyAny>) -> PyResult<Self> {
        let window = cfg_index(window, "Ring.window")?;
        if window == 0 {
            return Err(config_err("Ring.window must be >= 1, got 0"));
        }
        Ok(Ring { window })
    }
    fn __repr__(&self) -> String {
        format!("Ring(window={})", self.window)
    }
}

pub fn policy_from_py(obj: &Bound<'_, PyAny>) -> PyResult<LayerPolicy> {
    if obj.cast::<Flat>().is_ok() {
        Ok(LayerPolicy::Flat)
    } else if let Ok(r) = obj.cast::<Ring>() {
        Ok(LayerPolicy::Ring {
            window: r.get().window,
        })
    } else {
        Err(dtype_err(format!(
            "policy: expected offgraph_kv.Flat() or offgraph_kv.Ring(window), got {}",
            crate::args::type_name(obj)
        )))
    }
}

pub fn policy_to_py(py: Python<'_>, p: LayerPolicy) -> PyResult<Py<PyAny>> {
    Ok(match p {
        LayerPolicy::Flat => Py::new(py, Flat)?.into_any(),
        LayerPolicy::Ring { window } => Py::new(py, Ring { window })?.into_any(),
    })
}

fn policy_repr(p: LayerPolicy) -> String {
    match p {
        LayerPolicy::Flat => "Flat()".to_string(),
        LayerPolicy::Ring { window } => format!("Ring(window={window})"),
    }
}

/// One layer's policy and K/V geometry.
#[pyclass(module = "offgraph_kv", name = "LayerConfig", frozen, eq)]
#[derive(Clone, PartialEq)]
pub struct PyLayerConfig {
    pub inner: LayerConfig,
}

wrapper_methods! {
    PyLayerConfig;
    get {
        n_kv_heads: usize,
        head_dim: usize,
    }

    #[new]
    #[pyo3(signature = (policy, n_kv_heads, head_dim))]
    fn new(
        policy: &Bound<'_, PyAny>,
        n_kv_heads: &Bound<'_, PyAny>,
        head_dim: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        Ok(PyLayerConfig {
            inner: LayerConfig::new(
                policy_from_py(policy)?,
                cfg_index(n_kv_heads, "LayerConfig.n_kv_heads")?,
                cfg_index(head_dim, "LayerConfig.head_dim")?,
            ),
        })
    }
    #[getter]
    fn policy(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        policy_to_py(py, self.inner.policy)
    }
    fn __repr__(&self) -> String {
        layer_repr(&self.inner)
    }
}

/// The whole cache's configuration. Construction checks types; `validate()`
/// checks ranges and raises `ConfigError` naming the bad field.
#[pyclass(module = "offgraph_kv", name = "CacheConfig", frozen, eq)]
#[derive(Clone, PartialEq)]
pub struct PyCacheConfig {
    pub inner: CacheConfig,
}

wrapper_methods! {
    PyCacheConfig;
    get {
        capacity: usize,
        n_layers: usize,
        initial_capacity: usize,
        max_step: usize,
    }

    #[new]
    #[pyo3(signature = (capacity, n_layers, layers, initial_capacity=None, max_step=None, dtype=None, k_dtype=None, v_dtype=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        capacity: &Bound<'_, PyAny>,
        n_layers: &Bound<'_, PyAny>,
        layers: &Bound<'_, PyAny>,
        initial_capacity: Option<&Bound<'_, PyAny>>,
        max_step: Option<&Bound<'_, PyAny>>,
        dtype: Option<&Bound<'_, PyAny>>,
        k_dtype: Option<&Bound<'_, PyAny>>,
        v_dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let capacity = cfg_index(capacity, "capacity")?;
        let n_layers = cfg_index(n_layers, "n_layers")?;
        let mut list = Vec::new();
        if let Ok(one) = layers.cast::<PyLayerConfig>() {
            list.push(one.get().inner);
        } else {
            let iter = layers
                .try_iter()
                .map_err(|_| dtype_err("layers: expected a LayerConfig or a list of them"))?;
            for (i, item) in iter.enumerate() {
                let item = item?;
                let lc = item
                    .cast::<PyLayerConfig>()
                    .map_err(|_| dtype_err(format!("layers[{i}]: expected a LayerConfig")))?;
                list.push(lc.get().inner);
            }
        }
        let mut cfg = CacheConfig::new(capacity, n_layers, list);
        if let Some(v) = opt_cfg_index(initial_capacity, "initial_capacity")? {
            cfg.initial_capacity = v;
        }
        if let Some(v) = opt_cfg_index(max_step, "max_step")? {
            cfg.max_step = v;
        }
        let both = kv_dtype(dtype, "dtype")?.unwrap_or_default();
        cfg.k_dtype = kv_dtype(k_dtype, "k_dtype")?.unwrap_or(both);
        cfg.v_dtype = kv_dtype(v_dtype, "v_dtype")?.unwrap_or(both);
        Ok(PyCacheConfig { inner: cfg })
    }

    /// Raises `ConfigError` naming the first bad field.
    fn validate(&self) -> PyResult<()> {
        self.inner.validate().py_err()
    }

    #[getter]
    fn layers<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let items: Vec<PyLayerConfig> = self
            .inner
            .layers
            .iter()
            .map(|l| PyLayerConfig { inner: *l })
            .collect();
        PyList::new(py, items)
    }
    /// The K pools' storage type ("float32", "float16", "bfloat16", "q8_0").
    #[getter]
    fn k_dtype(&self) -> &'static str {
        self.inner.k_dtype.name()
    }
    /// The V pools' storage type.
    #[getter]
    fn v_dtype(&self) -> &'static str {
        self.inner.v_dtype.name()
    }
    /// Pool depth in slots of a layer (flat: capacity; ring: window + max_step - 1).
    fn depth(&self, layer: &Bound<'_, PyAny>) -> PyResult<usize> {
        let layer = crate::args::index(layer, "layer")?;
        let l = self.inner.layer(layer).py_err()?;
        Ok(self.inner.depth(l.policy))
    }
    fn __repr__(&self) -> String {
        let layers: Vec<String> = self.inner.layers.iter().map(layer_repr).collect();
        format!(
            "CacheConfig(capacity={}, n_layers={}, layers=[{}], initial_capacity={}, max_step={}, k_dtype={:?}, v_dtype={:?})",
            self.inner.capacity,
            self.inner.n_layers,
            layers.join(", "),
            self.inner.initial_capacity,
            self.inner.max_step,
            self.inner.k_dtype.name(),
            self.inner.v_dtype.name()
        )
    }
}

/// A dtype name (`None` or absent stays `None`); an unknown name is `ConfigError`.
fn kv_dtype(obj: Option<&Bound<'_, PyAny>>, what: &str) -> PyResult<Option<KvDtype>> {
    match obj.filter(|o| !o.is_none()) {
        None => Ok(None),
        Some(o) => {
            let name = crate::args::text(o, what)?;
            KvDtype::parse(&name).map(Some).map_err(|_| {
                config_err(format!(
                    "{what}: expected one of \"float32\", \"float16\", \"bfloat16\", \"q8_0\", got {name:?}"
                ))
            })
        }
    }
}
