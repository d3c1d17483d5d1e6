//! A fixed-size byte buffer shared between a pool and the views handed out of it.
//!
//! Two kinds of memory back it:
//! - a **reservation** ([`Buffer::reserve`]): an anonymous private mapping of
//!   the pool's whole depth made without reserving swap (`MAP_NORESERVE` on
//!   Linux). The OS commits a page the first time a row on it is written, and
//!   [`Buffer::release`] hands pages back (`MADV_DONTNEED`: they read as zeros
//!   afterwards and cost nothing until written again). The address never
//!   changes, so growth moves no byte and views never go stale;
//! - **heap** memory ([`Buffer::zeroed`]) for pools that grow by copying, where
//!   the OS refuses the reservation (strict overcommit, a small address space)
//!   or the fallback is asked for.
//!
//! The pool writes into it in place (through `&mut Pool`); read-only views
//! (Python numpy arrays) hold an `Arc`, so the memory outlives growth, `clear`
//! and the cache itself. The memory is at least 64-byte aligned, so a float32
//! pool can be read as `f32` and a half pool as `u16` in place.

use std::alloc::Layout;
use std::sync::Arc;

use crate::error::{CacheError, Result};

/// Alignment of every heap buffer (a cache line; enough for any element type).
const ALIGN: usize = 64;

/// Memory for `len` bytes, freed (or unmapped) when the last `Arc` goes.
#[derive(Debug)]
pub struct Buffer {
    ptr: *mut u8,
    len: usize,
    /// The mapping of a reservation; `None` for heap memory.
    map: Option<memmap2::MmapMut>,
}

// SAFETY: the buffer is plain memory. Writes (and page releases) happen only
// through `Pool`, which requires `&mut Pool` (the only writer); readers either
// borrow the pool (Rust) or hold an `Arc` and read through numpy (Python),
// which the docs state may observe rows a later step writes.
unsafe impl Send for Buffer {}
// SAFETY: see `Send`; shared access is read-only apart from the documented writer.
unsafe impl Sync for Buffer {}

impl Buffer {
    /// A zero-filled heap buffer of `len` bytes; `OutOfCapacity` when the
    /// allocator refuses it (a huge but valid config must not abort the
    /// process). Zeroed pages come from the allocator (`alloc_zeroed`), so a
    /// large buffer is not touched until rows are written.
    pub fn zeroed(len: usize) -> Result<Arc<Self>> {
        let refuse = |why: &str| {
            CacheError::OutOfCapacity(format!("pool: cannot allocate {len} bytes: {why}"))
        };
        if len == 0 {
            return Ok(Arc::new(Self::empty()));
        }
        let layout = Layout::from_size_align(len, ALIGN).map_err(|_| refuse("size overflows"))?;
        // SAFETY: the layout has a non-zero size (len > 0).
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(refuse("the allocator refused"));
        }
        Ok(Arc::new(Buffer {
            ptr,
            len,
            map: None,
        }))
    }

    /// An address range of `len` bytes reserved without committing memory:
    /// pages read as zeros and are committed when first written. `Err` (with
    /// the OS's reason) when the OS refuses, or on a platform where a
    /// reservation would commit memory up front (then pools grow by copying).
    pub fn reserve(len: usize) -> std::result::Result<Arc<Self>, String> {
        if len == 0 {
            return Ok(Arc::new(Self::empty()));
        }
        if !cfg!(unix) {
            return Err("no lazily committed anonymous mappings on this platform".into());
        }
        let mut map = memmap2::MmapOptions::new()
            .len(len)
            .no_reserve_swap()
            .map_anon()
            .map_err(|e| e.to_string())?;
        let ptr = map.as_mut_ptr();
        Ok(Arc::new(Buffer {
            ptr,
            len,
            map: Some(map),
        }))
    }

    /// An empty buffer: a dangling but aligned pointer, so every typed view
    /// of it is valid and empty.
    fn empty() -> Self {
        Buffer {
            ptr: std::ptr::without_provenance_mut(ALIGN),
            len: 0,
            map: None,
        }
    }

    /// Bytes held (for a reservation: address space, not committed memory).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes of this buffer the OS holds: for a reservation its resident
    /// pages (`mincore`; a page only ever read maps the shared zero page and
    /// counts too; where it cannot be asked, the whole length); for heap
    /// memory its length (held whether or not touched).
    pub fn committed_bytes(&self) -> usize {
        match &self.map {
            Some(map) => resident(map).unwrap_or(self.len),
            None => self.len,
        }
    }

    /// Whether this is a reservation (pages committed on first write).
    pub fn is_reserved(&self) -> bool {
        self.map.is_some()
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
        // SAFETY: ptr/len describe one live allocation or mapping owned by
        // self; writers need `&mut Pool`, which cannot coexist with this
        // borrow of the pool.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// Commits the page of a reservation that holds byte `at` before a row
    /// on it is written (a heap buffer does nothing). Callers hold `&mut
    /// Pool`; the page's bytes do not change, so readers see nothing.
    pub(crate) fn prefault(&self, at: usize) {
        if let Some(map) = &self.map {
            if at < self.len {
                populate(map, at);
            }
        }
    }

    /// Gives the whole pages inside bytes `[start, end)` of a reservation
    /// back to the OS; they read as zeros afterwards. Bytes of partly covered
    /// pages are kept. A heap buffer keeps its memory (nothing happens).
    /// Callers hold `&mut Pool`, the only writer (see `Send`).
    pub(crate) fn release(&self, start: usize, end: usize) {
        let Some(map) = &self.map else {
            return;
        };
        let page = page_size();
        let end = end.min(self.len);
        // The mapping starts on a page, so offsets align as addresses do. Its
        // last page is whole to the OS, so the very end needs no rounding.
        let lo = start.div_ceil(page).saturating_mul(page);
        let hi = if end == self.len {
            end
        } else {
            end.checked_rem(page).map_or(end, |r| end.saturating_sub(r))
        };
        if lo < hi {
            dont_need(map, lo, hi.saturating_sub(lo));
        }
    }
}

/// Commits the page holding byte `at` of `map` now (`MADV_POPULATE_WRITE`),
/// without changing a byte of it. An error (a kernel before 5.14) only means
/// the first write commits it instead.
#[cfg(target_os = "linux")]
fn populate(map: &memmap2::MmapMut, at: usize) {
    let page = page_size();
    let lo = at.saturating_sub(at.checked_rem(page).unwrap_or(0));
    let len = page.min(map.len().saturating_sub(lo));
    if len > 0 {
        let _ = map.advise_range(memmap2::Advice::PopulateWrite, lo, len);
    }
}

#[cfg(not(target_os = "linux"))]
fn populate(_: &memmap2::MmapMut, _: usize) {}

/// Bytes of `map` on resident pages (the last page capped at the length);
/// `None` when the OS does not say.
#[cfg(target_os = "linux")]
fn resident(map: &memmap2::MmapMut) -> Option<usize> {
    let page = page_size();
    let mut vec = vec![0u8; map.len().div_ceil(page)];
    // SAFETY: the mapping starts on a page and spans `map.len()` bytes; `vec`
    // holds one byte per page of it, which is all mincore writes.
    let rc = unsafe {
        libc::mincore(
            map.as_ptr() as *mut libc::c_void,
            map.len(),
            vec.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return None;
    }
    let pages = vec.iter().filter(|&&b| b & 1 != 0).count();
    Some(pages.saturating_mul(page).min(map.len()))
}

#[cfg(not(target_os = "linux"))]
fn resident(_: &memmap2::MmapMut) -> Option<usize> {
    None
}

/// Gives pages `[lo, lo + len)` of `map` back to the OS.
#[cfg(unix)]
fn dont_need(map: &memmap2::MmapMut, lo: usize, len: usize) {
    // SAFETY: the caller passes a range inside the mapping that starts on a
    // page and ends on a page or at the mapping's end, so no byte outside it
    // changes. The pages read as zeros afterwards, which every reader of these
    // bytes may observe: the released rows belong to nothing the cache holds.
    // An error (which the OS does not give for a valid private anonymous
    // range) only means the memory stays committed.
    let _ = unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, lo, len) };
}

#[cfg(not(unix))]
fn dont_need(_: &memmap2::MmapMut, _: usize, _: usize) {}

/// The OS page size (4 KiB where it cannot be read).
#[cfg(unix)]
pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n).ok().filter(|&n| n > 0).unwrap_or(4096)
}

#[cfg(not(unix))]
pub(crate) fn page_size() -> usize {
    4096
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if self.len == 0 || self.map.is_some() {
            // A mapping is unmapped by its own drop.
            return;
        }
        if let Ok(layout) = Layout::from_size_align(self.len, ALIGN) {
            // SAFETY: ptr was returned by alloc_zeroed with this very layout.
            unsafe { std::alloc::dealloc(self.ptr, layout) };
        }
    }
}
