//! The engine's one error type. Every fallible call returns `Result<T>`; no
//! path that a file's bytes or a caller's input reaches panics.

use std::fmt;

/// What went wrong, with a message naming the offending value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineError {
    /// The file could not be opened or mapped.
    Io(String),
    /// The file is not a well-formed GGUF: bad magic, truncated, an offset,
    /// size or count that does not fit the file, bad alignment, a bad string.
    Format(String),
    /// Well-formed, but not something the engine runs: a GGUF version, a
    /// tensor type, an architecture, a tokenizer model.
    Unsupported(String),
    /// A metadata key or tensor the model needs is missing or has the wrong
    /// type or shape.
    Model(String),
    /// A caller's argument is out of range (token ids, row counts, buffers).
    InvalidArgument(String),
    /// The cache refused a step (capacity, unknown sequence, protocol).
    Cache(offgraph_kv::CacheError),
}

impl EngineError {
    /// The variant's short name.
    pub fn kind(&self) -> &'static str {
        match self {
            EngineError::Io(_) => "Io",
            EngineError::Format(_) => "Format",
            EngineError::Unsupported(_) => "Unsupported",
            EngineError::Model(_) => "Model",
            EngineError::InvalidArgument(_) => "InvalidArgument",
            EngineError::Cache(_) => "Cache",
        }
    }
}

impl fmt::Display for EngineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EngineError::Io(m)
            | EngineError::Format(m)
            | EngineError::Unsupported(m)
            | EngineError::Model(m)
            | EngineError::InvalidArgument(m) => write!(f, "{}: {m}", self.kind()),
            EngineError::Cache(e) => write!(f, "Cache: {e}"),
        }
    }
}

impl std::error::Error for EngineError {}

impl From<offgraph_kv::CacheError> for EngineError {
    fn from(e: offgraph_kv::CacheError) -> Self {
        EngineError::Cache(e)
    }
}

/// The engine's result type.
pub type Result<T> = std::result::Result<T, EngineError>;
