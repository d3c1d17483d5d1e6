//! Pooled attention: `softmax(q·Kᵀ·scale + mask)·V` straight over an
//! [`AttendSpec`]'s pools, reading only the rows its key layout names.
//!
//! * `q` and the output are `[n_q_heads, T, head_dim]` f32, row-major. The
//!   pools are read as stored, in any [`crate::KvDtype`] (K and V apart):
//!   float32 in place; float16, bfloat16 and q8_0 widened to f32 next to the
//!   arithmetic (AVX-512 decode: 16 values at a time in registers; other
//!   shapes and ISAs: one 64-row tile at a time into an L1 scratch), never
//!   as a copy of the history. Accumulation is f32 throughout.
//!   `n_q_heads` is a nonzero multiple of the spec's `n_kv_heads` (grouped-query
//!   attention): query head `h` reads KV head `h / (n_q_heads / n_kv_heads)`.
//! * [`KeyLayout::Runs`](crate::KeyLayout::Runs): token `i` sees row `r` of the concatenated read runs
//!   (logical position `read_base_pos + r`) iff `mask.visible(positions[i], pos)`.
//!   [`KeyLayout::Cells`](crate::KeyLayout::Cells): token `i` sees exactly the rows of its runs.
//! * A token that sees no key at all gets an output row of zeros (the limit of
//!   an empty softmax-weighted sum; never NaN).
//! * [`AttendOptions::softcap`] caps each score as `cap · tanh(score / cap)`
//!   before the mask and the softmax (Gemma 2's attention logit soft-capping);
//!   keys the mask hides stay hidden.
//! * Rows of the pools outside the named runs are never read, so they may hold
//!   anything, NaN included.
//!
//! Two backends ([`Backend`]): a fused native kernel (`native`, see
//! `kernel/`) and XNNPACK operators (`xnnpack`, see `xnn.rs`, behind the
//! default `xnnpack` cargo feature). `auto` picks per shape, see [`resolve_backend`].
//!
//! Where things live: this file is the public face and the backend choice;
//! `validate.rs` checks a call once (and states the arithmetic bounds the
//! other files rely on); `geometry.rs` cuts the call into tasks; `exec.rs`
//! runs them over threads; `softmax.rs`
//! holds the online-softmax state both backends fold into; `softcap.rs` the
//! score cap both apply before it; `colsoftmax.rs`
//! and `transpose.rs` are the XNNPACK backend's native passes. In `kernel/`:
//! the blocked driver and the micro-kernel trait (`mod.rs`), ISA detection
//! and dispatch (`select.rs`), the portable, AVX2 and AVX-512 micro-kernels
//! (`portable.rs`, `avx2.rs`, `avx512/`), and the widening of stored
//! float16, bfloat16 and q8_0 rows (`widen.rs`, `avx512/stored.rs`).
//!
//! Threads: the work is cut into tasks of one KV head × one block of ≤ 32 query
//! rows, each over all the keys its rows see. Tasks are split into contiguous
//! ranges over a persistent worker pool (`crate::workers`: started once, the
//! caller's thread being one of the workers).
//!
//! Invariance: with the native backend, a query row's output is a function of
//! that row and the keys and values it sees, in their order (position order:
//! read runs oldest first, a token's cell runs as the cell cache lists them),
//! and of the ISA path, nothing else: the same bits whatever other rows share
//! the call or its blocks, however the step is chunked, however many threads
//! run it, and however its keys' rows are cut into runs in the pools. The
//! kernel visits keys in tiles of a fixed grid (see `kernel/mod.rs`), a row's
//! path (register-widening or scratch tiles, integer dots) depends on the ISA
//! and `head_dim` only, and keys are never split over tasks. XNNPACK makes no
//! such promise (its operators tile by the block's shape); `auto` never picks it.
//!
//! Allocation: [`attend_into`] writes into the caller's buffer. Per-thread
//! scratch (scaled queries, accumulators, score tiles) is thread-local and only
//! grows, so a call allocates nothing once warm (beyond the pool's thread
//! starting the first time a call asks for more threads than it holds).

#[cfg(feature = "xnnpack")]
mod colsoftmax;
mod exec;
mod geometry;
mod kernel;
mod softcap;
mod softmax;
#[cfg(feature = "xnnpack")]
mod transpose;
mod validate;
#[cfg(feature = "xnnpack")]
mod xnn;

use crate::error::{CacheError, Result};
use crate::spec::AttendSpec;
use geometry::Geometry;
use validate::{validate, Validated};

/// Which implementation computes attention.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum Backend {
    /// Pick per shape from measured crossover points ([`resolve_backend`]).
    #[default]
    Auto,
    /// The fused single-pass kernel.
    Native,
    /// XNNPACK fully-connected operators (needs the `xnnpack` feature).
    Xnnpack,
}

impl Backend {
    /// Parses the Python spelling: `"auto"`, `"native"` or `"xnnpack"`.
    pub fn parse(s: &str) -> Result<Backend> {
        match s {
            "auto" => Ok(Backend::Auto),
            "native" => Ok(Backend::Native),
            "xnnpack" => Ok(Backend::Xnnpack),
            other => Err(CacheError::InvalidArgument(format!(
                "backend: expected one of \"auto\", \"native\", \"xnnpack\", got {other:?}"
            ))),
        }
    }

    /// The spelling [`Backend::parse`] accepts.
    pub fn name(&self) -> &'static str {
        match self {
            Backend::Auto => "auto",
            Backend::Native => "native",
            Backend::Xnnpack => "xnnpack",
        }
    }

    /// Whether this build can run the backend (`xnnpack` needs the cargo feature).
    pub fn available(&self) -> bool {
        *self != Backend::Xnnpack || cfg!(feature = "xnnpack")
    }
}

/// Which instruction set the native kernel uses. `Auto` (the default) takes the
/// best one the CPU reports at run time; forcing one is for tests and benchmarks
/// (a forced ISA the CPU lacks is refused with [`CacheError::Backend`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum NativeIsa {
    #[default]
    Auto,
    /// Explicit AVX-512F intrinsics.
    Avx512,
    /// The portable kernel compiled with AVX2+FMA enabled (autovectorised).
    Avx2,
    /// The portable kernel without extra target features.
    Scalar,
    /// AVX-512 with q8_0 keys scored by VNNI integer dot products against q
    /// quantized once per step (the other dtypes as `Avx512`); what `Auto`
    /// takes where the CPU has AVX-512 VNNI.
    Avx512Vnni,
    /// AVX2 with q8_0 keys of decode blocks scored by `vpmaddubsw` integer
    /// dot products against q quantized once per block (the other dtypes
    /// as `Avx2`); what `Auto` takes on an AVX2 CPU without AVX-512.
    Avx2Int8,
}

/// Options of [`attend`].
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct AttendOptions {
    /// Multiplier of `q·k`; `None` means `1 / sqrt(head_dim)`.
    pub scale: Option<f32>,
    /// Worker threads; `None` means `std::thread::available_parallelism()`.
    pub threads: Option<usize>,
    pub backend: Backend,
    pub native_isa: NativeIsa,
    /// Attention logit soft-capping (Gemma 2): each score `q·k·scale`
    /// becomes `cap · tanh(score / cap)` before the mask and the softmax.
    /// `None` applies no cap; a cap must be finite and `> 0`. Every backend
    /// and native ISA applies it (see `softcap.rs`).
    pub softcap: Option<f32>,
}

/// Computes attention into a new `[n_q_heads, T, head_dim]` buffer. See the module docs.
pub fn attend(
    q: &[f32],
    q_shape: [usize; 3],
    spec: &AttendSpec<'_>,
    opts: &AttendOptions,
) -> Result<Vec<f32>> {
    let mut out = vec![0.0f32; q.len()];
    attend_into(q, q_shape, spec, opts, &mut out)?;
    Ok(out)
}

/// Computes attention into `out` (`q.len()` floats, same layout as `q`).
/// On error `out` is left untouched.
pub fn attend_into(
    q: &[f32],
    q_shape: [usize; 3],
    spec: &AttendSpec<'_>,
    opts: &AttendOptions,
    out: &mut [f32],
) -> Result<()> {
    let valid = validate(q, q_shape, spec, opts, out.len())?;
    let exec = choose_exec(valid, q_shape, spec, opts)?;
    if q.is_empty() {
        return Ok(());
    }
    let threads = match opts.threads {
        Some(t) => t,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let head_dim = spec.head_dim;
    let scale = opts.scale.unwrap_or(1.0 / (head_dim as f32).sqrt());
    let cap = opts.softcap.map(softcap::Softcap::new);
    let geo = Geometry::new(q, q_shape, spec, scale, cap, exec.rows_per_block());
    exec::run_tasks(&geo, exec, threads, out)
}

/// The backend a validated call runs on, refused when this build or CPU cannot
/// serve it (the XNNPACK backend also refuses non-f32 pools).
fn choose_exec(
    _valid: Validated,
    q_shape: [usize; 3],
    spec: &AttendSpec<'_>,
    opts: &AttendOptions,
) -> Result<Exec> {
    Ok(match resolve_backend(q_shape, spec, opts) {
        Backend::Xnnpack => {
            #[cfg(feature = "xnnpack")]
            {
                xnn::check_dtypes(spec.k.dtype, spec.v.dtype)?;
                xnn::ensure_init()?;
                Exec::Xnn
            }
            #[cfg(not(feature = "xnnpack"))]
            {
                return Err(CacheError::Backend(
                    "backend \"xnnpack\": expected a build with the `xnnpack` feature, got one without"
                        .into(),
                ));
            }
        }
        _ => Exec::Native(kernel::select_isa(opts.native_isa)?),
    })
}

/// The backend `Backend::Auto` resolves to for a shape (other choices pass through).
///
/// Native won every shape measured with `benches/attention.rs` (decode by
/// 6-9x, prefill by about 2.4x; the table is in `docs/attention-backends.md`),
/// and on an AVX2 machine without AVX-512 `benches/prefill_backends.rs` has
/// XNNPACK at 1.66-1.73x native's time for float32 prefill (T = 128 and 512
/// at an 8K context, 1 and 2 threads; `docs/bench/decode-floor.md`), so
/// `auto` picks `native` everywhere. Native is
/// also the only backend that serves float16, bfloat16 and q8_0 pools (XNNPACK
/// refuses them with `Backend`), so `auto` never picks a backend that cannot
/// serve the spec. XNNPACK would need persistent packed pages (a per-page
/// write generation from the byte layer) to compete.
pub fn resolve_backend(
    _q_shape: [usize; 3],
    _spec: &AttendSpec<'_>,
    opts: &AttendOptions,
) -> Backend {
    match opts.backend {
        Backend::Auto => Backend::Native,
        b => b,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Exec {
    Native(kernel::IsaPath),
    #[cfg(feature = "xnnpack")]
    Xnn,
}

impl Exec {
    /// Query rows per task block.
    fn rows_per_block(self) -> usize {
        match self {
            Exec::Native(_) => kernel::RB,
            #[cfg(feature = "xnnpack")]
            Exec::Xnn => colsoftmax::RB,
        }
    }
}
