//! The C registry: process-global, thread-safe, keys -> live handles.
//!
//! It is the core's `Registry` holding (address, kind) pairs, separate from
//! the Rust global registry (whose entries are Rust `Arc`s). The registry
//! borrows handles, it does not own them: freeing a handle erases every key
//! that names it, so `get` never returns a freed handle (a free racing a `get`
//! on another thread can still hand out an address that is freed right after;
//! calls on it are then refused with `OKV_ERR_BAD_HANDLE`).
//!
//! Builders are keyed by the pair (backend_id, kind): a C callback that makes
//! a handle from a config; `okv_registry_build` validates the config first.

use std::ffi::{c_char, c_void};
use std::sync::Arc;

use offgraph_kv::registry::Builder;
use offgraph_kv::{CacheConfig, CacheError};

use crate::config::{config_of, okv_config};
use crate::handle::{live_kind, okv_handle_kind, publish, release, Entry, REGISTRY};
use crate::ptr::{cstr, out, slice_mut, Out};
use crate::status::{fail, guard, okv_status, R};

/// A yes/no answer into `out_found`, checked before `ask` reads any name.
fn found(out_found: *mut bool, what: &str, ask: impl FnOnce() -> R<bool>) -> R<()> {
    let o = out(out_found, what)?;
    o.set(ask()?);
    Ok(())
}

/// Stores the live handle `handle` (any okv handle type) under `key`.
/// A taken key (`OKV_ERR_KEY_EXISTS`) or an empty one is refused.
///
/// Statuses: `OKV_ERR_INVALID_ARGUMENT` for an empty key or one that is not
/// UTF-8; `OKV_ERR_KEY_EXISTS` for a taken key; `OKV_ERR_BAD_HANDLE` when
/// `handle` is not a live okv handle; `OKV_ERR_NULL_POINTER` for a NULL key or handle.
#[no_mangle]
pub unsafe extern "C" fn okv_registry_install(
    key: *const c_char,
    handle: *const c_void,
) -> okv_status {
    guard(|| {
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
    })
}

/// The handle under `key` (borrowed: the registry does not own it) and its kind.
///
/// Statuses: `OKV_ERR_NOT_FOUND` when no handle is installed under `key`;
/// `OKV_ERR_INVALID_ARGUMENT` for a key that is not UTF-8.
#[no_mangle]
pub unsafe extern "C" fn okv_registry_get(
    key: *const c_char,
    out_kind: *mut okv_handle_kind,
    out_handle: *mut *mut c_void,
) -> okv_status {
    guard(|| {
        let (k, h) = (
            out(out_kind, "okv_registry_get: out_kind")?,
            out(out_handle, "okv_registry_get: out_handle")?,
        );
        let key = unsafe { cstr(key, "okv_registry_get: key") }?;
        let e = REGISTRY.get(key)?;
        k.set(e.kind);
        h.set(e.addr as *mut c_void);
        Ok(())
    })
}

/// Removes `key` (the handle itself is untouched). `OKV_ERR_NOT_FOUND` if absent.
///
/// Statuses: `OKV_ERR_INVALID_ARGUMENT` for a key that is not UTF-8.
#[no_mangle]
pub unsafe extern "C" fn okv_registry_erase(key: *const c_char) -> okv_status {
    guard(|| {
        let key = unsafe { cstr(key, "okv_registry_erase: key") }?;
        REGISTRY.erase(key)?;
        Ok(())
    })
}

/// Whether `key` is installed.
///
/// Statuses: `OKV_ERR_INVALID_ARGUMENT` for a key that is not UTF-8.
#[no_mangle]
pub unsafe extern "C" fn okv_registry_contains(
    key: *const c_char,
    out_found: *mut bool,
) -> okv_status {
    guard(|| unsafe {
        found(out_found, "okv_registry_contains: out_found", || {
            Ok(REGISTRY.contains(cstr(key, "okv_registry_contains: key")?))
        })
    })
}

/// A key no other call in this process returned: `prefix` plus a counter,
/// written NUL-terminated into `buf` (room for `cap` bytes); `*out_len` gets
/// its length without the NUL. With too small a buffer:
/// `OKV_ERR_BUFFER_TOO_SMALL`, `*out_len` the length needed, `buf` untouched.
///
/// Statuses: `OKV_ERR_BUFFER_TOO_SMALL` as above; `OKV_ERR_INVALID_ARGUMENT`
/// for a prefix that is not UTF-8.
#[no_mangle]
pub unsafe extern "C" fn okv_registry_unique_key(
    prefix: *const c_char,
    buf: *mut c_char,
    cap: usize,
    out_len: *mut usize,
) -> okv_status {
    guard(|| {
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
    })
}

/// A builder: makes a new handle (any okv cache) from `cfg`, stores it in
/// `*out_handle` and returns 0; any other value is a failure. `cfg` is a
/// temporary, valid during the call only. It must not unwind (no C++
/// exception may escape it).
pub type okv_builder_fn = Option<
    unsafe extern "C" fn(
        cfg: *const okv_config,
        user_data: *mut c_void,
        out_handle: *mut *mut c_void,
    ) -> i32,
>;

/// The caller's `user_data`, handed back to its builder from whatever thread
/// calls `okv_registry_build` (the caller vouches that this is safe).
struct UserData(*mut c_void);
// SAFETY: the pointer is only passed back to the caller's own callback; the
// caller promises (header docs) that doing so from any thread is sound.
unsafe impl Send for UserData {}
// SAFETY: as above.
unsafe impl Sync for UserData {}

/// Runs a C builder over a temporary config handle; its output must be a live handle.
fn call_builder(
    f: unsafe extern "C" fn(*const okv_config, *mut c_void, *mut *mut c_void) -> i32,
    user_data: &UserData,
    cfg: &CacheConfig,
) -> offgraph_kv::Result<Entry> {
    let mut tmp: *mut okv_config = std::ptr::null_mut();
    let slot = crate::ptr::out(&mut tmp as *mut *mut okv_config, "builder config")
        .map_err(|e| CacheError::InvalidArgument(e.message))?;
    publish::<okv_config>(cfg.clone(), slot);
    let mut made: *mut c_void = std::ptr::null_mut();
    // SAFETY: a C function the caller registered, given a live config handle
    // and a writable out-slot, as its documented contract says.
    let rc = unsafe { f(tmp, user_data.0, &mut made) };
    // SAFETY: `tmp` is the live handle published above.
    let _ = unsafe { release(tmp, "builder config") };
    if rc != 0 {
        return Err(CacheError::Backend(format!(
            "builder: the callback failed with {rc}"
        )));
    }
    let addr = made as usize;
    let kind = live_kind(addr).ok_or_else(|| {
        CacheError::InvalidArgument(
            "builder: the callback returned something that is not a live okv handle".into(),
        )
    })?;
    Ok(Entry { addr, kind })
}

/// Registers (or replaces) the builder for (`backend_id`, `kind`).
/// `user_data` is passed back to every call and must stay valid as long as
/// the builder is registered (for the process's life, unless replaced).
///
/// Statuses: `OKV_ERR_NULL_POINTER` for a NULL `build`, backend_id or kind;
/// `OKV_ERR_INVALID_ARGUMENT` for names that are not UTF-8.
#[no_mangle]
pub unsafe extern "C" fn okv_registry_register_builder(
    backend_id: *const c_char,
    kind: *const c_char,
    build: okv_builder_fn,
    user_data: *mut c_void,
) -> okv_status {
    guard(|| {
        let what = "okv_registry_register_builder";
        let b = unsafe { cstr(backend_id, "okv_registry_register_builder: backend_id") }?;
        let k = unsafe { cstr(kind, "okv_registry_register_builder: kind") }?;
        let f = build.ok_or_else(|| {
            fail(
                okv_status::OKV_ERR_NULL_POINTER,
                format!("{what}: build is NULL"),
            )
        })?;
        let ud = UserData(user_data);
        let builder: Builder<Entry> = Arc::new(move |cfg: &CacheConfig| call_builder(f, &ud, cfg));
        REGISTRY.register_builder(b, k, builder);
        Ok(())
    })
}

/// Whether a builder is registered for (`backend_id`, `kind`).
///
/// Statuses: `OKV_ERR_INVALID_ARGUMENT` for names that are not UTF-8.
#[no_mangle]
pub unsafe extern "C" fn okv_registry_has_builder(
    backend_id: *const c_char,
    kind: *const c_char,
    out_found: *mut bool,
) -> okv_status {
    guard(|| unsafe {
        found(out_found, "okv_registry_has_builder: out_found", || {
            let b = cstr(backend_id, "okv_registry_has_builder: backend_id")?;
            let k = cstr(kind, "okv_registry_has_builder: kind")?;
            Ok(REGISTRY.has_builder(b, k))
        })
    })
}

/// Validates `cfg`, then builds with the builder for (`backend_id`, `kind`):
/// the new handle (owned by the caller, not installed) and its kind.
/// `OKV_ERR_NOT_FOUND` without such a builder; `OKV_ERR_BACKEND` when the
/// callback fails; `OKV_ERR_INVALID_ARGUMENT` when it returns no live handle.
///
/// Statuses: those above, and `OKV_ERR_INVALID_CONFIG` when `cfg` fails validation.
#[no_mangle]
pub unsafe extern "C" fn okv_registry_build(
    backend_id: *const c_char,
    kind: *const c_char,
    cfg: *const okv_config,
    out_kind: *mut okv_handle_kind,
    out_handle: *mut *mut c_void,
) -> okv_status {
    guard(|| {
        let ok: Out<okv_handle_kind> = out(out_kind, "okv_registry_build: out_kind")?;
        let oh = out(out_handle, "okv_registry_build: out_handle")?;
        let b = unsafe { cstr(backend_id, "okv_registry_build: backend_id") }?;
        let k = unsafe { cstr(kind, "okv_registry_build: kind") }?;
        let c = unsafe { config_of(cfg, "okv_registry_build") }?;
        let e = REGISTRY.build(b, k, &c)?;
        ok.set(e.kind);
        oh.set(e.addr as *mut c_void);
        Ok(())
    })
}
