//! A fixed-size f32 buffer shared between a pool and the views handed out of it.
//!
//! The pool writes into it in place (through `&mut Pool`); read-only views
//! (Python numpy arrays) hold an `Arc` so the memory outlives growth, `clear`
//! and the cache itself. Growth allocates a new buffer; old views keep the old
//! one, whose bytes no longer change.

use std::sync::Arc;

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
    /// A zero-filled buffer.
    pub fn zeroed(len: usize) -> Arc<Self> {
        let boxed: Box<[f32]> = vec![0.0f32; len].into_boxed_slice();
        let ptr = Box::into_raw(boxed) as *mut f32;
        Arc::new(Buffer { ptr, len })
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
        // SAFETY: ptr/len were produced by Box::into_raw of a Box<[f32]> of this length.
        unsafe {
            drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                self.ptr, self.len,
            )));
        }
    }
}
