//! The one error type of the core. Every fallible call returns `Result<T>`;
//! no path that a caller's input reaches panics.

use std::fmt;

/// What went wrong, with a message that names the offending value.
///
/// The bindings map each variant to one Python exception class under
/// `offgraph_kv.CacheError`, so keep the set small and the meaning stable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheError {
    /// A configuration field is out of range or inconsistent.
    InvalidConfig(String),
    /// An argument is out of range (a layer index, a rewind target, a token count).
    InvalidArgument(String),
    /// An argument has the wrong shape or dtype (arrays handed to the byte layer or attention).
    Shape(String),
    /// A key or builder that is not there.
    NotFound(String),
    /// A key that is already taken.
    KeyExists(String),
    /// Not enough room: capacity, free cells, sequence ids.
    OutOfCapacity(String),
    /// A sequence id the cache did not hand out, or one already freed.
    UnknownSequence(String),
    /// The step protocol was misused (plan with no open step, a rewrite, a stale spec).
    StepProtocol(String),
    /// A backend (XNNPACK) failed.
    Backend(String),
    /// A snapshot that cannot be loaded: truncated, damaged, foreign (another
    /// model or layout), newer-format, or not continuing this cache's state.
    Snapshot(String),
}

impl CacheError {
    /// The variant's short name, as the Python exception tree spells it.
    pub fn kind(&self) -> &'static str {
        match self {
            CacheError::InvalidConfig(_) => "InvalidConfig",
            CacheError::InvalidArgument(_) => "InvalidArgument",
            CacheError::Shape(_) => "Shape",
            CacheError::NotFound(_) => "NotFound",
            CacheError::KeyExists(_) => "KeyExists",
            CacheError::OutOfCapacity(_) => "OutOfCapacity",
            CacheError::UnknownSequence(_) => "UnknownSequence",
            CacheError::StepProtocol(_) => "StepProtocol",
            CacheError::Backend(_) => "Backend",
            CacheError::Snapshot(_) => "Snapshot",
        }
    }

    /// The human-readable message.
    pub fn message(&self) -> &str {
        match self {
            CacheError::InvalidConfig(m)
            | CacheError::InvalidArgument(m)
            | CacheError::Shape(m)
            | CacheError::NotFound(m)
            | CacheError::KeyExists(m)
            | CacheError::OutOfCapacity(m)
            | CacheError::UnknownSequence(m)
            | CacheError::StepProtocol(m)
            | CacheError::Backend(m)
            | CacheError::Snapshot(m) => m,
        }
    }
}

impl fmt::Display for CacheError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind(), self.message())
    }
}

impl std::error::Error for CacheError {}

/// The core's result type.
pub type Result<T> = std::result::Result<T, CacheError>;
