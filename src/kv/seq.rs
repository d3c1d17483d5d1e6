//! `KvSequenceCache`: a `SequenceCache` plus one K/V pool per layer.

use std::ops::Range;

use super::{check_rows, LayerPools, Pool};
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
}

impl KvSequenceCache {
    pub fn new(cfg: CacheConfig) -> Result<Self> {
        let seq = SequenceCache::new(cfg)?;
        let cfg = seq.config();
        let pools = LayerPools::new(cfg, |cfg, layer| Ok(cfg.depth(cfg.layer(layer)?.policy)))?;
        let positions = Vec::with_capacity(cfg.max_step);
        Ok(KvSequenceCache {
            seq,
            pools,
            positions,
        })
    }

    /// The bookkeeping (read-only; mutate through this type so pools follow).
    pub fn sequence(&self) -> &SequenceCache {
        &self.seq
    }

    pub fn config(&self) -> &CacheConfig {
        self.seq.config()
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

    pub fn generation(&self) -> u64 {
        self.seq.generation()
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

    /// Forgets every token. Pool memory is kept (and not zeroed): the next
    /// steps overwrite what they read.
    pub fn clear(&mut self) {
        self.seq.clear();
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

    pub fn pool(&self, layer: usize) -> Result<&Pool> {
        self.pools.get(layer)
    }

    /// Bookkeeping and pools together, for snapshots (`kv::snapshot`).
    pub(crate) fn parts_mut(&mut self) -> (&mut SequenceCache, &mut LayerPools) {
        (&mut self.seq, &mut self.pools)
    }

    /// Bytes the pools of `layer` hold.
    pub fn nbytes(&self, layer: usize) -> Result<usize> {
        self.pools.nbytes(layer)
    }

    /// Bytes all pools hold.
    pub fn nbytes_total(&self) -> usize {
        self.pools.nbytes_total()
    }

    /// Writes the open step's rows of `layer` (`k_new`, `v_new`:
    /// `[n_kv_heads, n_tokens, head_dim]`, row-major) and returns its spec.
    /// Refused calls write nothing.
    pub fn update(&mut self, layer: usize, k_new: &[f32], v_new: &[f32]) -> Result<AttendSpec<'_>> {
        self.update_rows(layer, RowsIn::F32(k_new), RowsIn::F32(v_new))
    }

    /// [`Self::update`] with rows in any input type ([`RowsIn`]: float32,
    /// float16 or bfloat16 bits), each rounded once into the pool's dtype.
    pub fn update_rows(
        &mut self,
        layer: usize,
        k_new: RowsIn<'_>,
        v_new: RowsIn<'_>,
    ) -> Result<AttendSpec<'_>> {
        let plan = self.seq.plan(layer)?;
        let pool = self.pools.get_mut(layer)?;
        check_rows(
            &k_new,
            &v_new,
            pool.n_heads(),
            plan.n_tokens,
            pool.head_dim(),
        )?;
        let needed = plan
            .write
            .as_slice()
            .iter()
            .map(|r| r.end())
            .max()
            .unwrap_or(0);
        pool.ensure(needed)?;
        let mut t0 = 0;
        for run in plan.write.as_slice() {
            pool.write_rows_in(k_new, v_new, plan.n_tokens, t0, run.start, run.len)?;
            t0 = t0.saturating_add(run.len);
        }
        self.spec_for(layer, &plan)
    }

    /// The spec of the open step for `layer`, without writing.
    pub fn spec(&self, layer: usize) -> Result<AttendSpec<'_>> {
        let plan = self.seq.plan(layer)?;
        self.spec_for(layer, &plan)
    }

    fn spec_for(&self, layer: usize, plan: &SeqStepPlan) -> Result<AttendSpec<'_>> {
        let pool = self.pool(layer)?;
        Ok(AttendSpec {
            k: pool.k(),
            v: pool.v(),
            n_kv_heads: pool.n_heads(),
            head_dim: pool.head_dim(),
            slots: pool.slots(),
            positions: &self.positions,
            keys: KeyLayout::Runs {
                read: plan.read,
                read_base_pos: plan.read_base_pos,
                mask: plan.mask,
            },
        })
    }
}
