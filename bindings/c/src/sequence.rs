//! `okv_seq_cache` (SequenceCache: bookkeeping only) and `okv_kv_seq_cache`
//! (KvSequenceCache: bookkeeping plus K/V pools): control, plan, update, attend.
//!
//! Thread-safety: a handle may move between threads, but calls on one handle
//! must not overlap (a second concurrent call gets `OKV_ERR_BUSY`).

use std::sync::Mutex;

use offgraph_kv::{KvSequenceCache, MaskKind, Runs, SeqStepPlan, SequenceCache};

use crate::attend::{okv_attend_options, AttendArgs};
use crate::config::{build, okv_config};
use crate::handle::{mutate, opaque, query, release, Opaque};
use crate::pools::{self, okv_pool_view};
use crate::ptr::out;
use crate::status::{guard, okv_status, R};

/// A run of slots (or cells): `[start, start + len)`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct okv_run {
    pub start: usize,
    pub len: usize,
}

/// Every read row is visible to every query of the step.
pub const OKV_MASK_NONE: u32 = 0;
/// Lower-right causal over the step: a query at q sees positions <= q.
pub const OKV_MASK_CAUSAL: u32 = 1;
/// Causal and at most `window` back: q sees positions in [q - window + 1, q].
pub const OKV_MASK_WINDOW: u32 = 2;

/// One layer's plan of the open step (a copy: it never dangles).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct okv_seq_plan {
    /// Logical position of the step's first token.
    pub position: usize,
    pub n_tokens: usize,
    /// Slots the step's rows land in, in token order (2 runs when a ring wraps).
    pub n_write: usize,
    pub write: [okv_run; 2],
    /// Slots of the visible history plus the step, oldest first.
    pub n_read: usize,
    pub read: [okv_run; 2],
    /// Logical position of the first read row.
    pub read_base_pos: usize,
    /// `OKV_MASK_NONE`, `OKV_MASK_CAUSAL` or `OKV_MASK_WINDOW`.
    pub mask_kind: u32,
    /// The ring window of the layer (0 for a flat layer).
    pub window: usize,
    /// The layer's pool depth in slots.
    pub depth: usize,
}

fn runs_to_c(r: &Runs) -> (usize, [okv_run; 2]) {
    let mut out = [okv_run::default(); 2];
    for (o, x) in out.iter_mut().zip(r.as_slice()) {
        *o = okv_run {
            start: x.start,
            len: x.len,
        };
    }
    (r.len(), out)
}

fn plan_to_c(p: &SeqStepPlan) -> okv_seq_plan {
    let (n_write, write) = runs_to_c(&p.write);
    let (n_read, read) = runs_to_c(&p.read);
    okv_seq_plan {
        position: p.position,
        n_tokens: p.n_tokens,
        n_write,
        write,
        n_read,
        read,
        read_base_pos: p.read_base_pos,
        mask_kind: match p.mask {
            MaskKind::None => OKV_MASK_NONE,
            MaskKind::Causal => OKV_MASK_CAUSAL,
            MaskKind::Window(_) => OKV_MASK_WINDOW,
        },
        window: p.window().unwrap_or(0),
        depth: p.depth,
    }
}

/// Bookkeeping for one sequence (opaque).
pub struct okv_seq_cache {
    magic: u64,
    inner: Mutex<SequenceCache>,
}
opaque!(
    okv_seq_cache,
    SequenceCache,
    OKV_HANDLE_SEQ_CACHE,
    0x6f6b_765f_7365_7102
);

/// One sequence's bookkeeping and K/V pools (opaque).
pub struct okv_kv_seq_cache {
    magic: u64,
    inner: Mutex<KvSequenceCache>,
}
opaque!(
    okv_kv_seq_cache,
    KvSequenceCache,
    OKV_HANDLE_KV_SEQ_CACHE,
    0x6f6b_765f_6b76_7303
);

/// The control and planner faces both sequence caches share.
trait SeqFace {
    fn seq(&self) -> &SequenceCache;
    fn begin_step(&mut self, n: usize) -> offgraph_kv::Result<usize>;
    fn rewind(&mut self, n: usize) -> offgraph_kv::Result<()>;
    fn clear(&mut self);
}

/// A handle holding either sequence cache: the bound the shared calls take.
trait SeqHandle: Opaque<Inner: SeqFace> {}
impl<H: Opaque<Inner: SeqFace>> SeqHandle for H {}

impl SeqFace for SequenceCache {
    fn seq(&self) -> &SequenceCache {
        self
    }
    fn begin_step(&mut self, n: usize) -> offgraph_kv::Result<usize> {
        SequenceCache::begin_step(self, n)
    }
    fn rewind(&mut self, n: usize) -> offgraph_kv::Result<()> {
        SequenceCache::rewind(self, n)
    }
    fn clear(&mut self) {
        SequenceCache::clear(self)
    }
}

impl SeqFace for KvSequenceCache {
    fn seq(&self) -> &SequenceCache {
        self.sequence()
    }
    fn begin_step(&mut self, n: usize) -> offgraph_kv::Result<usize> {
        KvSequenceCache::begin_step(self, n)
    }
    fn rewind(&mut self, n: usize) -> offgraph_kv::Result<()> {
        KvSequenceCache::rewind(self, n)
    }
    fn clear(&mut self) {
        KvSequenceCache::clear(self)
    }
}

unsafe fn length<H: SeqHandle>(h: *const H, o: *mut usize, what: &str) -> R<()> {
    unsafe { query(h, o, what, |c| Ok(c.seq().length())) }
}

unsafe fn capacity<H: SeqHandle>(h: *const H, o: *mut usize, what: &str) -> R<()> {
    unsafe { query(h, o, what, |c| Ok(c.seq().capacity())) }
}

unsafe fn min_rewind<H: SeqHandle>(h: *const H, o: *mut usize, what: &str) -> R<()> {
    unsafe { query(h, o, what, |c| Ok(c.seq().min_rewind())) }
}

unsafe fn can_extend<H: SeqHandle>(h: *const H, n: usize, o: *mut bool, what: &str) -> R<()> {
    unsafe { query(h, o, what, |c| Ok(c.seq().can_extend(n))) }
}

unsafe fn begin_step<H: SeqHandle>(h: *const H, n: usize, o: *mut usize, what: &str) -> R<()> {
    let o = out(o, what)?;
    o.set(unsafe { mutate(h, what, |c| Ok(c.begin_step(n)?)) }?);
    Ok(())
}

unsafe fn rewind<H: SeqHandle>(h: *const H, n: usize, what: &str) -> R<()> {
    unsafe { mutate(h, what, |c| Ok(c.rewind(n)?)) }
}

unsafe fn clear<H: SeqHandle>(h: *const H, what: &str) -> R<()> {
    unsafe {
        mutate(h, what, |c| {
            c.clear();
            Ok(())
        })
    }
}

unsafe fn plan<H: SeqHandle>(h: *const H, layer: usize, o: *mut okv_seq_plan, what: &str) -> R<()> {
    unsafe { query(h, o, what, |c| Ok(plan_to_c(&c.seq().plan(layer)?))) }
}

// ---------------------------------------------------------------------------
// okv_seq_cache

/// A sequence cache (bookkeeping only) for `cfg` (validated; copied).
///
/// Statuses: `OKV_ERR_INVALID_CONFIG` when `cfg` fails validation (see
/// `okv_config_validate`; `*out_cache` is not written).
#[no_mangle]
pub unsafe extern "C" fn okv_seq_cache_new(
    cfg: *const okv_config,
    out_cache: *mut *mut okv_seq_cache,
) -> okv_status {
    guard(|| unsafe { build(cfg, out_cache, "okv_seq_cache_new", SequenceCache::new) })
}

/// Frees the cache. NULL is a no-op.
///
/// Statuses: `OKV_ERR_BAD_HANDLE` (nothing freed), `OKV_ERR_BUSY` while another
/// thread is inside a call on it.
#[no_mangle]
pub unsafe extern "C" fn okv_seq_cache_free(cache: *mut okv_seq_cache) -> okv_status {
    guard(|| unsafe { release(cache, "okv_seq_cache_free") })
}

/// Tokens committed so far.
///
/// Statuses: only the common ones.
#[no_mangle]
pub unsafe extern "C" fn okv_seq_cache_length(
    cache: *const okv_seq_cache,
    out_len: *mut usize,
) -> okv_status {
    guard(|| unsafe { length(cache, out_len, "okv_seq_cache_length") })
}

/// Most tokens the sequence may hold.
///
/// Statuses: only the common ones.
#[no_mangle]
pub unsafe extern "C" fn okv_seq_cache_capacity(
    cache: *const okv_seq_cache,
    out_cap: *mut usize,
) -> okv_status {
    guard(|| unsafe { capacity(cache, out_cap, "okv_seq_cache_capacity") })
}

/// The lowest length `rewind` accepts now (ring layers bound it).
///
/// Statuses: only the common ones.
#[no_mangle]
pub unsafe extern "C" fn okv_seq_cache_min_rewind(
    cache: *const okv_seq_cache,
    out_len: *mut usize,
) -> okv_status {
    guard(|| unsafe { min_rewind(cache, out_len, "okv_seq_cache_min_rewind") })
}

/// Whether `n` more tokens fit.
///
/// Statuses: only the common ones.
#[no_mangle]
pub unsafe extern "C" fn okv_seq_cache_can_extend(
    cache: *const okv_seq_cache,
    n: usize,
    out_ok: *mut bool,
) -> okv_status {
    guard(|| unsafe { can_extend(cache, n, out_ok, "okv_seq_cache_can_extend") })
}

/// The admission gate: checks 1 <= n_tokens <= max_step and room, commits
/// the step (length grows by n_tokens) and writes its first position. A
/// refused call changes nothing and leaves the previous step open.
///
/// Statuses: `OKV_ERR_INVALID_ARGUMENT` for `n_tokens` 0 or above the
/// config's `max_step`; `OKV_ERR_OUT_OF_CAPACITY` when length + n_tokens
/// exceeds the capacity. `*out_position` is written on success only.
#[no_mangle]
pub unsafe extern "C" fn okv_seq_cache_begin_step(
    cache: *mut okv_seq_cache,
    n_tokens: usize,
    out_position: *mut usize,
) -> okv_status {
    guard(|| unsafe { begin_step(cache, n_tokens, out_position, "okv_seq_cache_begin_step") })
}

/// Drops the tokens from `new_len` on and closes the step. Refused above the
/// length or below `min_rewind`.
///
/// Statuses: `OKV_ERR_INVALID_ARGUMENT` for `new_len` above the length or below
/// `min_rewind` (the message says which bound).
#[no_mangle]
pub unsafe extern "C" fn okv_seq_cache_rewind(
    cache: *mut okv_seq_cache,
    new_len: usize,
) -> okv_status {
    guard(|| unsafe { rewind(cache, new_len, "okv_seq_cache_rewind") })
}

/// Forgets everything and closes the step.
///
/// Statuses: only the common ones.
#[no_mangle]
pub unsafe extern "C" fn okv_seq_cache_clear(cache: *mut okv_seq_cache) -> okv_status {
    guard(|| unsafe { clear(cache, "okv_seq_cache_clear") })
}

/// The open step's plan for `layer` (`OKV_ERR_STEP_PROTOCOL` with no open step).
///
/// Statuses: `OKV_ERR_INVALID_ARGUMENT` for a layer out of range (checked
/// first); `OKV_ERR_STEP_PROTOCOL` with no open step (before the first
/// `begin_step`, after `rewind` or `clear`).
#[no_mangle]
pub unsafe extern "C" fn okv_seq_cache_plan(
    cache: *const okv_seq_cache,
    layer: usize,
    out_plan: *mut okv_seq_plan,
) -> okv_status {
    guard(|| unsafe { plan(cache, layer, out_plan, "okv_seq_cache_plan") })
}

// ---------------------------------------------------------------------------
// okv_kv_seq_cache

/// A sequence cache with K/V pools for `cfg` (validated; copied).
///
/// Statuses: `OKV_ERR_INVALID_CONFIG` when `cfg` fails validation (unknown
/// dtypes cannot reach it: `okv_config_set_dtypes` refuses them);
/// `OKV_ERR_OUT_OF_CAPACITY` when the first pools cannot be allocated.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_seq_cache_new(
    cfg: *const okv_config,
    out_cache: *mut *mut okv_kv_seq_cache,
) -> okv_status {
    guard(|| unsafe { build(cfg, out_cache, "okv_kv_seq_cache_new", KvSequenceCache::new) })
}

/// Frees the cache and its pools. NULL is a no-op.
///
/// Statuses: as `okv_seq_cache_free`.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_seq_cache_free(cache: *mut okv_kv_seq_cache) -> okv_status {
    guard(|| unsafe { release(cache, "okv_kv_seq_cache_free") })
}

/// Tokens committed so far.
///
/// Statuses: only the common ones.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_seq_cache_length(
    cache: *const okv_kv_seq_cache,
    out_len: *mut usize,
) -> okv_status {
    guard(|| unsafe { length(cache, out_len, "okv_kv_seq_cache_length") })
}

/// Most tokens the sequence may hold.
///
/// Statuses: only the common ones.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_seq_cache_capacity(
    cache: *const okv_kv_seq_cache,
    out_cap: *mut usize,
) -> okv_status {
    guard(|| unsafe { capacity(cache, out_cap, "okv_kv_seq_cache_capacity") })
}

/// The lowest length `rewind` accepts now (ring layers bound it).
///
/// Statuses: only the common ones.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_seq_cache_min_rewind(
    cache: *const okv_kv_seq_cache,
    out_len: *mut usize,
) -> okv_status {
    guard(|| unsafe { min_rewind(cache, out_len, "okv_kv_seq_cache_min_rewind") })
}

/// Bytes all pools hold.
///
/// Statuses: only the common ones. The count is the real stored bytes:
/// 2 per value for float16/bfloat16 pools, 34 per 32 values for q8_0.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_seq_cache_nbytes(
    cache: *const okv_kv_seq_cache,
    out_bytes: *mut usize,
) -> okv_status {
    guard(|| unsafe { pools::nbytes(cache, out_bytes, "okv_kv_seq_cache_nbytes") })
}

/// Whether `n` more tokens fit.
///
/// Statuses: only the common ones.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_seq_cache_can_extend(
    cache: *const okv_kv_seq_cache,
    n: usize,
    out_ok: *mut bool,
) -> okv_status {
    guard(|| unsafe { can_extend(cache, n, out_ok, "okv_kv_seq_cache_can_extend") })
}

/// The admission gate (see `okv_seq_cache_begin_step`).
///
/// Statuses: as `okv_seq_cache_begin_step`.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_seq_cache_begin_step(
    cache: *mut okv_kv_seq_cache,
    n_tokens: usize,
    out_position: *mut usize,
) -> okv_status {
    guard(|| unsafe { begin_step(cache, n_tokens, out_position, "okv_kv_seq_cache_begin_step") })
}

/// Drops the tokens from `new_len` on and closes the step (see `okv_seq_cache_rewind`).
///
/// Statuses: as `okv_seq_cache_rewind`.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_seq_cache_rewind(
    cache: *mut okv_kv_seq_cache,
    new_len: usize,
) -> okv_status {
    guard(|| unsafe { rewind(cache, new_len, "okv_kv_seq_cache_rewind") })
}

/// Forgets every token, gives the pools' pages back to the OS and closes the step.
///
/// Statuses: only the common ones.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_seq_cache_clear(cache: *mut okv_kv_seq_cache) -> okv_status {
    guard(|| unsafe { clear(cache, "okv_kv_seq_cache_clear") })
}

/// The open step's plan for `layer`.
///
/// Statuses: as `okv_seq_cache_plan`.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_seq_cache_plan(
    cache: *const okv_kv_seq_cache,
    layer: usize,
    out_plan: *mut okv_seq_plan,
) -> okv_status {
    guard(|| unsafe { plan(cache, layer, out_plan, "okv_kv_seq_cache_plan") })
}

/// Writes the open step's rows of `layer`: `k` and `v` hold
/// `[n_kv_heads, n_tokens, head_dim]` floats each (`k_len`, `v_len` elements),
/// not overlapping the pools. Refused calls write nothing.
///
/// Statuses: `OKV_ERR_INVALID_ARGUMENT` for a layer out of range, or `k`/`v`
/// overlapping the pools or misaligned; `OKV_ERR_STEP_PROTOCOL` with no open
/// step; `OKV_ERR_SHAPE` for a wrong element count (the message gives the
/// expected `[n_kv_heads, n_tokens, head_dim]`); `OKV_ERR_NULL_POINTER` for NULL
/// rows with a nonzero length; `OKV_ERR_OUT_OF_CAPACITY` when a pool cannot grow.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_seq_cache_update(
    cache: *mut okv_kv_seq_cache,
    layer: usize,
    k: *const f32,
    k_len: usize,
    v: *const f32,
    v_len: usize,
) -> okv_status {
    guard(|| unsafe {
        pools::update(
            cache,
            layer,
            (k, k_len),
            (v, v_len),
            "okv_kv_seq_cache_update",
        )
    })
}

/// Attention of the open step at `layer` into `out`: `q` and `out` hold
/// `[n_q_heads, n_tokens, head_dim]` floats (`q_len`, `out_len` elements);
/// `n_q_heads` a multiple of the layer's KV heads. Call after `_update` of
/// this layer: before it (no step open, or the open step has not updated
/// `layer`) the call is `OKV_ERR_STEP_PROTOCOL` naming the layer, never an
/// earlier step's rows. `out` is untouched on refusal.
///
/// Grouped-query attention: query head h reads KV head h / (n_q_heads /
/// n_kv_heads).
///
/// Statuses: `OKV_ERR_SHAPE` when `n_q_heads` is not a nonzero multiple of the
/// layer's `n_kv_heads` (a GQA mismatch) or `q_len`/`out_len` are not
/// `n_q_heads * n_tokens * head_dim`; `OKV_ERR_INVALID_ARGUMENT` for a layer out
/// of range, `out` overlapping `q` or the pools, a non-finite scale or an
/// unknown backend; `OKV_ERR_STEP_PROTOCOL` with no open step or the layer not updated in it;
/// `OKV_ERR_BACKEND` when the backend asked for cannot serve (XNNPACK not
/// built, or a pool dtype it does not read); `OKV_ERR_NULL_POINTER` for NULL
/// `q` or `out` with a nonzero length.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_seq_cache_attend(
    cache: *const okv_kv_seq_cache,
    layer: usize,
    q: *const f32,
    q_len: usize,
    n_q_heads: usize,
    out: *mut f32,
    out_len: usize,
    options: *const okv_attend_options,
) -> okv_status {
    guard(|| unsafe {
        let args = AttendArgs::new(q, q_len, n_q_heads, out, out_len, options);
        pools::attend(cache, layer, &args, "okv_kv_seq_cache_attend")
    })
}

/// Layer `layer`'s pools (see `okv_pool_view` for how long they stay valid).
///
/// Statuses: `OKV_ERR_INVALID_ARGUMENT` for a layer out of range.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_seq_cache_pool(
    cache: *const okv_kv_seq_cache,
    layer: usize,
    out_view: *mut okv_pool_view,
) -> okv_status {
    guard(|| unsafe { pools::pool(cache, layer, out_view, "okv_kv_seq_cache_pool") })
}
