//! `KvSequenceCache`: a `SequenceCache` plus one K/V pool per layer.

use std::ops::Range;

use super::{pool_faces, pool_spec, write_step, LayerPools, PoolMemory, Written};
use crate::config::CacheConfig;
use crate::dtype::RowsIn;
use crate::error::Result;
use crate::runs::Runs;
use crate::sequence::{SeqStepPlan, SequenceCache};
use crate::spec::{AttendSpec, KeyLayout};

/// One sequence's bookkeeping and bytes.
///
/// The step protocol is the neutral cache's: `begin_step(n)`, then per layer
/// `update(layer, k, v)`, which writes the step's rows where the plan says
/// (a ring wrap is two runs) and returns the layer's [`AttendSpec`]. The spec
/// borrows the cache, so no other step can start while it is alive.
#[derive(Debug)]
pub struct KvSequenceCache {
    seq: SequenceCache,
    pools: LayerPools,
    /// Query positions of the open step (reused; grows at most to max_step).
    positions: Vec<usize>,
    /// The layers the open step has written: only those have a spec.
    written: Written,
}

impl KvSequenceCache {
    pool_faces!(seq: SequenceCache);

    /// Pools in the memory [`PoolMemory::from_env`] names (a reservation by default).
    pub fn new(cfg: CacheConfig) -> Result<Self> {
        Self::with_memory(cfg, PoolMemory::from_env())
    }

    /// Pools in `memory` (`Grow` forces the fallback).
    pub fn with_memory(cfg: CacheConfig, memory: PoolMemory) -> Result<Self> {
        let seq = SequenceCache::new(cfg)?;
        let cfg = seq.config();
        let pools = LayerPools::new(cfg, memory, |cfg, layer| {
            Ok(cfg.depth(cfg.layer(layer)?.policy))
        })?;
        let positions = Vec::with_capacity(cfg.max_step);
        let written = Written::new(cfg.n_layers);
        Ok(KvSequenceCache {
            seq,
            pools,
            positions,
            written,
        })
    }

    /// The bookkeeping (read-only; mutate through this type so pools follow).
    pub fn sequence(&self) -> &SequenceCache {
        &self.seq
    }

    pub fn length(&self) -> usize {
        self.seq.length()
    }

    pub fn capacity(&self) -> usize {
        self.seq.capacity()
    }

    pub fn can_extend(&self, n: usize) -> bool {
        self.seq.can_extend(n)
    }

    pub fn begin_step(&mut self, n_tokens: usize) -> Result<usize> {
        let pos = self.seq.begin_step(n_tokens)?;
        self.positions.clear();
        self.positions.extend(pos..pos.saturating_add(n_tokens));
        Ok(pos)
    }

    pub fn rewind(&mut self, new_len: usize) -> Result<()> {
        self.seq.rewind(new_len)
    }

    /// Forgets every token and gives the pools' pages back to the OS (a
    /// rewind keeps them).
    pub fn clear(&mut self) {
        self.seq.clear();
        self.pools.release_all();
    }

    pub fn plan(&self, layer: usize) -> Result<SeqStepPlan> {
        self.seq.plan(layer)
    }

    /// Positions whose rows `layer` holds (see [`SequenceCache::held_range`]).
    pub fn held_range(&self, layer: usize) -> Result<Range<usize>> {
        self.seq.held_range(layer)
    }

    /// Pool slot runs holding positions `[lo, hi)` of `layer`, with or without
    /// an open step (see [`SequenceCache::held_runs`]).
    pub fn held_runs(&self, layer: usize, lo: usize, hi: usize) -> Result<Runs> {
        self.seq.held_runs(layer, lo, hi)
    }

    /// Writes the step's rows of `layer` where the plan puts them (a ring
    /// wrap is two runs).
    fn write_layer(&mut self, layer: usize, k_new: RowsIn<'_>, v_new: RowsIn<'_>) -> Result<()> {
        let plan = self.seq.plan(layer)?;
        let pool = self.pools.get_mut(layer)?;
        let runs = plan.write.as_slice().iter().map(|r| (r.start, r.len));
        write_step(pool, k_new, v_new, plan.n_tokens, 0, runs)
    }

    /// The spec of the open step for `layer`. `StepProtocol` when no step is
    /// open, or when the open step has not written `layer` yet (`update` it
    /// first: its pool holds no rows of this step).
    pub fn spec(&self, layer: usize) -> Result<AttendSpec<'_>> {
        let plan = self.seq.plan(layer)?;
        self.written.check(layer, self.seq.generation())?;
        let keys = KeyLayout::Runs {
            read: plan.read,
            read_base_pos: plan.read_base_pos,
            mask: plan.mask,
        };
        Ok(pool_spec(self.pool(layer)?, &self.positions, keys))
    }
}
