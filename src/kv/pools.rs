//! The per-layer pools of one cache: building them from a config and the
//! layer-indexed accessors both byte-layer caches share.

use super::{Pool, PoolMemory};
use crate::config::CacheConfig;
use crate::error::{CacheError, Result};

/// One [`Pool`] per layer.
#[derive(Debug)]
pub struct LayerPools(Vec<Pool>);

impl LayerPools {
    /// A pool per layer of `cfg`, `depth(layer)` rows deep, in `memory`
    /// (a grown pool starts at `initial_capacity` rows, clamped to the depth).
    pub fn new(
        cfg: &CacheConfig,
        memory: PoolMemory,
        depth: impl Fn(&CacheConfig, usize) -> Result<usize>,
    ) -> Result<Self> {
        let mut pools = Vec::with_capacity(cfg.n_layers);
        for layer in 0..cfg.n_layers {
            let l = cfg.layer(layer)?;
            let depth = depth(cfg, layer)?;
            pools.push(Pool::with_memory(
                l.n_kv_heads,
                l.head_dim,
                cfg.initial_capacity.min(depth),
                depth,
                cfg.k_dtype,
                cfg.v_dtype,
                memory,
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

    /// Bytes the rows of `layer`'s pools need at the high-water mark.
    pub fn nbytes(&self, layer: usize) -> Result<usize> {
        Ok(self.get(layer)?.nbytes())
    }

    /// Bytes all pools' rows need at their high-water marks.
    pub fn nbytes_total(&self) -> usize {
        self.0.iter().map(Pool::nbytes).sum()
    }

    /// Address space all pools hold.
    pub fn reserved_bytes_total(&self) -> usize {
        self.0.iter().map(Pool::reserved_bytes).sum()
    }

    /// Memory all pools hold now (see [`Pool::committed_bytes`]).
    pub fn committed_bytes_total(&self) -> usize {
        self.0.iter().map(Pool::committed_bytes).sum()
    }

    /// `Reserve` when every pool reserved its depth, `Grow` when any grows.
    pub fn memory(&self) -> PoolMemory {
        if self.0.iter().all(|p| p.memory() == PoolMemory::Reserve) {
            PoolMemory::Reserve
        } else {
            PoolMemory::Grow
        }
    }

    /// Gives every pool's pages back (see [`Pool::release_all`]).
    pub fn release_all(&mut self) {
        self.0.iter_mut().for_each(Pool::release_all);
    }
}
