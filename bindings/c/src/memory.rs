//! Pool memory figures and giving pages back: `_reserved_bytes` of both
//! pool-owning caches and `okv_kv_cell_cache_trim`.
//!
//! Pools reserve address space for their whole depth once and the OS commits
//! a page when a row on it is first written, so growth never moves a byte and
//! a pool view's pointers stay valid across `_update`s; `_clear` (and a cell
//! cache's `_trim`) gives pages back. Where the OS refuses the reservation
//! (or `OFFGRAPH_KV_POOLS=grow` is set) pools grow by copying, as before.

use offgraph_kv::{KvCellCache, KvSequenceCache};

use crate::cell::okv_kv_cell_cache;
use crate::handle::{mutate, query, Opaque};
use crate::sequence::okv_kv_seq_cache;
use crate::status::{guard, okv_status, R};

/// The caches whose pools hold address space.
trait Reserved {
    fn reserved(&self) -> usize;
}

impl Reserved for KvSequenceCache {
    fn reserved(&self) -> usize {
        self.reserved_bytes()
    }
}

impl Reserved for KvCellCache {
    fn reserved(&self) -> usize {
        self.reserved_bytes()
    }
}

/// `_reserved_bytes` of either cache.
unsafe fn reserved<H: Opaque>(h: *const H, o: *mut usize, what: &str) -> R<()>
where
    H::Inner: Reserved,
{
    unsafe { query(h, o, what, |c| Ok(c.reserved())) }
}

/// Address space all pools hold: their whole depth when reserved (committed
/// only where rows were written), the grown buffers otherwise. `_nbytes` is
/// what the rows need.
///
/// Statuses: `OKV_OK`; `OKV_ERR_NULL_POINTER` (a null `cache` or `out_bytes`);
/// `OKV_ERR_BAD_HANDLE`; `OKV_ERR_BUSY`. `*out_bytes` is written only on
/// `OKV_OK`.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_seq_cache_reserved_bytes(
    cache: *const okv_kv_seq_cache,
    out_bytes: *mut usize,
) -> okv_status {
    guard(|| unsafe { reserved(cache, out_bytes, "okv_kv_seq_cache_reserved_bytes") })
}

/// See `okv_kv_seq_cache_reserved_bytes`.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_cell_cache_reserved_bytes(
    cache: *const okv_kv_cell_cache,
    out_bytes: *mut usize,
) -> okv_status {
    guard(|| unsafe { reserved(cache, out_bytes, "okv_kv_cell_cache_reserved_bytes") })
}

/// Gives back to the OS the pool pages that no live cell touches (the rows
/// of freed cells read as zeros afterwards) and lowers `_nbytes` to the
/// highest live cell. Changes no bookkeeping: an open step stays open.
/// O(n_cells) per layer: call it after freeing sequences, not per step.
/// Pools that grow by copying keep their memory until `_clear`.
///
/// Statuses: `OKV_OK`; `OKV_ERR_NULL_POINTER` (a null `cache`);
/// `OKV_ERR_BAD_HANDLE`; `OKV_ERR_BUSY`.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_cell_cache_trim(cache: *mut okv_kv_cell_cache) -> okv_status {
    guard(|| unsafe {
        mutate(cache.cast_const(), "okv_kv_cell_cache_trim", |c| {
            Ok(c.trim()?)
        })
    })
}
