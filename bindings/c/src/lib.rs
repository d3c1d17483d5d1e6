//! The C ABI of offgraph-kv (`liboffgraph_kv_c`), described by the generated
//! header `include/offgraph_kv.h` and wrapped for C++ by `include/offgraph_kv.hpp`.
//!
//! Conventions every export keeps:
//! - It returns an [`okv_status`]; `OKV_OK` is zero. On failure the message is
//!   kept per thread and read with `okv_last_error()`.
//! - Its body runs inside `std::panic::catch_unwind` (`status::guard`): a
//!   panic becomes `OKV_ERR_PANIC`, never an unwind into C.
//! - Handles are opaque, made by `_new` and released by `_free`. Each is
//!   checked on entry against the set of live handles of its type (NULL,
//!   foreign, freed or wrongly typed handles are refused) and carries a magic
//!   tag cleared on free.
//! - Out-parameters are checked before anything changes and written only on
//!   success: a refused call changes nothing (the one exception, documented
//!   where it applies, is the size a `OKV_ERR_BUFFER_TOO_SMALL` reports).
//! - Each export is a plain `extern "C" fn` with its doc comment, because
//!   cbindgen reads the source without expanding macros (expansion needs a
//!   nightly compiler). Its body names one generic verb written once for both
//!   handle kinds of a family: `cell/verbs.rs`, the sequence verbs in
//!   `sequence.rs`, and the K/V faces of both pool-owning caches in `pools.rs`.
//!
//! Safety contract (every `unsafe extern "C" fn` here): a pointer with a
//! length points at that many readable (or writable, for outputs) elements,
//! and a string is NUL-terminated. The library checks NULL, alignment,
//! overlap with its own pools, and every size against the cache's shapes; it
//! cannot check that a non-NULL pointer really addresses the memory claimed.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]
// The C names are the ABI: snake_case types, SCREAMING variants.
#![allow(non_camel_case_types)]
// One safety contract for every export, stated above and in the header.
#![allow(clippy::missing_safety_doc)]

mod attend;
mod cell;
mod config;
mod dtype;
mod half_rows;
mod handle;
mod ids;
mod memory;
mod pools;
mod ptr;
mod registry;
mod sequence;
mod snapshot;
mod status;
mod window;

pub use attend::*;
pub use cell::*;
pub use config::*;
pub use dtype::*;
pub use half_rows::*;
pub use handle::okv_handle_kind;
pub use memory::*;
pub use pools::okv_pool_view;
pub use registry::*;
pub use sequence::*;
pub use snapshot::*;
pub use status::*;
pub use window::*;
