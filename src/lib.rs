//! offgraph-kv: an off-graph KV cache for LLM inference.
//!
//! Layers, each a module, arrows pointing down only:
//! attention → byte layer (`kv`) → neutral layer (`config`, `window`, `sequence`, `cell`, `registry`).
//! Below them all, shared with the engine crate: the CPU features kernels
//! dispatch on (`cpu`) and the half-precision number formats (`half`).
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

pub mod attention;
pub mod cell;
pub mod config;
pub mod cpu;
pub mod dtype;
pub mod error;
pub mod half;
pub mod kv;
pub mod registry;
pub mod runs;
pub mod sequence;
pub mod spec;
pub mod window;
pub mod workers;

pub use attention::{attend, attend_into, AttendOptions, Backend};
pub use cell::{CellCache, CellStepPlan, SeqId};
pub use config::{CacheConfig, LayerConfig, LayerPolicy};
pub use dtype::{KvDtype, KvRows, RowsIn};
pub use error::{CacheError, Result};
pub use kv::snapshot::{snapshot_info, SnapshotInfo};
pub use kv::{KvCellCache, KvSequenceCache, PoolMemory};
pub use runs::{MaskKind, Run, Runs};
pub use sequence::{SeqStepPlan, SequenceCache};
pub use spec::{AttendSpec, KeyLayout};

/// The README's Rust example runs as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
