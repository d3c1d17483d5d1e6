//! Snapshots: a sequence's K/V out of a cache as bytes, and back.
//!
//! Self-describing and versioned (see `format`): magic, format version, a
//! fingerprint of what makes rows compatible (per layer: policy, window,
//! heads, head_dim, K and V dtype codes, row bytes), positions, the rows as
//! the pools store them, and a CRC-32. Loading is all or nothing: anything
//! truncated, damaged, foreign or newer is [`crate::CacheError::Snapshot`]
//! and the cache is unchanged. Every size a snapshot claims is checked
//! against the data's length and the loading cache's layout before anything
//! is allocated: stored bytes are data, never code.

mod access;
mod cell;
mod chunk;
mod crc;
mod format;
mod seq;

pub use access::DTYPE_F32;
pub use crc::crc32;
pub use format::{LayerPrint, FORMAT_VERSION, MAGIC, MAX_POSITION};
pub use seq::{snapshot_info, SnapshotInfo};
