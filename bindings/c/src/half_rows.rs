//! `_update_f16` and `_update_bf16` of both pool-owning caches: rows a runtime
//! already holds as IEEE half or bfloat16 bits (`uint16_t`), written without a
//! float32 copy on its side. Each value is widened exactly, then rounded once
//! into the pool's dtype (so a float16 row into a float16 pool is stored as is).

use crate::cell::okv_kv_cell_cache;
use crate::pools::{self, Bf16Bits, F16Bits};
use crate::sequence::okv_kv_seq_cache;
use crate::status::{guard, okv_status};

/// `okv_kv_seq_cache_update` with `k` and `v` as IEEE half bits
/// (`[n_kv_heads, n_tokens, head_dim]` values each; `k_len`, `v_len` elements).
///
/// Statuses: as `okv_kv_seq_cache_update`: `OKV_ERR_STEP_PROTOCOL` with no
/// open step, `OKV_ERR_INVALID_ARGUMENT` for a layer out of range or rows that
/// overlap the pools, `OKV_ERR_SHAPE` for a wrong element count (the message
/// says the expected `[n_kv_heads, n_tokens, head_dim]`), `OKV_ERR_NULL_POINTER`
/// for NULL rows with a nonzero length. Refused calls write nothing.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_seq_cache_update_f16(
    cache: *mut okv_kv_seq_cache,
    layer: usize,
    k: *const u16,
    k_len: usize,
    v: *const u16,
    v_len: usize,
) -> okv_status {
    guard(|| unsafe {
        let what = "okv_kv_seq_cache_update_f16";
        pools::update_bits::<_, F16Bits>(cache, layer, (k, k_len), (v, v_len), what)
    })
}

/// `okv_kv_seq_cache_update_f16` with rows as bfloat16 bits (same statuses).
#[no_mangle]
pub unsafe extern "C" fn okv_kv_seq_cache_update_bf16(
    cache: *mut okv_kv_seq_cache,
    layer: usize,
    k: *const u16,
    k_len: usize,
    v: *const u16,
    v_len: usize,
) -> okv_status {
    guard(|| unsafe {
        let what = "okv_kv_seq_cache_update_bf16";
        pools::update_bits::<_, Bf16Bits>(cache, layer, (k, k_len), (v, v_len), what)
    })
}

/// `okv_kv_cell_cache_update` with `k` and `v` as IEEE half bits (same
/// statuses as `okv_kv_seq_cache_update_f16`).
#[no_mangle]
pub unsafe extern "C" fn okv_kv_cell_cache_update_f16(
    cache: *mut okv_kv_cell_cache,
    layer: usize,
    k: *const u16,
    k_len: usize,
    v: *const u16,
    v_len: usize,
) -> okv_status {
    guard(|| unsafe {
        let what = "okv_kv_cell_cache_update_f16";
        pools::update_bits::<_, F16Bits>(cache, layer, (k, k_len), (v, v_len), what)
    })
}

/// `okv_kv_cell_cache_update` with rows as bfloat16 bits (same statuses as
/// `okv_kv_seq_cache_update_f16`).
#[no_mangle]
pub unsafe extern "C" fn okv_kv_cell_cache_update_bf16(
    cache: *mut okv_kv_cell_cache,
    layer: usize,
    k: *const u16,
    k_len: usize,
    v: *const u16,
    v_len: usize,
) -> okv_status {
    guard(|| unsafe {
        let what = "okv_kv_cell_cache_update_bf16";
        pools::update_bits::<_, Bf16Bits>(cache, layer, (k, k_len), (v, v_len), what)
    })
}
