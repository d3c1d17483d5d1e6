//! Argument conversion with typed errors: ints that may be negative or huge,
//! and float32 arrays of a given shape.

use numpy::{PyArrayDyn, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyInt;

use crate::errors::{dtype_err, invalid_arg, shape_err};

/// A non-negative index named `what`; negatives and values past `usize`
/// become `InvalidArgumentError` naming the value; non-ints `DTypeError`.
pub fn index(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<usize> {
    index_with(obj, what, invalid_arg)
}

/// Like [`index`] but raising with `err` (e.g. `ConfigError` for config fields).
pub fn index_with(obj: &Bound<'_, PyAny>, what: &str, err: fn(String) -> PyErr) -> PyResult<usize> {
    if obj.is_instance_of::<pyo3::types::PyBool>() || !obj.is_instance_of::<PyInt>() {
        // numpy integers are accepted through __index__.
        if let Ok(i) = obj.call_method0("__index__") {
            if i.is_instance_of::<PyInt>() && !obj.is_instance_of::<pyo3::types::PyBool>() {
                return index_with(&i, what, err);
            }
        }
        let tname = type_name(obj);
        return Err(dtype_err(format!("{what}: expected an int, got {tname}")));
    }
    match obj.extract::<i64>() {
        Ok(v) if v >= 0 => usize::try_from(v)
            .map_err(|_| err(format!("{what}: {v} does not fit this platform's usize"))),
        Ok(v) => Err(err(format!("{what} must be >= 0, got {v}"))),
        Err(_) => Err(err(format!("{what} is out of range, got {}", obj.repr()?))),
    }
}

/// An optional index (`None` stays `None`).
pub fn opt_index(obj: Option<&Bound<'_, PyAny>>, what: &str) -> PyResult<Option<usize>> {
    match obj {
        None => Ok(None),
        Some(o) if o.is_none() => Ok(None),
        Some(o) => index(o, what).map(Some),
    }
}

/// A list of indices (any iterable of ints, or an int ndarray).
pub fn index_list(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<usize>> {
    if obj.is_instance_of::<pyo3::types::PyString>() {
        return Err(dtype_err(format!(
            "{what}: expected a sequence of ints, got str"
        )));
    }
    let iter = obj.try_iter().map_err(|_| {
        dtype_err(format!(
            "{what}: expected a sequence of ints, got {}",
            type_name(obj)
        ))
    })?;
    let mut out = Vec::new();
    for (i, item) in iter.enumerate() {
        out.push(index(&item?, &format!("{what}[{i}]"))?);
    }
    Ok(out)
}

/// A float32 array of shape `[heads, T, dim]` (or `[1, heads, T, dim]`),
/// copied into `out` in C order (contiguous input is one memcpy).
/// Returns T. `what` names the argument in errors.
pub fn f32_rows(
    obj: &Bound<'_, PyAny>,
    what: &str,
    heads: usize,
    dim: usize,
    tokens: Option<usize>,
    out: &mut Vec<f32>,
) -> PyResult<usize> {
    let arr = f32_array(obj, what)?;
    let shape = arr.shape().to_vec();
    let core: &[usize] = match shape.as_slice() {
        [1, rest @ ..] if rest.len() == 3 => rest,
        s if s.len() == 3 => s,
        s => {
            return Err(shape_err(format!(
                "{what}: expected shape [n_kv_heads, T, head_dim] (or with a leading batch of 1), got {s:?}"
            )))
        }
    };
    let (h, t, d) = match core {
        [h, t, d] => (*h, *t, *d),
        _ => return Err(shape_err(format!("{what}: bad shape {shape:?}"))),
    };
    if h != heads || d != dim || tokens.is_some_and(|n| n != t) {
        let want_t = tokens.map_or("T".to_string(), |n| n.to_string());
        return Err(shape_err(format!(
            "{what}: expected shape [{heads}, {want_t}, {dim}], got {shape:?}"
        )));
    }
    copy_c_order(&arr, what, out)?;
    Ok(t)
}

/// A float32 numpy array named `what`, of any shape: a non-array or another
/// dtype is `DTypeError`.
pub fn f32_array<'py>(
    obj: &Bound<'py, PyAny>,
    what: &str,
) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
    let arr = obj.cast::<PyUntypedArray>().map_err(|_| {
        dtype_err(format!(
            "{what}: expected a float32 numpy array, got {}",
            type_name(obj)
        ))
    })?;
    let dtype = arr.dtype();
    arr.cast::<PyArrayDyn<f32>>()
        .cloned()
        .map_err(|_| dtype_err(format!("{what}: expected dtype float32, got {dtype}")))
}

/// Applies `f` to `arr`'s values in logical (C) order: the array's own memory
/// when it is C-contiguous, else a copy. `as_slice` also accepts
/// Fortran-contiguous arrays, whose memory order is not the logical order.
pub fn with_c_order<T: numpy::Element + Copy, R>(
    arr: &Bound<'_, PyArrayDyn<T>>,
    what: &str,
    f: impl FnOnce(&[T]) -> R,
) -> PyResult<R> {
    let ro = arr
        .try_readonly()
        .map_err(|e| invalid_arg(format!("{what}: {e}")))?;
    Ok(match ro.as_slice() {
        Ok(s) if arr.is_c_contiguous() => f(s),
        // Fortran order, non-contiguous or negative strides.
        _ => f(&ro.as_array().iter().copied().collect::<Vec<T>>()),
    })
}

/// `arr`'s values copied into `out` in logical (C) order.
fn copy_c_order<T: numpy::Element + Copy>(
    arr: &Bound<'_, PyArrayDyn<T>>,
    what: &str,
    out: &mut Vec<T>,
) -> PyResult<()> {
    with_c_order(arr, what, |s| {
        out.clear();
        out.extend_from_slice(s);
    })
}

/// A step's new rows, copied out of the caller's array in its own type.
pub enum OwnedRows {
    F32(Vec<f32>),
    F16(Vec<u16>),
    Bf16(Vec<u16>),
}

impl OwnedRows {
    pub fn as_rows(&self) -> offgraph_kv::RowsIn<'_> {
        match self {
            OwnedRows::F32(v) => offgraph_kv::RowsIn::F32(v),
            OwnedRows::F16(v) => offgraph_kv::RowsIn::F16(v),
            OwnedRows::Bf16(v) => offgraph_kv::RowsIn::Bf16(v),
        }
    }
}

/// One K or V argument: numpy float32, float16 or bfloat16 (`ml_dtypes`),
/// or raw bfloat16 bits (uint16/int16) when `bits == Some("bfloat16")`.
/// Half inputs are reinterpreted as their 16-bit patterns (no float32 copy).
fn typed_rows(
    obj: &Bound<'_, PyAny>,
    what: &str,
    layer: &offgraph_kv::LayerConfig,
    tokens: usize,
    bits: Option<&str>,
) -> PyResult<OwnedRows> {
    let (heads, dim) = (layer.n_kv_heads, layer.head_dim);
    let arr = obj.cast::<PyUntypedArray>().map_err(|_| {
        dtype_err(format!(
            "{what}: expected a float32, float16 or bfloat16 numpy array, got {}",
            type_name(obj)
        ))
    })?;
    let name = arr.dtype().str()?.to_string();
    let kind = match (name.as_str(), bits) {
        ("float32", None) => {
            let mut out = Vec::new();
            f32_rows(obj, what, heads, dim, Some(tokens), &mut out)?;
            return Ok(OwnedRows::F32(out));
        }
        ("float16", None) => "float16",
        ("bfloat16", None) => "bfloat16",
        ("uint16" | "int16", Some("bfloat16")) => "bfloat16",
        (_, Some(b)) if b != "bfloat16" => {
            return Err(invalid_arg(format!(
                "bits: expected None or \"bfloat16\", got {b:?}"
            )))
        }
        (other, Some(_)) => {
            return Err(dtype_err(format!(
                "{what}: bits=\"bfloat16\" expects a uint16 or int16 array, got dtype {other}"
            )))
        }
        (other, None) => {
            return Err(dtype_err(format!(
                "{what}: expected dtype float32, float16 or bfloat16, got {other}"
            )))
        }
    };
    // Reinterpret the 16-bit values as uint16 (C order; a copy only when the
    // input is not C-contiguous).
    let np = obj.py().import("numpy")?;
    let u16s = np
        .call_method1("ascontiguousarray", (obj,))?
        .call_method1("view", (np.getattr("uint16")?,))?;
    let mut out = Vec::new();
    u16_rows(&u16s, what, heads, dim, tokens, &mut out)?;
    Ok(match kind {
        "float16" => OwnedRows::F16(out),
        _ => OwnedRows::Bf16(out),
    })
}

/// A uint16 `[heads, T, dim]` (or `[1, heads, T, dim]`) array copied into `out`.
fn u16_rows(
    obj: &Bound<'_, PyAny>,
    what: &str,
    heads: usize,
    dim: usize,
    tokens: usize,
    out: &mut Vec<u16>,
) -> PyResult<()> {
    let arr = obj
        .cast::<PyArrayDyn<u16>>()
        .map_err(|_| dtype_err(format!("{what}: expected 16-bit values")))?;
    let shape = arr.shape().to_vec();
    let ok = match shape.as_slice() {
        [1, h, t, d] | [h, t, d] => *h == heads && *t == tokens && *d == dim,
        _ => false,
    };
    if !ok {
        return Err(shape_err(format!(
            "{what}: expected shape [{heads}, {tokens}, {dim}], got {shape:?}"
        )));
    }
    copy_c_order(arr, what, out)
}

/// A step's new K and V rows for a layer of `layer` geometry and `tokens`
/// tokens, each checked and copied out of the arrays in its own type (float32,
/// float16, bfloat16; see [`typed_rows`]). The copy is deliberate: an input may
/// be a view of the very pool it is written into (`spec.k[:, a:b]` with one
/// head is contiguous), and the pool write is a non-overlapping copy.
pub fn kv_rows(
    k: &Bound<'_, PyAny>,
    v: &Bound<'_, PyAny>,
    layer: &offgraph_kv::LayerConfig,
    tokens: usize,
    bits: Option<&str>,
) -> PyResult<(OwnedRows, OwnedRows)> {
    Ok((
        typed_rows(k, "k", layer, tokens, bits)?,
        typed_rows(v, "v", layer, tokens, bits)?,
    ))
}

/// `None` or the value, as Python spells it in a repr.
pub fn py_opt(v: Option<usize>) -> String {
    v.map_or("None".to_string(), |v| v.to_string())
}

/// The Python type name of `obj`, for error messages.
pub fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_default()
}

/// A `str` named `what`: non-str is `DTypeError`; a str that is not valid
/// UTF-8 (lone surrogates) is `InvalidArgumentError`, not `UnicodeEncodeError`.
pub fn text(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<String> {
    let s = obj
        .cast::<pyo3::types::PyString>()
        .map_err(|_| dtype_err(format!("{what}: expected a str, got {}", type_name(obj))))?;
    s.to_cow().map(|c| c.into_owned()).map_err(|_| {
        invalid_arg(format!(
            "{what}: not encodable as UTF-8 (lone surrogates), got {}",
            s.repr().map(|r| r.to_string()).unwrap_or_default()
        ))
    })
}

/// A real number named `what`: non-numbers are `DTypeError`; ints too large
/// for a float are `InvalidArgumentError`, not `OverflowError`.
pub fn real(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<f64> {
    match obj.extract::<f64>() {
        Ok(v) => Ok(v),
        Err(e) if e.is_instance_of::<pyo3::exceptions::PyOverflowError>(obj.py()) => {
            Err(invalid_arg(format!(
                "{what} is out of range for a float, got {}",
                obj.repr()?
            )))
        }
        Err(_) => Err(dtype_err(format!(
            "{what}: expected a real number, got {}",
            type_name(obj)
        ))),
    }
}
