//! Raw pointers from C into Rust references, each refusal a status.

use std::ffi::{c_char, CStr};

use crate::status::{fail, okv_status, R};

fn null(what: &str) -> crate::status::Fail {
    fail(
        okv_status::OKV_ERR_NULL_POINTER,
        format!("{what}: NULL pointer"),
    )
}

fn check_raw<T>(p: *const T, n: usize, what: &str) -> R<()> {
    if p.is_null() {
        return Err(null(what));
    }
    if !(p as usize).is_multiple_of(std::mem::align_of::<T>()) {
        return Err(fail(
            okv_status::OKV_ERR_INVALID_ARGUMENT,
            format!(
                "{what}: pointer not aligned to {} bytes",
                std::mem::align_of::<T>()
            ),
        ));
    }
    let fits = n
        .checked_mul(std::mem::size_of::<T>())
        .is_some_and(|b| b <= isize::MAX as usize);
    if !fits {
        return Err(fail(
            okv_status::OKV_ERR_SHAPE,
            format!("{what}: {n} elements exceed the address space"),
        ));
    }
    Ok(())
}

/// `n` elements at `p`; NULL is allowed only for `n == 0`.
pub(crate) unsafe fn slice<'a, T>(p: *const T, n: usize, what: &str) -> R<&'a [T]> {
    if n == 0 {
        return Ok(&[]);
    }
    check_raw(p, n, what)?;
    // SAFETY: non-NULL, aligned, size in range; the caller vouches for the rest.
    Ok(unsafe { std::slice::from_raw_parts(p, n) })
}

/// `n` writable elements at `p`; NULL is allowed only for `n == 0`.
pub(crate) unsafe fn slice_mut<'a, T>(p: *mut T, n: usize, what: &str) -> R<&'a mut [T]> {
    if n == 0 {
        return Ok(&mut []);
    }
    check_raw(p, n, what)?;
    // SAFETY: as in `slice`, and the caller gives us the buffer for this call.
    Ok(unsafe { std::slice::from_raw_parts_mut(p, n) })
}

/// A checked out-parameter: written once, on success.
pub(crate) struct Out<T>(*mut T);

impl<T> Out<T> {
    pub(crate) fn set(self, v: T) {
        // SAFETY: checked non-NULL and aligned by `out`; the caller vouches
        // that it is writable. `write` never reads the old (maybe
        // uninitialised) value.
        unsafe { self.0.write(v) }
    }
}

/// A required out-parameter: checked before the call changes anything.
pub(crate) fn out<T>(p: *mut T, what: &str) -> R<Out<T>> {
    check_raw(p, 1, what)?;
    Ok(Out(p))
}

/// A required NUL-terminated UTF-8 string.
pub(crate) unsafe fn cstr<'a>(p: *const c_char, what: &str) -> R<&'a str> {
    if p.is_null() {
        return Err(null(what));
    }
    // SAFETY: non-NULL; the caller vouches for the terminating NUL.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str().map_err(|_| {
        fail(
            okv_status::OKV_ERR_INVALID_ARGUMENT,
            format!("{what}: not valid UTF-8"),
        )
    })
}

/// The byte range `n` elements at `p` would cover (before any reference exists).
pub(crate) fn span<T>(p: *const T, n: usize) -> (usize, usize) {
    let a = p as usize;
    (
        a,
        a.saturating_add(n.saturating_mul(std::mem::size_of::<T>())),
    )
}

/// Whether two byte ranges share memory (an empty range shares none).
pub(crate) fn overlaps(a: (usize, usize), b: (usize, usize)) -> bool {
    a.0 < a.1 && b.0 < b.1 && a.0 < b.1 && b.0 < a.1
}

/// The byte range of a slice.
pub(crate) fn span_of<T>(s: &[T]) -> (usize, usize) {
    span(s.as_ptr(), s.len())
}
