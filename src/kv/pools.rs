//! The per-layer pools of one cache: building them from a config and the
//! layer-indexed accessors both byte-layer caches share.

use super::Pool;
use crate::config::CacheConfig;
use crate::error::{CacheError, Result};

/// One [`Pool`] per layer.
#[derive(Debug)]
pub struct LayerPools(Vec<Pool>);

impl LayerPools {
    /// A pool per layer of `cfg`, `depth(layer)` rows deep, starting at
    /// `initial_capacity` rows (clamped to the depth).
    pub fn new(
        cfg: &CacheConfig,
        depth: impl Fn(&CacheConfig, usize) -> Result<usize>,
    ) -> Result<Self> {
        let mut pools = Vec::with_capacity(cfg.n_layers);
        for layer in 0..cfg.n_layers {
            let l = cfg.layer(layer)?;
            let depth = depth(cfg, layer)?;
            pools.push(Pool::with_dtypes(
                l.n_kv_heads,
                l.head_dim,
                cfg.initial_capacity.min(depth),
                depth,
                cfg.k_dtype,
                cfg.v_dtype,
            )?);
        }
        Ok(LayerPools(pools))
    }

    fn layer_error(layer: usize, n_layers: usize) -> CacheError {
        CacheError::InvalidArgument(format!(
            "layer {layer} out of range: the cache has {n_layers} layers"
        ))
    }

    pub fn get(&self, layer: usize) -> Result<&Pool> {
        self.0
            .get(layer)
            .ok_or_else(|| Self::layer_error(layer, self.0.len()))
    }

    pub fn get_mut(&mut self, layer: usize) -> Result<&mut Pool> {
        // The message is built only on the error path: update allocates nothing.
        let n_layers = self.0.len();
        self.0
            .get_mut(layer)
            .ok_or_else(|| Self::layer_error(layer, n_layers))
    }

    /// Bytes the pools of `layer` hold.
    pub fn nbytes(&self, layer: usize) -> Result<usize> {
        Ok(self.get(layer)?.nbytes())
    }

    /// Bytes all pools hold.
    pub fn nbytes_total(&self) -> usize {
        self.0.iter().map(Pool::nbytes).sum()
    }
}
