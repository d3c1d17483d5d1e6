//! The native engine's Python face: `offgraph_kv._native.GgufModelCore` and
//! `GgufTokenizerCore`, wrapped by `offgraph_kv.engine.GgufModel`.
//!
//! The forward releases the GIL. The model sits behind a read-write lock: a
//! forward and tokenizer calls share it, `threads` takes it alone.

use std::sync::{Arc, RwLock, RwLockReadGuard};

use numpy::{PyArray2, PyArrayMethods};
use offgraph_kv::{KvDtype, LayerPolicy};
use offgraph_kv_engine::gguf::GgufFile;
use offgraph_kv_engine::model::family;
use offgraph_kv_engine::tokenizer::Tokenizer;
use offgraph_kv_engine::{EngineError, Model};
use pyo3::prelude::*;

use crate::args::{index, index_list};
use crate::cell::PyKvCellCache;
use crate::errors::{borrow_mut, invalid_arg, shape_err, to_py, ErrorClass};

/// The Python exception for an engine error: the core's own class for a
/// cache refusal, `InvalidArgumentError` for a bad argument, `EngineError`
/// for a file that cannot be run.
pub fn engine_err(e: EngineError) -> PyErr {
    match e {
        EngineError::Cache(c) => to_py(c),
        EngineError::InvalidArgument(m) => invalid_arg(m),
        other => ErrorClass::Engine.err(other.to_string()),
    }
}

trait EngineResult<T> {
    fn py_engine(self) -> PyResult<T>;
}

impl<T> EngineResult<T> for offgraph_kv_engine::Result<T> {
    fn py_engine(self) -> PyResult<T> {
        self.map_err(engine_err)
    }
}

type Shared = Arc<RwLock<Model>>;

fn read(m: &Shared) -> RwLockReadGuard<'_, Model> {
    // A poisoned lock means a panic elsewhere; the model holds no state a
    // panic could tear (weights are read-only views).
    m.read().unwrap_or_else(|e| e.into_inner())
}

fn ids_of(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<u32>> {
    index_list(obj, what)?
        .into_iter()
        .map(|v| {
            u32::try_from(v)
                .map_err(|_| invalid_arg(format!("{what}: token id {v} is out of range")))
        })
        .collect()
}

fn logits_array<'py>(
    py: Python<'py>,
    rows: usize,
    vocab: usize,
    data: Vec<f32>,
) -> PyResult<Bound<'py, PyArray2<f32>>> {
    numpy::PyArray1::from_vec(py, data)
        .reshape([rows, vocab])
        .map_err(|e| shape_err(e.to_string()))
}

/// A GGUF model run by the native engine (see `offgraph_kv.engine.GgufModel`).
#[pyclass(module = "offgraph_kv._native", name = "GgufModelCore", frozen)]
pub struct PyGgufModel {
    model: Shared,
}

#[pymethods]
impl PyGgufModel {
    #[new]
    #[pyo3(signature = (path, threads=None))]
    fn new(
        py: Python<'_>,
        path: std::path::PathBuf,
        threads: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let threads = match threads.filter(|t| !t.is_none()) {
            Some(t) => Some(index(t, "threads")?),
            None => None,
        };
        if threads == Some(0) {
            return Err(invalid_arg("threads must be >= 1, got 0"));
        }
        let mut model = py.detach(|| Model::open(&path)).py_engine()?;
        if let Some(t) = threads {
            model.set_threads(t);
        }
        Ok(PyGgufModel {
            model: Arc::new(RwLock::new(model)),
        })
    }

    #[getter]
    fn threads(&self) -> usize {
        read(&self.model).threads()
    }

    #[setter]
    fn set_threads(&self, n: &Bound<'_, PyAny>) -> PyResult<()> {
        let n = index(n, "threads")?;
        if n == 0 {
            return Err(invalid_arg("threads must be >= 1, got 0"));
        }
        self.model
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .set_threads(n);
        Ok(())
    }

    #[getter]
    fn architecture(&self) -> String {
        read(&self.model).config().arch.name().to_owned()
    }

    #[getter]
    fn vocab_size(&self) -> usize {
        read(&self.model).config().vocab
    }

    /// The family's turn-end pieces: generation stops at them as at eos.
    #[getter]
    fn turn_ends(&self) -> Vec<&'static str> {
        read(&self.model).chat_defaults().turn_ends.to_vec()
    }

    /// The family's chat template, for files that carry none.
    #[getter]
    fn default_chat_template(&self) -> Option<&'static str> {
        read(&self.model).chat_defaults().template
    }

    /// `(turn_ends, default_chat_template)` of the family an architecture or
    /// Hugging Face `model_type` names; for `None` or an unknown name, every
    /// family's turn ends and no template (a model run without the engine).
    #[staticmethod]
    #[pyo3(signature = (name=None))]
    fn family_chat_defaults(name: Option<&str>) -> (Vec<&'static str>, Option<&'static str>) {
        match name.and_then(family::chat_defaults) {
            Some(d) => (d.turn_ends.to_vec(), d.template),
            None => (family::all_turn_ends(), None),
        }
    }

    #[getter]
    fn max_positions(&self) -> usize {
        read(&self.model).config().context_length
    }

    /// `(window or None, n_kv_heads, head_dim)` per layer: the cache layout.
    fn layers(&self) -> PyResult<Vec<(Option<usize>, usize, usize)>> {
        let m = read(&self.model);
        let cfg = m
            .cache_config(1, KvDtype::Float32, KvDtype::Float32)
            .py_engine()?;
        let n = cfg.n_layers;
        Ok((0..n)
            .filter_map(|i| cfg.layers.get(if cfg.layers.len() == 1 { 0 } else { i }))
            .map(|l| {
                let w = match l.policy {
                    LayerPolicy::Flat => None,
                    LayerPolicy::Ring { window } => Some(window),
                };
                (w, l.n_kv_heads, l.head_dim)
            })
            .collect())
    }

    /// The tokenizer the file carries.
    #[getter]
    fn tokenizer(&self) -> PyGgufTokenizer {
        PyGgufTokenizer {
            source: Source::Model(Arc::clone(&self.model)),
        }
    }

    /// Logits `[len(rows), vocab]` for an open step of `kc` (the caller ran
    /// `kc.begin_step(seq_ids, positions)`): the step's K/V are written to
    /// the pools on the way. The GIL is released while it computes.
    fn forward_cells<'py>(
        &self,
        py: Python<'py>,
        kc: &Bound<'py, PyKvCellCache>,
        tokens: &Bound<'py, PyAny>,
        positions: &Bound<'py, PyAny>,
        rows: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let tokens = ids_of(tokens, "tokens")?;
        let positions = index_list(positions, "positions")?;
        let rows = index_list(rows, "rows")?;
        let model = Arc::clone(&self.model);
        let mut cache = borrow_mut(kc.as_super(), "forward_cells")?;
        let kv = cache.inner.kv_mut("KvCellCache")?;
        let (n, vocab, data) = py
            .detach(|| {
                let m = read(&model);
                let vocab = m.config().vocab;
                m.forward_open_step(kv, &tokens, &positions, &rows)
                    .map(|d| (rows.len(), vocab, d))
            })
            .py_engine()?;
        drop(cache);
        logits_array(py, n, vocab, data)
    }

    /// Logits `[len(ids), vocab]` of one sequence run from position 0 in a
    /// private cache (tests and scoring). `kv_dtype` names the pool dtype.
    #[pyo3(signature = (ids, kv_dtype=None, chunk=512))]
    fn logits<'py>(
        &self,
        py: Python<'py>,
        ids: &Bound<'py, PyAny>,
        kv_dtype: Option<&str>,
        chunk: usize,
    ) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let ids = ids_of(ids, "ids")?;
        if ids.is_empty() {
            return Err(invalid_arg("ids: expected at least one token, got none"));
        }
        if chunk == 0 {
            return Err(invalid_arg("chunk must be >= 1, got 0"));
        }
        let dtype = KvDtype::parse(kv_dtype.unwrap_or("float32")).map_err(to_py)?;
        let model = Arc::clone(&self.model);
        let (vocab, data) = py
            .detach(|| -> offgraph_kv_engine::Result<(usize, Vec<f32>)> {
                let m = read(&model);
                let vocab = m.config().vocab;
                let step = chunk.min(ids.len());
                let mut kc = m.new_cache(ids.len(), 1, step, dtype, dtype)?;
                let seq = kc.cells_mut().seq_new()?;
                let mut out = Vec::with_capacity(ids.len().saturating_mul(vocab));
                for (c, part) in ids.chunks(step).enumerate() {
                    let p0 = c.saturating_mul(step);
                    let positions: Vec<usize> = (p0..p0.saturating_add(part.len())).collect();
                    let seqs = vec![seq; part.len()];
                    let rows: Vec<usize> = (0..part.len()).collect();
                    out.extend(m.forward(&mut kc, part, &seqs, &positions, &rows)?);
                }
                Ok((vocab, out))
            })
            .py_engine()?;
        logits_array(py, ids.len(), vocab, data)
    }
}

/// Where a tokenizer lives: in a model, or alone (a file opened for its
/// tokenizer only, which needs no weights).
#[derive(Clone)]
enum Source {
    Model(Shared),
    Alone(Arc<Tokenizer>),
}

impl Source {
    fn with<R>(&self, f: impl FnOnce(&Tokenizer) -> R) -> R {
        match self {
            Source::Model(m) => f(read(m).tokenizer()),
            Source::Alone(t) => f(t),
        }
    }
}

/// The tokenizer of a `GgufModelCore` (see `offgraph_kv.engine.GgufTokenizer`),
/// or of a GGUF file's metadata alone (`GgufTokenizerCore.open`).
#[pyclass(module = "offgraph_kv._native", name = "GgufTokenizerCore", frozen)]
pub struct PyGgufTokenizer {
    source: Source,
}

#[pymethods]
impl PyGgufTokenizer {
    /// The tokenizer a GGUF file's metadata describes, without its weights
    /// (a file may hold no tensors at all).
    #[staticmethod]
    fn open(py: Python<'_>, path: &str) -> PyResult<PyGgufTokenizer> {
        let path = path.to_owned();
        let tok = py
            .detach(move || {
                GgufFile::open(&path).and_then(|f| Tokenizer::from_metadata(f.metadata()))
            })
            .py_engine()?;
        Ok(PyGgufTokenizer {
            source: Source::Alone(Arc::new(tok)),
        })
    }

    #[pyo3(signature = (text, add_special_tokens=true))]
    fn encode(&self, py: Python<'_>, text: &str, add_special_tokens: bool) -> Vec<u32> {
        let source = self.source.clone();
        let text = text.to_owned();
        py.detach(move || source.with(|t| t.encode(&text, add_special_tokens)))
    }

    #[pyo3(signature = (ids, skip_special_tokens=false))]
    fn decode(&self, ids: &Bound<'_, PyAny>, skip_special_tokens: bool) -> PyResult<String> {
        let ids = ids_of(ids, "ids")?;
        self.source
            .with(|t| t.decode(&ids, skip_special_tokens))
            .py_engine()
    }

    /// A token's raw bytes (a streaming decoder joins them, then decodes UTF-8).
    fn token_bytes<'py>(
        &self,
        py: Python<'py>,
        id: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, pyo3::types::PyBytes>> {
        let id = ids_of(&pyo3::types::PyList::new(py, [id])?.into_any(), "id")?;
        let b = self
            .source
            .with(|t| t.token_bytes(id.first().copied().unwrap_or(0)))
            .py_engine()?;
        Ok(pyo3::types::PyBytes::new(py, &b))
    }

    fn token_to_id(&self, piece: &str) -> Option<u32> {
        self.source.with(|t| t.token_id(piece))
    }

    fn is_special(&self, id: u32) -> bool {
        self.source.with(|t| t.is_special(id))
    }

    #[getter]
    fn vocab_size(&self) -> usize {
        self.source.with(|t| t.vocab_size())
    }

    #[getter]
    fn bos_token_id(&self) -> Option<u32> {
        self.source.with(|t| t.bos())
    }

    #[getter]
    fn eos_token_id(&self) -> Option<u32> {
        self.source.with(|t| t.eos())
    }

    #[getter]
    fn add_bos(&self) -> bool {
        self.source.with(|t| t.add_bos())
    }

    #[getter]
    fn chat_template(&self) -> Option<String> {
        self.source.with(|t| t.chat_template().map(str::to_owned))
    }
}
