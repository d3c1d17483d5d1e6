//! The exports of `okv_kv_cell_cache`: the bookkeeping verbs (named after
//! `okv_cell_cache`'s) and the byte faces.

use offgraph_kv::KvCellCache;

use super::{okv_cell_plan, okv_kv_cell_cache, verbs};
use crate::attend::{okv_attend_options, AttendArgs};
use crate::config::{build, okv_config};
use crate::handle::release;
use crate::pools::{self, okv_pool_view};
use crate::sequence::okv_run;
use crate::status::{guard, okv_status};

/// A cell cache with K/V pools (`n_cells` rows deep) for `cfg` (validated; copied).
///
/// Statuses: as `okv_cell_cache_new`, and `OKV_ERR_OUT_OF_CAPACITY` when the
/// first pools cannot be allocated.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_cell_cache_new(
    cfg: *const okv_config,
    n_cells: usize,
    n_seq_max: usize,
    out_cache: *mut *mut okv_kv_cell_cache,
) -> okv_status {
    guard(|| unsafe {
        build(cfg, out_cache, "okv_kv_cell_cache_new", |c| {
            KvCellCache::new(c, n_cells, n_seq_max)
        })
    })
}

/// Frees the cache and its pools. NULL is a no-op.
///
/// Statuses: as `okv_seq_cache_free`.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_cell_cache_free(cache: *mut okv_kv_cell_cache) -> okv_status {
    guard(|| unsafe { release(cache, "okv_kv_cell_cache_free") })
}

/// See `okv_cell_cache_seq_new`.
///
/// Statuses: as `okv_cell_cache_seq_new`.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_cell_cache_seq_new(
    cache: *mut okv_kv_cell_cache,
    out_seq: *mut u64,
) -> okv_status {
    guard(|| unsafe { verbs::seq_new(cache, out_seq, "okv_kv_cell_cache_seq_new") })
}

/// See `okv_cell_cache_seq_clone` (the clone shares the cells' K/V rows).
///
/// Statuses: as `okv_cell_cache_seq_clone`.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_cell_cache_seq_clone(
    cache: *mut okv_kv_cell_cache,
    src: u64,
    upto: usize,
    out_seq: *mut u64,
) -> okv_status {
    guard(|| unsafe { verbs::seq_clone(cache, src, upto, out_seq, "okv_kv_cell_cache_seq_clone") })
}

/// See `okv_cell_cache_seq_rm`.
///
/// Statuses: as `okv_cell_cache_seq_rm`.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_cell_cache_seq_rm(
    cache: *mut okv_kv_cell_cache,
    seq: u64,
    p0: usize,
    p1: usize,
) -> okv_status {
    guard(|| unsafe { verbs::seq_rm(cache, seq, p0, p1, "okv_kv_cell_cache_seq_rm") })
}

/// See `okv_cell_cache_seq_free`.
///
/// Statuses: as `okv_cell_cache_seq_free`.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_cell_cache_seq_free(
    cache: *mut okv_kv_cell_cache,
    seq: u64,
) -> okv_status {
    guard(|| unsafe { verbs::seq_free(cache, seq, "okv_kv_cell_cache_seq_free") })
}

/// See `okv_cell_cache_next_pos`.
///
/// Statuses: as `okv_cell_cache_next_pos`.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_cell_cache_next_pos(
    cache: *const okv_kv_cell_cache,
    seq: u64,
    out_pos: *mut usize,
) -> okv_status {
    guard(|| unsafe { verbs::next_pos(cache, seq, out_pos, "okv_kv_cell_cache_next_pos") })
}

/// See `okv_cell_cache_seq_len`.
///
/// Statuses: as `okv_cell_cache_seq_len`.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_cell_cache_seq_len(
    cache: *const okv_kv_cell_cache,
    seq: u64,
    out_len: *mut usize,
) -> okv_status {
    guard(|| unsafe { verbs::seq_len(cache, seq, out_len, "okv_kv_cell_cache_seq_len") })
}

/// See `okv_cell_cache_free_cells`.
///
/// Statuses: only the common ones.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_cell_cache_free_cells(
    cache: *const okv_kv_cell_cache,
    out_n: *mut usize,
) -> okv_status {
    guard(|| unsafe { verbs::free_cells(cache, out_n, "okv_kv_cell_cache_free_cells") })
}

/// See `okv_cell_cache_capacity`.
///
/// Statuses: only the common ones.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_cell_cache_capacity(
    cache: *const okv_kv_cell_cache,
    out_n: *mut usize,
) -> okv_status {
    guard(|| unsafe { verbs::capacity(cache, out_n, "okv_kv_cell_cache_capacity") })
}

/// See `okv_cell_cache_can_extend`.
///
/// Statuses: only the common ones.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_cell_cache_can_extend(
    cache: *const okv_kv_cell_cache,
    n: usize,
    out_ok: *mut bool,
) -> okv_status {
    guard(|| unsafe { verbs::can_extend(cache, n, out_ok, "okv_kv_cell_cache_can_extend") })
}

/// See `okv_cell_cache_clear`; the pools' pages also go back to the OS.
///
/// Statuses: only the common ones.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_cell_cache_clear(cache: *mut okv_kv_cell_cache) -> okv_status {
    guard(|| unsafe { verbs::clear(cache, "okv_kv_cell_cache_clear") })
}

/// See `okv_cell_cache_begin_step`.
///
/// Statuses: as `okv_cell_cache_begin_step` (`max_step` bounds all
/// sequences' tokens together).
#[no_mangle]
pub unsafe extern "C" fn okv_kv_cell_cache_begin_step(
    cache: *mut okv_kv_cell_cache,
    seq_ids: *const u64,
    positions: *const usize,
    n_tokens: usize,
) -> okv_status {
    guard(|| unsafe {
        verbs::begin_step(
            cache,
            seq_ids,
            positions,
            n_tokens,
            "okv_kv_cell_cache_begin_step",
        )
    })
}

/// See `okv_cell_cache_plan`.
///
/// Statuses: as `okv_cell_cache_plan`.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_cell_cache_plan(
    cache: *const okv_kv_cell_cache,
    layer: usize,
    out_plan: *mut okv_cell_plan,
) -> okv_status {
    guard(|| unsafe { verbs::plan(cache, layer, out_plan, "okv_kv_cell_cache_plan") })
}

/// See `okv_cell_cache_visible`.
///
/// Statuses: as `okv_cell_cache_visible`.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_cell_cache_visible(
    cache: *const okv_kv_cell_cache,
    layer: usize,
    token: usize,
    runs: *mut okv_run,
    cap: usize,
    out_n: *mut usize,
) -> okv_status {
    guard(|| unsafe {
        verbs::visible(
            cache,
            (layer, token),
            runs,
            cap,
            out_n,
            "okv_kv_cell_cache_visible",
        )
    })
}

/// See `okv_cell_cache_dense_mask`.
///
/// Statuses: as `okv_cell_cache_dense_mask`.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_cell_cache_dense_mask(
    cache: *mut okv_kv_cell_cache,
    layer: usize,
    out_mask: *mut *const u8,
    out_rows: *mut usize,
    out_cols: *mut usize,
) -> okv_status {
    guard(|| unsafe {
        let outs = (out_mask, out_rows, out_cols);
        verbs::dense_mask(cache, layer, outs, "okv_kv_cell_cache_dense_mask")
    })
}

/// Writes the open step's rows of `layer` to the tokens' cells: `k` and `v`
/// hold `[n_kv_heads, n_tokens, head_dim]` floats (`k_len`, `v_len`), not
/// overlapping the pools. Refused calls write nothing.
///
/// Statuses: as `okv_kv_seq_cache_update`.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_cell_cache_update(
    cache: *mut okv_kv_cell_cache,
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
            "okv_kv_cell_cache_update",
        )
    })
}

/// Attention of the open step at `layer` into `out` (see
/// `okv_kv_seq_cache_attend`); each token sees exactly its sequence's cells.
///
/// Query head h reads KV head h / (n_q_heads / n_kv_heads).
///
/// Statuses: as `okv_kv_seq_cache_attend`; a layer the open step has not
/// updated is `OKV_ERR_STEP_PROTOCOL`.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_cell_cache_attend(
    cache: *mut okv_kv_cell_cache,
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
        pools::attend(cache, layer, &args, "okv_kv_cell_cache_attend")
    })
}

/// Layer `layer`'s pools (valid until the next mutating call on the cache).
///
/// Statuses: `OKV_ERR_INVALID_ARGUMENT` for a layer out of range.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_cell_cache_pool(
    cache: *const okv_kv_cell_cache,
    layer: usize,
    out_view: *mut okv_pool_view,
) -> okv_status {
    guard(|| unsafe { pools::pool(cache, layer, out_view, "okv_kv_cell_cache_pool") })
}

/// Bytes all pools hold.
///
/// Statuses: only the common ones (real stored bytes, as `okv_kv_seq_cache_nbytes`).
#[no_mangle]
pub unsafe extern "C" fn okv_kv_cell_cache_nbytes(
    cache: *const okv_kv_cell_cache,
    out_bytes: *mut usize,
) -> okv_status {
    guard(|| unsafe { pools::nbytes(cache, out_bytes, "okv_kv_cell_cache_nbytes") })
}
