//! offgraph-kv-engine: GGUF models run natively over the offgraph-kv cache.
//!
//! Layers, arrows pointing down only:
//! `model` (families, the forward over a `KvCellCache`) → `quant` (block
//! formats, activation quantization, matmuls on stored weights) and
//! `tokenizer` (from the GGUF's own metadata) → `gguf` (the memory-mapped
//! file, every offset checked) → `ggml_type`, `error`.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

pub mod error;
pub mod ggml_type;
pub mod gguf;
pub mod model;
pub mod quant;
pub mod spec;
pub mod tokenizer;

pub use error::{EngineError, Result};
pub use ggml_type::GgmlType;
pub use model::{Arch, ChatDefaults, Family, Model, ModelConfig};
pub use spec::{Source, SpecStats, Speculator, Stream};
