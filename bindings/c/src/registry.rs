//! The C registry: process-global, thread-safe, keys -> live handles.
//!
//! It is the core's `Registry` holding (address, kind) pairs, separate from
//! the Rust global registry (whose entries are Rust `Arc`s). The registry
//! borrows handles, it does not own them: freeing a handle erases every key
//! that names it, so `get` never returns a freed handle (a free racing a `get`
//! on another thread can still hand out an address that is freed right after;
//! calls on it are then refused with `OKV_ERR_BAD_HANDLE`). Builders keyed by
//! (backend_id, kind) are not exposed to C.

use std::ffi::{c_char, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::LazyLock;

use offgraph_kv::registry::Registry;

use crate::handle::{live_kind, okv_handle_kind};
use crate::ptr::{cstr, out, slice_mut};
use crate::status::{fail, finish, okv_status, R};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    addr: usize,
    kind: okv_handle_kind,
}

static REGISTRY: LazyLock<Registry<Entry>> = LazyLock::new(Registry::new);

/// Erases every key naming the handle at `addr` (called when it is freed).
pub(crate) fn forget(addr: usize) {
    for key in REGISTRY.keys() {
        if REGISTRY.get(&key).is_ok_and(|e| e.addr == addr) {
            let _ = REGISTRY.erase(&key);
        }
    }
}

/// Stores the live handle `handle` (any okv handle type) under `key`.
/// A taken key (`OKV_ERR_KEY_EXISTS`) or an empty one is refused.
#[no_mangle]
pub unsafe extern "C" fn okv_registry_install(
    key: *const c_char,
    handle: *const c_void,
) -> okv_status {
    finish(catch_unwind(AssertUnwindSafe(|| -> R<()> {
        let what = "okv_registry_install";
        let key = unsafe { cstr(key, "okv_registry_install: key") }?;
        if handle.is_null() {
            return Err(fail(
                okv_status::OKV_ERR_NULL_POINTER,
                format!("{what}: handle is NULL"),
            ));
        }
        let addr = handle as usize;
        let kind = live_kind(addr).ok_or_else(|| {
            fail(
                okv_status::OKV_ERR_BAD_HANDLE,
                format!("{what}: not a live okv handle"),
            )
        })?;
        REGISTRY.install(key, Entry { addr, kind })?;
        Ok(())
    })))
}

/// The handle under `key` (borrowed: the registry does not own it) and its kind.
#[no_mangle]
pub unsafe extern "C" fn okv_registry_get(
    key: *const c_char,
    out_kind: *mut okv_handle_kind,
    out_handle: *mut *mut c_void,
) -> okv_status {
    finish(catch_unwind(AssertUnwindSafe(|| -> R<()> {
        let (k, h) = (
            out(out_kind, "okv_registry_get: out_kind")?,
            out(out_handle, "okv_registry_get: out_handle")?,
        );
        let key = unsafe { cstr(key, "okv_registry_get: key") }?;
        let e = REGISTRY.get(key)?;
        k.set(e.kind);
        h.set(e.addr as *mut c_void);
        Ok(())
    })))
}

/// Removes `key` (the handle itself is untouched). `OKV_ERR_NOT_FOUND` if absent.
#[no_mangle]
pub unsafe extern "C" fn okv_registry_erase(key: *const c_char) -> okv_status {
    finish(catch_unwind(AssertUnwindSafe(|| -> R<()> {
        let key = unsafe { cstr(key, "okv_registry_erase: key") }?;
        REGISTRY.erase(key)?;
        Ok(())
    })))
}

/// Whether `key` is installed.
#[no_mangle]
pub unsafe extern "C" fn okv_registry_contains(
    key: *const c_char,
    out_found: *mut bool,
) -> okv_status {
    finish(catch_unwind(AssertUnwindSafe(|| -> R<()> {
        let o = out(out_found, "okv_registry_contains: out_found")?;
        let key = unsafe { cstr(key, "okv_registry_contains: key") }?;
        o.set(REGISTRY.contains(key));
        Ok(())
    })))
}

/// A key no other call in this process returned: `prefix` plus a counter,
/// written NUL-terminated into `buf` (room for `cap` bytes); `*out_len` gets
/// its length without the NUL. With too small a buffer:
/// `OKV_ERR_BUFFER_TOO_SMALL`, `*out_len` the length needed, `buf` untouched.
#[no_mangle]
pub unsafe extern "C" fn okv_registry_unique_key(
    prefix: *const c_char,
    buf: *mut c_char,
    cap: usize,
    out_len: *mut usize,
) -> okv_status {
    finish(catch_unwind(AssertUnwindSafe(|| -> R<()> {
        let what = "okv_registry_unique_key";
        let n = out(out_len, "okv_registry_unique_key: out_len")?;
        let prefix = unsafe { cstr(prefix, "okv_registry_unique_key: prefix") }?;
        let key = REGISTRY.unique_key(prefix);
        let need = key.len().saturating_add(1);
        if need > cap {
            n.set(key.len());
            return Err(fail(
                okv_status::OKV_ERR_BUFFER_TOO_SMALL,
                format!("{what}: the key needs {need} bytes, the buffer holds {cap}"),
            ));
        }
        let dst = unsafe { slice_mut(buf, need, "okv_registry_unique_key: buf") }?;
        for (d, &b) in dst
            .iter_mut()
            .zip(key.as_bytes().iter().chain(std::iter::once(&0u8)))
        {
            *d = b as c_char;
        }
        n.set(key.len());
        Ok(())
    })))
}
