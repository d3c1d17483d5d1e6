//! Pool dtypes for C: the `okv_dtype` codes, the config's dtype setters, the
//! names, and `okv_dequantize` (stored rows back to float32).
//!
//! Dtypes cross the ABI as `uint32_t` holding an `OKV_DTYPE_*` value: a C
//! caller may pass any integer, and an unknown one must be a refusal.

use std::ffi::c_char;

use offgraph_kv::dtype::decode;
use offgraph_kv::KvDtype;

use crate::config::okv_config;
use crate::handle::lock;
use crate::ptr::{cstr, out, slice, slice_mut};
use crate::status::{fail, guard, okv_status, R};

// How a pool stores its values: the `okv_dtype` codes, which are the snapshot
// format's dtype codes and append-only (a new dtype gets the next number).
// Constants rather than a C enum, as OKV_POLICY_* are: calls take them as
// `uint32_t`, so an unknown value is a refusal, never undefined behaviour.

/// IEEE single, 4 bytes per value (the default).
pub const OKV_DTYPE_F32: u32 = 0;
/// IEEE half, rounded to nearest even on write, 2 bytes per value.
pub const OKV_DTYPE_F16: u32 = 1;
/// bfloat16, rounded to nearest even on write, 2 bytes per value.
pub const OKV_DTYPE_BF16: u32 = 2;
/// GGML's Q8_0 block, byte-compatible: per 32 values of a row an fp16 scale
/// then 32 int8 (34 bytes). Needs a head_dim that is a multiple of 32.
pub const OKV_DTYPE_Q8_0: u32 = 3;

/// The core dtype of a C code; an unknown code is refused with `status`.
pub(crate) fn dtype_of(code: u32, what: &str, status: okv_status) -> R<KvDtype> {
    u8::try_from(code)
        .ok()
        .and_then(KvDtype::from_code)
        .ok_or_else(|| {
            fail(
                status,
                format!(
                    "{what}: expected OKV_DTYPE_F32 (0), OKV_DTYPE_F16 (1), OKV_DTYPE_BF16 (2) \
                     or OKV_DTYPE_Q8_0 (3), got {code}"
                ),
            )
        })
}

/// The C code of a core dtype.
pub(crate) fn dtype_to_c(d: KvDtype) -> u32 {
    u32::from(d.code())
}

/// Sets the storage dtype of every K pool and every V pool (`okv_dtype`
/// values; a new config is float32 for both).
///
/// Statuses: `OKV_ERR_INVALID_CONFIG` for an unknown dtype value (the config
/// is unchanged). A q8_0 dtype with a head_dim that is not a multiple of 32 is
/// accepted here and refused, `OKV_ERR_INVALID_CONFIG`, by `okv_config_validate`
/// and every cache constructor (layers may be set in any order).
#[no_mangle]
pub unsafe extern "C" fn okv_config_set_dtypes(
    cfg: *mut okv_config,
    k_dtype: u32,
    v_dtype: u32,
) -> okv_status {
    guard(|| {
        let what = "okv_config_set_dtypes";
        let mut c = unsafe { lock(cfg, what) }?;
        let k = dtype_of(
            k_dtype,
            "okv_config_set_dtypes: k_dtype",
            okv_status::OKV_ERR_INVALID_CONFIG,
        )?;
        let v = dtype_of(
            v_dtype,
            "okv_config_set_dtypes: v_dtype",
            okv_status::OKV_ERR_INVALID_CONFIG,
        )?;
        c.k_dtype = k;
        c.v_dtype = v;
        Ok(())
    })
}

/// The K and V dtypes of `cfg` (`OKV_DTYPE_*` values).
///
/// Statuses: only the common ones (NULL pointer, bad handle, busy).
#[no_mangle]
pub unsafe extern "C" fn okv_config_dtypes(
    cfg: *const okv_config,
    out_k_dtype: *mut u32,
    out_v_dtype: *mut u32,
) -> okv_status {
    guard(|| {
        let what = "okv_config_dtypes";
        let (ok, ov) = (out(out_k_dtype, what)?, out(out_v_dtype, what)?);
        let c = unsafe { lock(cfg, what) }?;
        ok.set(dtype_to_c(c.k_dtype));
        ov.set(dtype_to_c(c.v_dtype));
        Ok(())
    })
}

/// The dtype named `name` (`"float32"`, `"float16"`, `"bfloat16"`, `"q8_0"`,
/// the Python names) into `*out_dtype`.
///
/// Statuses: `OKV_ERR_INVALID_CONFIG` for an unknown name (the message lists
/// the names), `OKV_ERR_INVALID_ARGUMENT` for a name that is not UTF-8.
#[no_mangle]
pub unsafe extern "C" fn okv_dtype_from_name(
    name: *const c_char,
    out_dtype: *mut u32,
) -> okv_status {
    guard(|| {
        let what = "okv_dtype_from_name";
        let o = out(out_dtype, what)?;
        let n = unsafe { cstr(name, "okv_dtype_from_name: name") }?;
        let d = KvDtype::parse(n).map_err(|e| crate::status::Fail::from(e).within(what))?;
        o.set(dtype_to_c(d));
        Ok(())
    })
}

/// The name of an `OKV_DTYPE_*` value (`"float16"`, ...), or `"unknown"`. The
/// string is static.
#[no_mangle]
pub extern "C" fn okv_dtype_name(dtype: u32) -> *const c_char {
    let r = std::panic::catch_unwind(|| dtype_name(dtype));
    r.unwrap_or(c"unknown").as_ptr()
}

fn dtype_name(dtype: u32) -> &'static std::ffi::CStr {
    match u8::try_from(dtype).ok().and_then(KvDtype::from_code) {
        Some(KvDtype::Float32) => c"float32",
        Some(KvDtype::Float16) => c"float16",
        Some(KvDtype::Bfloat16) => c"bfloat16",
        Some(KvDtype::Q8_0) => c"q8_0",
        None => c"unknown",
    }
}

/// Bytes one row of `head_dim` values takes in `dtype` into `*out_bytes`:
/// 4 * head_dim (float32), 2 * head_dim (float16, bfloat16),
/// head_dim / 32 * 34 (q8_0).
///
/// Statuses: `OKV_ERR_INVALID_ARGUMENT` for an unknown dtype, or for q8_0 with
/// a head_dim that is not a multiple of 32.
#[no_mangle]
pub unsafe extern "C" fn okv_dtype_row_bytes(
    dtype: u32,
    head_dim: usize,
    out_bytes: *mut usize,
) -> okv_status {
    guard(|| {
        let what = "okv_dtype_row_bytes";
        let o = out(out_bytes, what)?;
        let d = dtype_of(dtype, what, okv_status::OKV_ERR_INVALID_ARGUMENT)?;
        d.check_head_dim(head_dim).map_err(|e| {
            fail(
                okv_status::OKV_ERR_INVALID_ARGUMENT,
                format!("{what}: {}", e.message()),
            )
        })?;
        o.set(d.row_bytes(head_dim));
        Ok(())
    })
}

/// Decodes `src_bytes` bytes of stored rows of `dtype` (a pool view's `k` or
/// `v`, or part of one) into `dst_len` float32 values at `dst`: exact for
/// float16 and bfloat16, `d * q` per value for q8_0. `src_bytes` must be what
/// `dst_len` values take in `dtype` (for q8_0, `dst_len` a multiple of 32).
/// For a whole pool view: `src_bytes = n_kv_heads * slots * row_bytes`,
/// `dst_len = n_kv_heads * slots * head_dim`.
///
/// Statuses: `OKV_ERR_INVALID_ARGUMENT` for an unknown dtype or a `dst` that
/// overlaps `src`; `OKV_ERR_SHAPE` when the sizes do not match; `dst` is
/// untouched on every refusal.
#[no_mangle]
pub unsafe extern "C" fn okv_dequantize(
    dtype: u32,
    src: *const u8,
    src_bytes: usize,
    dst: *mut f32,
    dst_len: usize,
) -> okv_status {
    guard(|| {
        let what = "okv_dequantize";
        let d = dtype_of(dtype, what, okv_status::OKV_ERR_INVALID_ARGUMENT)?;
        let (s, t) = (
            crate::ptr::span(src, src_bytes),
            crate::ptr::span(dst as *const f32, dst_len),
        );
        if crate::ptr::overlaps(s, t) {
            return Err(fail(
                okv_status::OKV_ERR_INVALID_ARGUMENT,
                format!("{what}: dst overlaps src"),
            ));
        }
        let q8 = d == KvDtype::Q8_0;
        if (q8 && !dst_len.is_multiple_of(offgraph_kv::dtype::QK8_0))
            || d.row_bytes(dst_len) != src_bytes
        {
            return Err(fail(
                okv_status::OKV_ERR_SHAPE,
                format!(
                    "{what}: {dst_len} {} values take {} bytes{}, src has {src_bytes}",
                    d.name(),
                    d.row_bytes(dst_len),
                    if q8 { " (and whole blocks of 32)" } else { "" }
                ),
            ));
        }
        let src = unsafe { slice(src, src_bytes, "okv_dequantize: src") }?;
        let dst = unsafe { slice_mut(dst, dst_len, "okv_dequantize: dst") }?;
        if !decode(d, src, dst) {
            return Err(fail(
                okv_status::OKV_ERR_SHAPE,
                format!(
                    "{what}: {src_bytes} bytes do not hold {dst_len} {} values",
                    d.name()
                ),
            ));
        }
        Ok(())
    })
}
