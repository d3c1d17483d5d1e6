//! `attend(q, spec, scale=None, threads=None, backend="auto", softcap=None)`:
//! pooled attention over a spec's pools, with the GIL released while it computes.

use numpy::{PyArray3, PyArrayMethods, PyUntypedArrayMethods};
use offgraph_kv::attention::{attend_into, AttendOptions, Backend};
use pyo3::prelude::*;

use crate::args::{f32_array, opt_index, real, text, with_c_order};
use crate::errors::{invalid_arg, shape_err, ErrorClass, IntoPy};
use crate::spec::PyAttendSpec;

fn stale(spec: &PyAttendSpec) -> PyErr {
    ErrorClass::Step.err(format!(
            "attend: the spec of layer {} belongs to a step that has since been closed; update the layer in the open step",
            spec.layer
        ),
    )
}

/// softmax(q·Kᵀ·scale + mask)·V over the spec's visible rows.
///
/// `q`: float32 `[n_q_heads, T, head_dim]` (a leading batch of 1 is accepted),
/// `n_q_heads` a multiple of the spec's `n_kv_heads`. Returns a new float32
/// array of q's shape. `scale` defaults to 1/sqrt(head_dim); `threads` to the
/// machine's cores; `backend` is "auto", "native" or "xnnpack"; `softcap`
/// (Gemma 2's attention logit soft-capping) turns each score into
/// `softcap * tanh(score / softcap)` before the mask and softmax, and must be
/// finite and > 0 as a float32 (`None`: no cap). The GIL is
/// released while it computes; the spec's cache stays borrowed meanwhile:
/// other threads may read it (and attend over it), and a mutation of it from
/// another thread is refused with `StepError` ("the cache is in use").
#[pyfunction]
#[pyo3(signature = (q, spec, scale=None, threads=None, backend=None, softcap=None))]
pub fn attend<'py>(
    py: Python<'py>,
    q: &Bound<'py, PyAny>,
    spec: PyRef<'py, PyAttendSpec>,
    scale: Option<&Bound<'py, PyAny>>,
    threads: Option<&Bound<'py, PyAny>>,
    backend: Option<&Bound<'py, PyAny>>,
    softcap: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyArray3<f32>>> {
    let backend = match backend {
        Some(b) => Backend::parse(&text(b, "backend")?).py_err()?,
        None => Backend::parse("auto").py_err()?,
    };
    let scale = match scale.filter(|s| !s.is_none()) {
        Some(s) => Some(real(s, "scale")?),
        None => None,
    };
    let softcap = match softcap.filter(|s| !s.is_none()) {
        // Checked as the float32 the kernel uses: 1e-50 or 1e50 is no valid cap there.
        Some(s) => Some(real(s, "softcap")? as f32),
        None => None,
    };
    let threads = opt_index(threads, "threads")?;
    if threads == Some(0) {
        return Err(invalid_arg("threads must be >= 1, got 0"));
    }
    if let Some(s) = scale {
        if !s.is_finite() {
            return Err(invalid_arg(format!("scale must be finite, got {s}")));
        }
    }
    if let Some(c) = softcap {
        if !(c.is_finite() && c > 0.0) {
            return Err(invalid_arg(format!(
                "softcap must be finite and > 0 as a float32, got {c}"
            )));
        }
    }
    // q: float32, rank 3 (or 4 with a batch of 1), C-contiguous or copied.
    let arr = f32_array(q, "q")?;
    let shape = arr.shape().to_vec();
    let q_shape: [usize; 3] = match shape.as_slice() {
        [1, h, t, d] | [h, t, d] => [*h, *t, *d],
        s => {
            return Err(shape_err(format!(
                "q: expected shape [n_q_heads, T, head_dim], got {s:?}"
            )))
        }
    };
    let opts = AttendOptions {
        scale: scale.map(|s| s as f32),
        threads,
        backend,
        softcap,
        ..AttendOptions::default()
    };
    let out = PyArray3::<f32>::zeros(py, q_shape, false);
    // SAFETY: `out` was just created here and no other reference to it exists.
    let out_slice = unsafe { out.as_slice_mut() }.map_err(|e| shape_err(e.to_string()))?;
    let ran = with_c_order(&arr, "q", |q_data| {
        spec.owner
            .with_core_spec(py, spec.generation, spec.layer, "attend", &mut |core| {
                py.detach(|| attend_into(q_data, q_shape, core, &opts, &mut *out_slice))
                    .py_err()
            })
    })??;
    if !ran {
        return Err(stale(&spec));
    }
    Ok(out)
}
