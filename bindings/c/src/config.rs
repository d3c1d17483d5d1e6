//! `okv_config`: a cache configuration, built by setters and validated by
//! every constructor that takes it.
//!
//! The pool dtypes have their own setter, `okv_config_set_dtypes` (in `dtype.rs`).

use std::sync::Mutex;

use offgraph_kv::{CacheConfig, LayerConfig, LayerPolicy};

use crate::handle::{lock, opaque, publish, release, Opaque};
use crate::ptr::{out, slice};
use crate::status::{fail, guard, okv_status, R};

/// A layer that keeps every position up to the capacity.
pub const OKV_POLICY_FLAT: u32 = 0;
/// A sliding-window layer: a query at position p sees keys in [p - window + 1, p].
pub const OKV_POLICY_RING: u32 = 1;

/// One layer's policy and K/V geometry.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct okv_layer_config {
    /// `OKV_POLICY_FLAT` or `OKV_POLICY_RING`.
    pub policy: u32,
    /// The ring window (ignored for a flat layer).
    pub window: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
}

/// A cache configuration (opaque). Not shared by the caches built from it:
/// each constructor copies it, so it may be changed or freed afterwards.
pub struct okv_config {
    magic: u64,
    inner: Mutex<CacheConfig>,
}
opaque!(
    okv_config,
    CacheConfig,
    OKV_HANDLE_CONFIG,
    0x6f6b_765f_6366_6701
);

pub(crate) fn layer_from_c(l: &okv_layer_config, i: usize) -> R<LayerConfig> {
    let policy = match l.policy {
        OKV_POLICY_FLAT => LayerPolicy::Flat,
        OKV_POLICY_RING => LayerPolicy::Ring { window: l.window },
        p => {
            return Err(fail(
                okv_status::OKV_ERR_INVALID_CONFIG,
                format!(
                "layers[{i}].policy: expected OKV_POLICY_FLAT (0) or OKV_POLICY_RING (1), got {p}"
            ),
            ))
        }
    };
    Ok(LayerConfig::new(policy, l.n_kv_heads, l.head_dim))
}

/// A copy of the config behind `cfg`, validated.
pub(crate) unsafe fn config_of(cfg: *const okv_config, what: &str) -> R<CacheConfig> {
    let c = unsafe { lock(cfg, what) }?.clone();
    c.validate()?;
    Ok(c)
}

/// The body of a cache's `_new`: `make` builds the cache from a validated
/// copy of `cfg`, published as a new handle in `*o` (written on success only).
pub(crate) unsafe fn build<H: Opaque>(
    cfg: *const okv_config,
    o: *mut *mut H,
    what: &str,
    make: impl FnOnce(CacheConfig) -> offgraph_kv::Result<H::Inner>,
) -> R<()> {
    let o = out(o, "out_cache").map_err(|f| f.within(what))?;
    let c = make(unsafe { config_of(cfg, what) }?)?;
    publish::<H>(c, o);
    Ok(())
}

/// A config of `capacity` positions and `n_layers` layers, with no layer
/// configs yet (set them with `okv_config_set_layers`), `max_step` 1 and
/// `initial_capacity` min(capacity, 16). Nothing is validated until a cache is
/// built (or `okv_config_validate`).
///
/// Statuses: only the common ones (`OKV_ERR_NULL_POINTER` for a NULL `out_cfg`).
#[no_mangle]
pub unsafe extern "C" fn okv_config_new(
    capacity: usize,
    n_layers: usize,
    out_cfg: *mut *mut okv_config,
) -> okv_status {
    guard(|| {
        let o = out(out_cfg, "okv_config_new: out_cfg")?;
        publish::<okv_config>(CacheConfig::new(capacity, n_layers, Vec::new()), o);
        Ok(())
    })
}

/// Frees a config. NULL is a no-op.
///
/// Statuses: `OKV_ERR_BAD_HANDLE` for a pointer that is not a live config (nothing freed).
#[no_mangle]
pub unsafe extern "C" fn okv_config_free(cfg: *mut okv_config) -> okv_status {
    guard(|| unsafe { release(cfg, "okv_config_free") })
}

/// Sets the layer configs: `n` is 1 (every layer alike) or the config's
/// `n_layers`. Refused (nothing changes) for another count or an unknown policy.
///
/// Statuses: `OKV_ERR_INVALID_CONFIG` for a count other than 1 or
/// `n_layers`, or an unknown policy (the message names `layers[i].policy`);
/// `OKV_ERR_NULL_POINTER` for NULL `layers` with `n` > 0. Ranges (heads,
/// head_dim, window) are checked by `okv_config_validate` and the constructors.
#[no_mangle]
pub unsafe extern "C" fn okv_config_set_layers(
    cfg: *mut okv_config,
    layers: *const okv_layer_config,
    n: usize,
) -> okv_status {
    guard(|| {
        let what = "okv_config_set_layers";
        let mut c = unsafe { lock(cfg, what) }?;
        let ls = unsafe { slice(layers, n, "okv_config_set_layers: layers") }?;
        if n != 1 && n != c.n_layers {
            return Err(fail(
                okv_status::OKV_ERR_INVALID_CONFIG,
                format!(
                    "{what}: expected 1 or n_layers ({}) layer configs, got {n}",
                    c.n_layers
                ),
            ));
        }
        let v = ls
            .iter()
            .enumerate()
            .map(|(i, l)| layer_from_c(l, i))
            .collect::<R<Vec<_>>>()?;
        c.layers = v;
        Ok(())
    })
}

/// Sets the most tokens one step may carry (checked when a cache is built).
///
/// Statuses: only the common ones; `max_step` 0 or above the capacity is
/// `OKV_ERR_INVALID_CONFIG` from `okv_config_validate` and every constructor.
#[no_mangle]
pub unsafe extern "C" fn okv_config_set_max_step(
    cfg: *mut okv_config,
    max_step: usize,
) -> okv_status {
    guard(|| {
        unsafe { lock(cfg, "okv_config_set_max_step") }?.max_step = max_step;
        Ok(())
    })
}

/// Sets the slots a pool starts with (checked when a cache is built).
///
/// Statuses: only the common ones; 0 is `OKV_ERR_INVALID_CONFIG` from
/// `okv_config_validate` and every constructor (a value above a layer's depth is clamped).
#[no_mangle]
pub unsafe extern "C" fn okv_config_set_initial_capacity(
    cfg: *mut okv_config,
    initial_capacity: usize,
) -> okv_status {
    guard(|| {
        unsafe { lock(cfg, "okv_config_set_initial_capacity") }?.initial_capacity =
            initial_capacity;
        Ok(())
    })
}

/// `OKV_OK` when the config is valid, else `OKV_ERR_INVALID_CONFIG` naming the field.
///
/// Statuses: `OKV_ERR_INVALID_CONFIG` naming the first bad field: capacity 0
/// or above 2^31, n_layers 0 or above 65536, a layer count other than 1 or
/// n_layers, `max_step` 0 or above the capacity, `initial_capacity` 0, heads or
/// head_dim 0 or out of range, a ring window of 0, a q8_0 dtype with a head_dim
/// that is not a multiple of 32.
#[no_mangle]
pub unsafe extern "C" fn okv_config_validate(cfg: *const okv_config) -> okv_status {
    guard(|| {
        unsafe { lock(cfg, "okv_config_validate") }?.validate()?;
        Ok(())
    })
}

/// The pool depth (slots) of layer `layer`: capacity for a flat layer,
/// min(window + max_step - 1, capacity) for a ring layer.
///
/// Statuses: `OKV_ERR_INVALID_ARGUMENT` for a layer out of range;
/// `OKV_ERR_INVALID_CONFIG` for a config with no layer configs yet.
#[no_mangle]
pub unsafe extern "C" fn okv_config_depth(
    cfg: *const okv_config,
    layer: usize,
    out_depth: *mut usize,
) -> okv_status {
    guard(|| {
        let o = out(out_depth, "okv_config_depth: out_depth")?;
        let c = unsafe { lock(cfg, "okv_config_depth") }?;
        let p = c.layer(layer)?.policy;
        o.set(c.depth(p));
        Ok(())
    })
}
