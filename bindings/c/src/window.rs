//! Ring arithmetic for C: the core's `window` module, so that a C runner
//! sizes its cell cache with the formula every other runner uses.

use crate::config::{config_of, okv_config};
use crate::ptr::out;
use crate::status::{fail, guard, okv_status};

/// Cells an `okv_cell_cache` (or `okv_kv_cell_cache`) of `cfg` needs for
/// `n_seqs` sequences forked from one `prefix`-token sequence, each then
/// growing by `new_tokens` positions one step at a time, with no cell ever
/// refused. `cfg` is validated first (`OKV_ERR_INVALID_CONFIG`); a workload
/// whose count does not fit in `size_t` is `OKV_ERR_INVALID_ARGUMENT`.
///
/// `n_seqs` counts every sequence that grows, the original included when it
/// decodes too (the prefix's cells are counted once, shared by all); a
/// source sequence that stops growing at the fork needs no cell beyond the
/// prefix, so leave it out of `n_seqs`.
///
/// Statuses: those above.
#[no_mangle]
pub unsafe extern "C" fn okv_cells_for_forks(
    cfg: *const okv_config,
    prefix: usize,
    n_seqs: usize,
    new_tokens: usize,
    out_n_cells: *mut usize,
) -> okv_status {
    guard(|| {
        let what = "okv_cells_for_forks";
        let o = out(out_n_cells, what)?;
        let c = unsafe { config_of(cfg, what) }?;
        let n = c
            .try_cells_for_forks(prefix, n_seqs, new_tokens)
            .map_err(|e| fail(okv_status::OKV_ERR_INVALID_ARGUMENT, format!("{what}: {e}")))?;
        o.set(n);
        Ok(())
    })
}
