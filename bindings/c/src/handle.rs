//! Opaque handles: a magic tag, a process-wide set of live handles, a
//! per-handle busy flag, and the registry's keys, which a free erases (they
//! live here so that freeing a handle needs nothing from the registry's
//! exports).
//!
//! What is detected, and what is not:
//! - NULL, a pointer that was never a handle, a freed handle, and a handle of
//!   another type are refused (`OKV_ERR_NULL_POINTER` / `OKV_ERR_BAD_HANDLE`)
//!   *without reading the pointed-to memory*: the address is looked up in the
//!   live set first, so a stale pointer is not dereferenced (valgrind and
//!   AddressSanitizer stay quiet). The magic tag is then checked as a second
//!   guard against memory the caller overwrote, and cleared on free.
//! - Not detected: after a free, the allocator may give the same address to a
//!   new handle of the same type; a stale pointer then silently reaches the new
//!   handle. Use-after-free detection is best effort, never a guarantee.
//! - Two threads inside calls on one handle at the same time: the second gets
//!   `OKV_ERR_BUSY` (a handle is not a lock: serialise calls yourself). A free
//!   racing a call on another thread gets `OKV_ERR_BUSY` or the call gets
//!   `OKV_ERR_BAD_HANDLE`; neither reads freed memory.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex, MutexGuard, RwLock, TryLockError};

use offgraph_kv::registry::Registry;

use crate::ptr::{out, Out};
use crate::status::{fail, okv_status, R};

/// The type of a handle, as the registry reports it.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum okv_handle_kind {
    OKV_HANDLE_CONFIG = 1,
    OKV_HANDLE_SEQ_CACHE = 2,
    OKV_HANDLE_KV_SEQ_CACHE = 3,
    OKV_HANDLE_CELL_CACHE = 4,
    OKV_HANDLE_KV_CELL_CACHE = 5,
}

/// A registry key's value: the handle it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) addr: usize,
    pub(crate) kind: okv_handle_kind,
}

/// The process-global registry's keys (the `okv_registry_*` exports).
pub(crate) static REGISTRY: LazyLock<Registry<Entry>> = LazyLock::new(Registry::new);

/// Erases every key naming the handle at `addr` (called when it is freed).
fn forget(addr: usize) {
    for key in REGISTRY.keys() {
        if REGISTRY.get(&key).is_ok_and(|e| e.addr == addr) {
            let _ = REGISTRY.erase(&key);
        }
    }
}

/// Address -> kind of every live handle.
static LIVE: LazyLock<RwLock<HashMap<usize, okv_handle_kind>>> =
    LazyLock::new(|| RwLock::new(HashMap::new()));

/// The kind of the live handle at `addr`, if any.
pub(crate) fn live_kind(addr: usize) -> Option<okv_handle_kind> {
    LIVE.read()
        .unwrap_or_else(|e| e.into_inner())
        .get(&addr)
        .copied()
}

/// What every opaque handle type provides.
pub(crate) trait Opaque: Sized + 'static {
    type Inner;
    const KIND: okv_handle_kind;
    const MAGIC: u64;
    const NAME: &'static str;
    fn make(inner: Self::Inner) -> Self;
    fn magic(&self) -> u64;
    fn magic_mut(&mut self) -> &mut u64;
    fn inner(&self) -> &Mutex<Self::Inner>;
}

/// Implements [`Opaque`] for a `struct { magic: u64, inner: Mutex<Inner> }`.
macro_rules! opaque {
    ($name:ident, $inner:ty, $kind:ident, $magic:expr) => {
        impl $crate::handle::Opaque for $name {
            type Inner = $inner;
            const KIND: $crate::handle::okv_handle_kind = $crate::handle::okv_handle_kind::$kind;
            const MAGIC: u64 = $magic;
            const NAME: &'static str = stringify!($name);
            fn make(inner: $inner) -> Self {
                $name {
                    magic: $magic,
                    inner: std::sync::Mutex::new(inner),
                }
            }
            fn magic(&self) -> u64 {
                self.magic
            }
            fn magic_mut(&mut self) -> &mut u64 {
                &mut self.magic
            }
            fn inner(&self) -> &std::sync::Mutex<$inner> {
                &self.inner
            }
        }
    };
}
pub(crate) use opaque;

/// Boxes `inner` into a new live handle and stores it in `out`.
pub(crate) fn publish<H: Opaque>(inner: H::Inner, out: Out<*mut H>) {
    let p = Box::into_raw(Box::new(H::make(inner)));
    LIVE.write()
        .unwrap_or_else(|e| e.into_inner())
        .insert(p as usize, H::KIND);
    out.set(p);
}

/// Locks `h`, computes a value from what it holds and writes it to `o`
/// (checked before the lock; written on success only).
pub(crate) unsafe fn query<H: Opaque, T>(
    h: *const H,
    o: *mut T,
    what: &str,
    f: impl FnOnce(&H::Inner) -> R<T>,
) -> R<()> {
    let o = out(o, what)?;
    let c = unsafe { lock(h, what) }?;
    o.set(f(&c)?);
    Ok(())
}

/// Locks `h` and runs `f` on what it holds.
pub(crate) unsafe fn mutate<H: Opaque, T>(
    h: *const H,
    what: &str,
    f: impl FnOnce(&mut H::Inner) -> R<T>,
) -> R<T> {
    let mut c = unsafe { lock(h, what) }?;
    f(&mut c)
}

fn bad(what: &str, name: &str) -> crate::status::Fail {
    fail(
        okv_status::OKV_ERR_BAD_HANDLE,
        format!("{what}: not a live {name} (foreign, already freed, or another type)"),
    )
}

/// Locks the handle `p` after checking it is a live `H`.
///
/// The live set's read lock is held until the handle's own lock is taken, so
/// a concurrent free either sees the handle busy or happened before the check.
pub(crate) unsafe fn lock<'a, H: Opaque>(p: *const H, what: &str) -> R<MutexGuard<'a, H::Inner>> {
    if p.is_null() {
        return Err(fail(
            okv_status::OKV_ERR_NULL_POINTER,
            format!("{what}: the {} handle is NULL", H::NAME),
        ));
    }
    let live = LIVE.read().unwrap_or_else(|e| e.into_inner());
    if live.get(&(p as usize)) != Some(&H::KIND) {
        return Err(bad(what, H::NAME));
    }
    // SAFETY: the address is a live handle of type H (the live set says so and
    // a free must take the write lock we block), so it points at an H.
    let h: &'a H = unsafe { &*p };
    if h.magic() != H::MAGIC {
        return Err(bad(what, H::NAME));
    }
    let guard = match h.inner().try_lock() {
        Ok(g) => g,
        Err(TryLockError::WouldBlock) => {
            return Err(fail(
                okv_status::OKV_ERR_BUSY,
                format!(
                    "{what}: another thread is inside a call on this {}",
                    H::NAME
                ),
            ))
        }
        Err(TryLockError::Poisoned(_)) => {
            return Err(fail(
                okv_status::OKV_ERR_PANIC,
                format!(
                    "{what}: this {} saw an internal panic earlier; only _free is allowed",
                    H::NAME
                ),
            ))
        }
    };
    drop(live);
    Ok(guard)
}

/// Frees the live handle `p` (NULL is a no-op). Refused, with nothing freed,
/// for a handle that is not a live `H` or that another thread is using.
pub(crate) unsafe fn release<H: Opaque>(p: *mut H, what: &str) -> R<()> {
    if p.is_null() {
        return Ok(());
    }
    let mut live = LIVE.write().unwrap_or_else(|e| e.into_inner());
    if live.get(&(p as usize)) != Some(&H::KIND) {
        return Err(bad(what, H::NAME));
    }
    {
        // SAFETY: a live H (see `lock`); we hold the write lock, so no call can
        // start on it, and one already inside holds its mutex.
        let h: &H = unsafe { &*p };
        if h.magic() != H::MAGIC {
            return Err(bad(what, H::NAME));
        }
        if let Err(TryLockError::WouldBlock) = h.inner().try_lock() {
            return Err(fail(
                okv_status::OKV_ERR_BUSY,
                format!(
                    "{what}: another thread is inside a call on this {}",
                    H::NAME
                ),
            ));
        }
    }
    live.remove(&(p as usize));
    drop(live);
    forget(p as usize);
    // SAFETY: `p` came from `Box::into_raw` in `publish` and is no longer live,
    // so no other call can reach it.
    let mut b = unsafe { Box::from_raw(p) };
    // A volatile store, so the clear survives even though the memory is freed next.
    // SAFETY: the box is valid and exclusively ours.
    unsafe { std::ptr::write_volatile(b.magic_mut(), 0) };
    drop(b);
    Ok(())
}
