//! A fixed-size byte buffer shared between a pool and the views handed out of it.
//!
//! The pool writes into it in place (through `&mut Pool`); read-only views
//! (Python numpy arrays) hold an `Arc` so the memory outlives growth, `clear`
//! and the cache itself. Growth allocates a new buffer; old views keep the old
//! one, whose bytes no longer change.
//!
//! The memory is 64-byte aligned, so a float32 pool can be read as `f32` and
//! a half pool as `u16` in place.

use std::alloc::Layout;
use std::sync::Arc;

use crate::error::{CacheError, Result};

/// Alignment of every buffer (a cache line; enough for any element type).
const ALIGN: usize = 64;

/// Heap memory for `len` bytes, freed when the last `Arc` goes.
#[derive(Debug)]
pub struct Buffer {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the buffer is plain memory. Writes happen only through
// `Pool::write_rows`, which requires `&mut Pool` (the only writer); readers
// either borrow the pool (Rust) or hold an `Arc` and read through numpy
// (Python), which the docs state may observe rows a later step writes.
unsafe impl Send for Buffer {}
// SAFETY: see `Send`; shared access is read-only apart from the documented writer.
unsafe impl Sync for Buffer {}

impl Buffer {
    /// A zero-filled buffer of `len` bytes; `OutOfCapacity` when the allocator
    /// refuses it (a huge but valid config must not abort the process). Zeroed
    /// pages come from the allocator (`alloc_zeroed`), so a large pool is not
    /// touched until rows are written.
    pub fn zeroed(len: usize) -> Result<Arc<Self>> {
        let refuse = |why: &str| {
            CacheError::OutOfCapacity(format!("pool: cannot allocate {len} bytes: {why}"))
        };
        if len == 0 {
            return Ok(Arc::new(Buffer {
                // A dangling but aligned pointer: every typed view of it is valid and empty.
                ptr: std::ptr::without_provenance_mut(ALIGN),
                len,
            }));
        }
        let layout = Layout::from_size_align(len, ALIGN).map_err(|_| refuse("size overflows"))?;
        // SAFETY: the layout has a non-zero size (len > 0).
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(refuse("the allocator refused"));
        }
        Ok(Arc::new(Buffer { ptr, len }))
    }

    /// Bytes held.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first byte (64-byte aligned).
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr
    }

    pub(crate) fn as_mut_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// The whole buffer as bytes.
    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: ptr/len describe one live allocation owned by self; writers
        // need `&mut Pool`, which cannot coexist with this borrow of the pool.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if self.len == 0 {
            return;
        }
        if let Ok(layout) = Layout::from_size_align(self.len, ALIGN) {
            // SAFETY: ptr was returned by alloc_zeroed with this very layout.
            unsafe { std::alloc::dealloc(self.ptr, layout) };
        }
    }
}
