//! Attention into a caller's buffer, over the spec of a cache's open step.

use offgraph_kv::{attend_into, AttendOptions, AttendSpec, Backend};

use crate::ptr::{overlaps, slice, slice_mut, span, span_of};
use crate::status::{fail, okv_status, R};

/// Pick the backend per shape (today: native everywhere, see the core docs).
pub const OKV_BACKEND_AUTO: u32 = 0;
/// The fused native kernel.
pub const OKV_BACKEND_NATIVE: u32 = 1;
/// XNNPACK operators (`OKV_ERR_BACKEND` in a build without them).
pub const OKV_BACKEND_XNNPACK: u32 = 2;

/// Options of the `_attend` calls. A NULL options pointer means all defaults.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct okv_attend_options {
    /// Multiplier of q.k; 0 means 1 / sqrt(head_dim). Must be finite.
    pub scale: f32,
    /// Worker threads; 0 means every core.
    pub threads: usize,
    /// `OKV_BACKEND_AUTO`, `OKV_BACKEND_NATIVE` or `OKV_BACKEND_XNNPACK`.
    pub backend: u32,
}

fn options(o: Option<&okv_attend_options>) -> R<AttendOptions> {
    let Some(o) = o else {
        return Ok(AttendOptions::default());
    };
    let backend = match o.backend {
        OKV_BACKEND_AUTO => Backend::Auto,
        OKV_BACKEND_NATIVE => Backend::Native,
        OKV_BACKEND_XNNPACK => Backend::Xnnpack,
        b => {
            return Err(fail(
                okv_status::OKV_ERR_INVALID_ARGUMENT,
                format!("options.backend: expected 0 (auto), 1 (native) or 2 (xnnpack), got {b}"),
            ))
        }
    };
    Ok(AttendOptions {
        scale: (o.scale != 0.0).then_some(o.scale),
        threads: (o.threads != 0).then_some(o.threads),
        backend,
        ..AttendOptions::default()
    })
}

/// The arguments of an `_attend` call, as C hands them over.
pub(crate) struct AttendArgs {
    pub(crate) q: *const f32,
    pub(crate) q_len: usize,
    pub(crate) n_q_heads: usize,
    pub(crate) out: *mut f32,
    pub(crate) out_len: usize,
    pub(crate) opts: *const okv_attend_options,
}

impl AttendArgs {
    /// The arguments in the order every `_attend` export takes them.
    pub(crate) fn new(
        q: *const f32,
        q_len: usize,
        n_q_heads: usize,
        out: *mut f32,
        out_len: usize,
        opts: *const okv_attend_options,
    ) -> Self {
        AttendArgs {
            q,
            q_len,
            n_q_heads,
            out,
            out_len,
            opts,
        }
    }
}

/// Runs attention over `spec` (q, out: `[n_q_heads, n_tokens, head_dim]`).
/// `out` must not overlap q or the pools; it is untouched on refusal.
pub(crate) unsafe fn run(spec: &AttendSpec<'_>, a: &AttendArgs, what: &str) -> R<()> {
    // SAFETY (the three derefs): the caller's contract on (pointer, length).
    let opts = options(unsafe { a.opts.as_ref() })?;
    let o = span(a.out as *const f32, a.out_len);
    if overlaps(span(a.q, a.q_len), o)
        || overlaps(span_of(spec.k.bytes), o)
        || overlaps(span_of(spec.v.bytes), o)
    {
        return Err(fail(
            okv_status::OKV_ERR_INVALID_ARGUMENT,
            format!("{what}: out overlaps q or the cache's pools"),
        ));
    }
    let q = unsafe { slice(a.q, a.q_len, "q") }?;
    let out = unsafe { slice_mut(a.out, a.out_len, "out") }?;
    let shape = [a.n_q_heads, spec.n_tokens(), spec.head_dim];
    attend_into(q, shape, spec, &opts, out)?;
    Ok(())
}
