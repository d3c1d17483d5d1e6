//! A fixed-size f32 buffer shared between a pool and the views handed out of it.
//!
//! The pool writes into it in place (through `&mut Pool`); read-only views
//! (Python numpy arrays) hold an `Arc` so the memory outlives growth, `clear`
//! and the cache itself. Growth allocates a new buffer; old views keep the old
//! one, whose bytes no longer change.

use std::alloc::Layout;
use std::sync::Arc;

use crate::error::{CacheError, Result};

/// Heap memory for `len` f32 values, freed when the last `Arc` goes.
#[derive(Debug)]
pub struct Buffer {
    ptr: *mut f32,
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
    /// A zero-filled buffer; `OutOfCapacity` when the allocator refuses it
    /// (a huge but valid config must not abort the process). Zeroed pages come
    /// from the allocator (`alloc_zeroed`), so a large pool is not touched
    /// until rows are written.
    pub fn zeroed(len: usize) -> Result<Arc<Self>> {
        let refuse = |why: &str| {
            CacheError::OutOfCapacity(format!(
                "pool: cannot allocate {len} f32 values ({} bytes): {why}",
                len.saturating_mul(std::mem::size_of::<f32>())
            ))
        };
        if len == 0 {
            return Ok(Arc::new(Buffer {
                ptr: std::ptr::NonNull::<f32>::dangling().as_ptr(),
                len,
            }));
        }
        let layout = Layout::array::<f32>(len).map_err(|_| refuse("size overflows"))?;
        // SAFETY: the layout has a non-zero size (len > 0).
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) } as *mut f32;
        if ptr.is_null() {
            return Err(refuse("the allocator refused"));
        }
        Ok(Arc::new(Buffer { ptr, len }))
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_ptr(&self) -> *const f32 {
        self.ptr
    }

    pub(crate) fn as_mut_ptr(&self) -> *mut f32 {
        self.ptr
    }

    /// The whole buffer as a slice.
    pub fn as_slice(&self) -> &[f32] {
        // SAFETY: ptr/len come from a live Box<[f32]> owned by self; writers
        // need `&mut Pool`, which cannot coexist with this borrow of the pool.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if self.len == 0 {
            return;
        }
        if let Ok(layout) = Layout::array::<f32>(self.len) {
            // SAFETY: ptr was returned by alloc_zeroed with this very layout.
            unsafe { std::alloc::dealloc(self.ptr as *mut u8, layout) };
        }
    }
}
