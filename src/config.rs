//! Cache configuration: per-layer policies and the sizes every part derives from.

use crate::dtype::KvDtype;
use crate::error::{CacheError, Result};
pub use crate::window::LayerPolicy;

/// One layer's policy and K/V geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LayerConfig {
    pub policy: LayerPolicy,
    pub n_kv_heads: usize,
    pub head_dim: usize,
}

impl LayerConfig {
    pub fn new(policy: LayerPolicy, n_kv_heads: usize, head_dim: usize) -> Self {
        LayerConfig {
            policy,
            n_kv_heads,
            head_dim,
        }
    }
}

/// Upper bounds that keep every derived size (slots × heads × dims × 4 bytes)
/// far from overflowing a `usize`, so later arithmetic needs no checks.
pub const MAX_CAPACITY: usize = 1 << 31;
pub const MAX_HEADS: usize = 4096;
pub const MAX_HEAD_DIM: usize = 65536;
pub const MAX_LAYERS: usize = 65536;

/// The whole cache's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheConfig {
    /// Most positions one sequence may hold (flat layers keep them all).
    pub capacity: usize,
    /// Number of layers of the model.
    pub n_layers: usize,
    /// Length 1 (every layer alike) or `n_layers`.
    pub layers: Vec<LayerConfig>,
    /// Slots a pool starts with; pools double from here up to their depth.
    /// A value above a layer's depth is clamped to it (any value >= 1 is valid).
    pub initial_capacity: usize,
    /// Most tokens one step may carry.
    pub max_step: usize,
    /// Storage type of every K pool (see [`KvDtype`]).
    pub k_dtype: KvDtype,
    /// Storage type of every V pool.
    pub v_dtype: KvDtype,
}

fn bad(field: &str, msg: String) -> Result<()> {
    Err(CacheError::InvalidConfig(format!("{field}: {msg}")))
}

impl CacheConfig {
    /// A config with `initial_capacity = min(capacity, 16)` and `max_step = 1`
    /// reasonable defaults for a decode loop; set the fields for prefill.
    pub fn new(capacity: usize, n_layers: usize, layers: Vec<LayerConfig>) -> Self {
        CacheConfig {
            capacity,
            n_layers,
            layers,
            initial_capacity: capacity.clamp(1, 16),
            max_step: 1,
            k_dtype: KvDtype::Float32,
            v_dtype: KvDtype::Float32,
        }
    }

    /// The same config with K and V pools stored as `dtype`.
    pub fn with_dtype(self, dtype: KvDtype) -> Self {
        self.with_dtypes(dtype, dtype)
    }

    /// The same config with K pools stored as `k` and V pools as `v`.
    pub fn with_dtypes(self, k: KvDtype, v: KvDtype) -> Self {
        CacheConfig {
            k_dtype: k,
            v_dtype: v,
            ..self
        }
    }

    /// Refuses every bad field with an error that names it.
    pub fn validate(&self) -> Result<()> {
        if self.capacity == 0 || self.capacity > MAX_CAPACITY {
            return bad(
                "capacity",
                format!("must be in 1..={MAX_CAPACITY}, got {}", self.capacity),
            );
        }
        if self.n_layers == 0 || self.n_layers > MAX_LAYERS {
            return bad(
                "n_layers",
                format!("must be in 1..={MAX_LAYERS}, got {}", self.n_layers),
            );
        }
        if self.layers.len() != 1 && self.layers.len() != self.n_layers {
            return bad(
                "layers",
                format!(
                    "must have length 1 or n_layers ({}), got {}",
                    self.n_layers,
                    self.layers.len()
                ),
            );
        }
        if self.max_step == 0 || self.max_step > self.capacity {
            return bad(
                "max_step",
                format!(
                    "must be in 1..=capacity ({}), got {}",
                    self.capacity, self.max_step
                ),
            );
        }
        // Above a layer's depth it is clamped (pools never exceed their depth), as
        // the upstream design defaults it to 512 whatever the capacity.
        if self.initial_capacity == 0 {
            return bad("initial_capacity", "must be at least 1, got 0".to_string());
        }
        for (i, l) in self.layers.iter().enumerate() {
            if l.n_kv_heads == 0 || l.n_kv_heads > MAX_HEADS {
                return bad(
                    &format!("layers[{i}].n_kv_heads"),
                    format!("must be in 1..={MAX_HEADS}, got {}", l.n_kv_heads),
                );
            }
            if l.head_dim == 0 || l.head_dim > MAX_HEAD_DIM {
                return bad(
                    &format!("layers[{i}].head_dim"),
                    format!("must be in 1..={MAX_HEAD_DIM}, got {}", l.head_dim),
                );
            }
            // A window at or above the capacity is valid: the layer then behaves as a
            // full one (see `LayerPolicy::Ring`).
            if l.policy == (LayerPolicy::Ring { window: 0 }) {
                return bad(
                    &format!("layers[{i}].policy.window"),
                    "must be at least 1, got 0".to_string(),
                );
            }
        }
        for (i, l) in self.layers.iter().enumerate() {
            for (what, d) in [("k_dtype", self.k_dtype), ("v_dtype", self.v_dtype)] {
                d.check_head_dim(l.head_dim).map_err(|e| {
                    CacheError::InvalidConfig(format!("{what} of layers[{i}]: {}", e.message()))
                })?;
            }
        }
        Ok(())
    }

    /// The config of layer `layer` (broadcast when `layers` has length 1).
    pub fn layer(&self, layer: usize) -> Result<&LayerConfig> {
        if layer >= self.n_layers {
            return Err(CacheError::InvalidArgument(format!(
                "layer {layer} out of range: the cache has {} layers",
                self.n_layers
            )));
        }
        let idx = if self.layers.len() == 1 { 0 } else { layer };
        self.layers.get(idx).ok_or_else(|| {
            CacheError::InvalidConfig(format!(
                "layers: no entry for layer {layer} (length {})",
                self.layers.len()
            ))
        })
    }

    /// The distinct policies in first-seen layer order, and for each layer the
    /// index of its policy: layers that share a policy share a plan.
    pub fn distinct_policies(&self) -> Result<PolicyTable> {
        let mut policies: Vec<LayerPolicy> = Vec::new();
        let mut layer_policy = Vec::with_capacity(self.n_layers);
        for layer in 0..self.n_layers {
            let p = self.layer(layer)?.policy;
            let idx = match policies.iter().position(|q| *q == p) {
                Some(i) => i,
                None => {
                    policies.push(p);
                    policies.len().saturating_sub(1)
                }
            };
            layer_policy.push(idx);
        }
        Ok(PolicyTable {
            policies,
            layer_policy,
        })
    }

    /// Cells a `CellCache` of this config needs for a forked workload: see
    /// [`window::cells_for_forks`](crate::window::cells_for_forks).
    pub fn cells_for_forks(&self, prefix: usize, n_seqs: usize, new_tokens: usize) -> usize {
        let policies = (0..self.n_layers).filter_map(|l| self.layer(l).ok().map(|c| c.policy));
        crate::window::cells_for_forks(policies, self.max_step, prefix, n_seqs, new_tokens)
    }

    /// [`Self::cells_for_forks`], refusing (`InvalidArgument`) a workload whose
    /// count does not fit a `usize` instead of saturating.
    pub fn try_cells_for_forks(
        &self,
        prefix: usize,
        n_seqs: usize,
        new_tokens: usize,
    ) -> Result<usize> {
        let policies = (0..self.n_layers).filter_map(|l| self.layer(l).ok().map(|c| c.policy));
        crate::window::checked_cells_for_forks(policies, self.max_step, prefix, n_seqs, new_tokens)
            .ok_or_else(|| {
                CacheError::InvalidArgument(format!(
                    "cells_for_forks: prefix {prefix} + {n_seqs} sequences x {new_tokens} tokens overflows the platform's size"
                ))
            })
    }

    /// Slots a layer of this policy ever needs: flat keeps `capacity`;
    /// a ring keeps `window + max_step - 1` (capped at `capacity`), which lets a
    /// multi-token step keep every key its earliest query needs.
    pub fn depth(&self, policy: LayerPolicy) -> usize {
        match policy {
            LayerPolicy::Flat => self.capacity,
            LayerPolicy::Ring { window } => {
                crate::window::ring_keep(window, self.max_step).min(self.capacity)
            }
        }
    }
}

/// A config's distinct policies, in first-seen layer order, and which one
/// each layer uses: both caches plan once per distinct policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyTable {
    policies: Vec<LayerPolicy>,
    layer_policy: Vec<usize>,
}

impl PolicyTable {
    /// The distinct policies.
    pub fn policies(&self) -> &[LayerPolicy] {
        &self.policies
    }

    /// Index into [`Self::policies`] of a layer's policy.
    pub fn index(&self, layer: usize) -> Result<usize> {
        self.layer_policy
            .get(layer)
            .copied()
            .ok_or_else(|| self.layer_error(layer))
    }

    /// A layer's policy.
    pub fn policy(&self, layer: usize) -> Result<LayerPolicy> {
        self.of_layer(layer, &self.policies)
    }

    /// The entry of `per_policy` (one value per distinct policy) for `layer`'s
    /// policy.
    pub fn of_layer<T: Copy>(&self, layer: usize, per_policy: &[T]) -> Result<T> {
        let idx = self.index(layer)?;
        per_policy
            .get(idx)
            .copied()
            .ok_or_else(|| self.layer_error(layer))
    }

    /// The error for a layer out of range.
    pub fn layer_error(&self, layer: usize) -> CacheError {
        CacheError::InvalidArgument(format!(
            "layer {layer} out of range: the cache has {} layers",
            self.layer_policy.len()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok_cfg() -> CacheConfig {
        CacheConfig::new(64, 2, vec![LayerConfig::new(LayerPolicy::Flat, 2, 8)])
    }

    #[test]
    fn valid_config_passes() {
        assert_eq!(ok_cfg().validate(), Ok(()));
    }

    #[test]
    fn ring_depth_is_window_plus_max_step_minus_one() {
        let mut c = ok_cfg();
        c.max_step = 4;
        assert_eq!(c.depth(LayerPolicy::Ring { window: 8 }), 11);
        assert_eq!(c.depth(LayerPolicy::Ring { window: 64 }), 64);
        assert_eq!(c.depth(LayerPolicy::Flat), 64);
    }
}
