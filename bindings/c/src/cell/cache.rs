//! The exports of `okv_cell_cache` (bookkeeping only).

use offgraph_kv::CellCache;

use super::{okv_cell_cache, okv_cell_plan, verbs};
use crate::config::{build, okv_config};
use crate::handle::release;
use crate::sequence::okv_run;
use crate::status::{guard, okv_status};

/// A cell cache (bookkeeping only) of `n_cells` cells per table and at most
/// `n_seq_max` live sequences, for `cfg` (validated; copied).
///
/// Statuses: `OKV_ERR_INVALID_CONFIG` when `cfg` fails validation;
/// `OKV_ERR_INVALID_ARGUMENT` when `n_cells` or `n_seq_max` is 0 or out of
/// range (`*out_cache` is not written).
#[no_mangle]
pub unsafe extern "C" fn okv_cell_cache_new(
    cfg: *const okv_config,
    n_cells: usize,
    n_seq_max: usize,
    out_cache: *mut *mut okv_cell_cache,
) -> okv_status {
    guard(|| unsafe {
        build(cfg, out_cache, "okv_cell_cache_new", |c| {
            CellCache::new(c, n_cells, n_seq_max)
        })
    })
}

/// Frees the cache. NULL is a no-op.
///
/// Statuses: as `okv_seq_cache_free`.
#[no_mangle]
pub unsafe extern "C" fn okv_cell_cache_free(cache: *mut okv_cell_cache) -> okv_status {
    guard(|| unsafe { release(cache, "okv_cell_cache_free") })
}

/// A new empty sequence. Its id is unique in the process: never handed out
/// again, and refused (`OKV_ERR_UNKNOWN_SEQUENCE`) by every other cache.
///
/// Statuses: `OKV_ERR_OUT_OF_CAPACITY` when `n_seq_max` sequences are live.
#[no_mangle]
pub unsafe extern "C" fn okv_cell_cache_seq_new(
    cache: *mut okv_cell_cache,
    out_seq: *mut u64,
) -> okv_status {
    guard(|| unsafe { verbs::seq_new(cache, out_seq, "okv_cell_cache_seq_new") })
}

/// A new sequence owning `src`'s cells with position < `upto` (`OKV_NONE`:
/// all); no K/V is copied. Closes the open step.
///
/// Statuses: `OKV_ERR_UNKNOWN_SEQUENCE` when `src` is not live in this cache;
/// `OKV_ERR_OUT_OF_CAPACITY` when `n_seq_max` sequences are live;
/// `OKV_ERR_INVALID_ARGUMENT` when the clone's next step would need a ring
/// position the ring table already dropped.
#[no_mangle]
pub unsafe extern "C" fn okv_cell_cache_seq_clone(
    cache: *mut okv_cell_cache,
    src: u64,
    upto: usize,
    out_seq: *mut u64,
) -> okv_status {
    guard(|| unsafe { verbs::seq_clone(cache, src, upto, out_seq, "okv_cell_cache_seq_clone") })
}

/// Drops `seq`'s positions in [p0, p1) (`p1` = `OKV_NONE`: to the end).
/// Closes the open step.
///
/// Statuses: `OKV_ERR_UNKNOWN_SEQUENCE` when `seq` is not live;
/// `OKV_ERR_INVALID_ARGUMENT` for `p1` below `p0`, or a removal that would leave
/// the sequence's next step without ring keys it needs.
#[no_mangle]
pub unsafe extern "C" fn okv_cell_cache_seq_rm(
    cache: *mut okv_cell_cache,
    seq: u64,
    p0: usize,
    p1: usize,
) -> okv_status {
    guard(|| unsafe { verbs::seq_rm(cache, seq, p0, p1, "okv_cell_cache_seq_rm") })
}

/// Frees `seq` (its id is refused from now on). Closes the open step.
///
/// Statuses: `OKV_ERR_UNKNOWN_SEQUENCE` when `seq` is not live.
#[no_mangle]
pub unsafe extern "C" fn okv_cell_cache_seq_free(
    cache: *mut okv_cell_cache,
    seq: u64,
) -> okv_status {
    guard(|| unsafe { verbs::seq_free(cache, seq, "okv_cell_cache_seq_free") })
}

/// The position `seq`'s next token takes (one past its highest held position).
///
/// Statuses: `OKV_ERR_UNKNOWN_SEQUENCE` when `seq` is not live.
#[no_mangle]
pub unsafe extern "C" fn okv_cell_cache_next_pos(
    cache: *const okv_cell_cache,
    seq: u64,
    out_pos: *mut usize,
) -> okv_status {
    guard(|| unsafe { verbs::next_pos(cache, seq, out_pos, "okv_cell_cache_next_pos") })
}

/// Positions `seq` holds.
///
/// Statuses: `OKV_ERR_UNKNOWN_SEQUENCE` when `seq` is not live.
#[no_mangle]
pub unsafe extern "C" fn okv_cell_cache_seq_len(
    cache: *const okv_cell_cache,
    seq: u64,
    out_len: *mut usize,
) -> okv_status {
    guard(|| unsafe { verbs::seq_len(cache, seq, out_len, "okv_cell_cache_seq_len") })
}

/// Free cells of the tightest table.
///
/// Statuses: only the common ones.
#[no_mangle]
pub unsafe extern "C" fn okv_cell_cache_free_cells(
    cache: *const okv_cell_cache,
    out_n: *mut usize,
) -> okv_status {
    guard(|| unsafe { verbs::free_cells(cache, out_n, "okv_cell_cache_free_cells") })
}

/// Cells per table.
///
/// Statuses: only the common ones.
#[no_mangle]
pub unsafe extern "C" fn okv_cell_cache_capacity(
    cache: *const okv_cell_cache,
    out_n: *mut usize,
) -> okv_status {
    guard(|| unsafe { verbs::capacity(cache, out_n, "okv_cell_cache_capacity") })
}

/// Whether `n` more tokens fit in the free cells (conservative for ring tables).
///
/// Statuses: only the common ones.
#[no_mangle]
pub unsafe extern "C" fn okv_cell_cache_can_extend(
    cache: *const okv_cell_cache,
    n: usize,
    out_ok: *mut bool,
) -> okv_status {
    guard(|| unsafe { verbs::can_extend(cache, n, out_ok, "okv_cell_cache_can_extend") })
}

/// Frees every sequence and cell; closes the open step.
///
/// Statuses: only the common ones.
#[no_mangle]
pub unsafe extern "C" fn okv_cell_cache_clear(cache: *mut okv_cell_cache) -> okv_status {
    guard(|| unsafe { verbs::clear(cache, "okv_cell_cache_clear") })
}

/// The admission gate and placement: token i of the step belongs to
/// `seq_ids[i]` at `positions[i]` (`n_tokens` entries each). All or nothing.
///
/// The config's `max_step` bounds the step's tokens of all sequences
/// together (`n_tokens`), not each sequence's.
///
/// Statuses: `OKV_ERR_INVALID_ARGUMENT` for `n_tokens` 0 or above `max_step`,
/// a position of `SIZE_MAX`, or a sequence's positions not strictly increasing
/// within the step; `OKV_ERR_UNKNOWN_SEQUENCE` for an id that is not live in
/// this cache; `OKV_ERR_STEP_PROTOCOL` when a token would rewrite a position its
/// sequence holds (a step only extends); `OKV_ERR_OUT_OF_CAPACITY` when the free
/// cells do not suffice; `OKV_ERR_NULL_POINTER` for NULL arrays with
/// `n_tokens` > 0.
#[no_mangle]
pub unsafe extern "C" fn okv_cell_cache_begin_step(
    cache: *mut okv_cell_cache,
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
            "okv_cell_cache_begin_step",
        )
    })
}

/// The open step's plan for `layer` (pointers valid until the next mutating call).
///
/// Statuses: `OKV_ERR_INVALID_ARGUMENT` for a layer out of range;
/// `OKV_ERR_STEP_PROTOCOL` with no open step (`seq_rm`, `seq_clone`,
/// `seq_free` and `clear` close it).
#[no_mangle]
pub unsafe extern "C" fn okv_cell_cache_plan(
    cache: *const okv_cell_cache,
    layer: usize,
    out_plan: *mut okv_cell_plan,
) -> okv_status {
    guard(|| unsafe { verbs::plan(cache, layer, out_plan, "okv_cell_cache_plan") })
}

/// Token `token`'s visible cells at `layer` as sorted, disjoint runs, into
/// `runs` (room for `cap`); `*out_n` gets the count. With too small a buffer:
/// `OKV_ERR_BUFFER_TOO_SMALL`, `*out_n` the count needed, `runs` untouched.
///
/// Statuses: `OKV_ERR_BUFFER_TOO_SMALL` as above; `OKV_ERR_INVALID_ARGUMENT`
/// for a layer or token out of range; `OKV_ERR_STEP_PROTOCOL` with no open step.
#[no_mangle]
pub unsafe extern "C" fn okv_cell_cache_visible(
    cache: *const okv_cell_cache,
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
            "okv_cell_cache_visible",
        )
    })
}

/// The open step's dense mask at `layer`: `*out_rows` (tokens) x `*out_cols`
/// (read_len) bytes, row-major, 1 = visible. Valid until the next mutating call.
///
/// Statuses: `OKV_ERR_INVALID_ARGUMENT` for a layer out of range;
/// `OKV_ERR_STEP_PROTOCOL` with no open step.
#[no_mangle]
pub unsafe extern "C" fn okv_cell_cache_dense_mask(
    cache: *mut okv_cell_cache,
    layer: usize,
    out_mask: *mut *const u8,
    out_rows: *mut usize,
    out_cols: *mut usize,
) -> okv_status {
    guard(|| unsafe {
        let outs = (out_mask, out_rows, out_cols);
        verbs::dense_mask(cache, layer, outs, "okv_cell_cache_dense_mask")
    })
}
