//! Status codes, the thread-local last error, and the panic boundary's exit.

use std::cell::RefCell;
use std::ffi::{c_char, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use offgraph_kv::CacheError;

/// What a call did. Every function returns one; `OKV_OK` is zero.
/// Values are append-only: a new kind of failure gets the next number.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum okv_status {
    OKV_OK = 0,
    /// A configuration field is out of range or inconsistent.
    OKV_ERR_INVALID_CONFIG = 1,
    /// An argument is out of range (a layer, a rewind target, a token count).
    OKV_ERR_INVALID_ARGUMENT = 2,
    /// A buffer has the wrong number of elements for the cache's shapes.
    OKV_ERR_SHAPE = 3,
    /// No such registry key.
    OKV_ERR_NOT_FOUND = 4,
    /// The registry key is already taken.
    OKV_ERR_KEY_EXISTS = 5,
    /// No room: capacity, free cells, sequence ids.
    OKV_ERR_OUT_OF_CAPACITY = 6,
    /// A sequence id this cache did not hand out (ids are unique in the
    /// process: another cache's id is refused too), or one already freed.
    OKV_ERR_UNKNOWN_SEQUENCE = 7,
    /// The step protocol was misused (a plan with no open step, a rewrite).
    OKV_ERR_STEP_PROTOCOL = 8,
    /// An attention backend failed or is not in this build.
    OKV_ERR_BACKEND = 9,
    /// A required pointer is NULL.
    OKV_ERR_NULL_POINTER = 10,
    /// A handle that is not a live handle of the expected type (foreign,
    /// freed, or of another type).
    OKV_ERR_BAD_HANDLE = 11,
    /// Another thread is inside a call on this handle (handles are not locks).
    OKV_ERR_BUSY = 12,
    /// A caller's output buffer is too small; the size needed is reported.
    OKV_ERR_BUFFER_TOO_SMALL = 13,
    /// An internal panic was caught at the boundary (a bug: please report).
    /// The handle it happened on refuses further calls except `_free`.
    OKV_ERR_PANIC = 14,
    /// A snapshot is truncated, damaged, foreign or of a newer format.
    OKV_ERR_SNAPSHOT = 15,
}

/// A refused call: its status and message.
#[derive(Debug)]
pub(crate) struct Fail {
    pub(crate) status: okv_status,
    pub(crate) message: String,
}

pub(crate) type R<T> = Result<T, Fail>;

pub(crate) fn fail(status: okv_status, message: impl Into<String>) -> Fail {
    Fail {
        status,
        message: message.into(),
    }
}

impl Fail {
    /// The same failure with `what` (the export's name) before its message;
    /// it formats only on the error path, so a warm call allocates nothing.
    pub(crate) fn within(self, what: &str) -> Fail {
        fail(self.status, format!("{what}: {}", self.message))
    }
}

impl From<CacheError> for Fail {
    fn from(e: CacheError) -> Self {
        let status = match &e {
            CacheError::InvalidConfig(_) => okv_status::OKV_ERR_INVALID_CONFIG,
            CacheError::InvalidArgument(_) => okv_status::OKV_ERR_INVALID_ARGUMENT,
            CacheError::Shape(_) => okv_status::OKV_ERR_SHAPE,
            CacheError::NotFound(_) => okv_status::OKV_ERR_NOT_FOUND,
            CacheError::KeyExists(_) => okv_status::OKV_ERR_KEY_EXISTS,
            CacheError::OutOfCapacity(_) => okv_status::OKV_ERR_OUT_OF_CAPACITY,
            CacheError::UnknownSequence(_) => okv_status::OKV_ERR_UNKNOWN_SEQUENCE,
            CacheError::StepProtocol(_) => okv_status::OKV_ERR_STEP_PROTOCOL,
            CacheError::Backend(_) => okv_status::OKV_ERR_BACKEND,
            CacheError::Snapshot(_) => okv_status::OKV_ERR_SNAPSHOT,
        };
        fail(status, e.message())
    }
}

thread_local! {
    /// The message of the last failed call on this thread.
    static LAST: RefCell<Option<CString>> = const { RefCell::new(None) };
}

/// Keeps `f`'s message for `okv_last_error` and returns its status. Never
/// panics: it runs outside the `catch_unwind` of the export.
fn record(f: Fail) -> okv_status {
    let bytes: Vec<u8> = f
        .message
        .into_bytes()
        .into_iter()
        .filter(|&b| b != 0)
        .collect();
    let msg = CString::new(bytes).unwrap_or_default();
    let _ = LAST.try_with(|l| {
        if let Ok(mut l) = l.try_borrow_mut() {
            *l = Some(msg);
        }
    });
    f.status
}

/// The panic boundary of an export: runs `f` under `catch_unwind` and turns
/// its outcome into the status C sees.
pub(crate) fn guard(f: impl FnOnce() -> R<()>) -> okv_status {
    finish(catch_unwind(AssertUnwindSafe(f)))
}

/// Turns the outcome of an export's `catch_unwind` into its status.
fn finish(r: std::thread::Result<R<()>>) -> okv_status {
    match r {
        Ok(Ok(())) => okv_status::OKV_OK,
        Ok(Err(f)) => record(f),
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".to_string());
            // The payload's destructor is foreign to us: do not run it here.
            std::mem::forget(payload);
            record(fail(
                okv_status::OKV_ERR_PANIC,
                format!("internal panic caught at the C boundary: {what}"),
            ))
        }
    }
}

/// The message of the most recent call on this thread that did not return
/// `OKV_OK` ("" when there was none). The pointer stays valid until the next
/// failing call on this thread; copy the text to keep it.
#[no_mangle]
pub extern "C" fn okv_last_error() -> *const c_char {
    let r = catch_unwind(|| {
        LAST.try_with(|l| match l.try_borrow() {
            Ok(l) => l.as_ref().map(|c| c.as_ptr()),
            Err(_) => None,
        })
        .ok()
        .flatten()
    });
    match r {
        Ok(Some(p)) => p,
        _ => c"".as_ptr(),
    }
}

/// The name of a status code (`"OKV_ERR_SHAPE"`), or `"OKV_UNKNOWN_STATUS"`.
/// The string is static.
#[no_mangle]
pub extern "C" fn okv_status_name(status: i32) -> *const c_char {
    let r = catch_unwind(|| status_name(status));
    r.unwrap_or(c"OKV_UNKNOWN_STATUS").as_ptr()
}

fn status_name(status: i32) -> &'static CStr {
    match status {
        0 => c"OKV_OK",
        1 => c"OKV_ERR_INVALID_CONFIG",
        2 => c"OKV_ERR_INVALID_ARGUMENT",
        3 => c"OKV_ERR_SHAPE",
        4 => c"OKV_ERR_NOT_FOUND",
        5 => c"OKV_ERR_KEY_EXISTS",
        6 => c"OKV_ERR_OUT_OF_CAPACITY",
        7 => c"OKV_ERR_UNKNOWN_SEQUENCE",
        8 => c"OKV_ERR_STEP_PROTOCOL",
        9 => c"OKV_ERR_BACKEND",
        10 => c"OKV_ERR_NULL_POINTER",
        11 => c"OKV_ERR_BAD_HANDLE",
        12 => c"OKV_ERR_BUSY",
        13 => c"OKV_ERR_BUFFER_TOO_SMALL",
        14 => c"OKV_ERR_PANIC",
        15 => c"OKV_ERR_SNAPSHOT",
        _ => c"OKV_UNKNOWN_STATUS",
    }
}
