//! `KvCellCache`: a `CellCache` plus one K/V pool per layer, indexed by the
//! cells of the table that layer reads (flat layers: the full table; ring
//! layers: the ring table). Pools double up to `n_cells` rows.

use super::{check_rows, LayerPools, Pool};
use crate::cell::{CellCache, CellStepPlan, SeqId};
use crate::config::CacheConfig;
use crate::dtype::RowsIn;
use crate::error::{CacheError, Result};
use crate::spec::{AttendSpec, KeyLayout};

/// Many sequences' bookkeeping and bytes.
///
/// Step protocol: `begin_step(seq_ids, positions)`, then per layer
/// `update(layer, k, v)`: token i's rows go to its cell, and the returned
/// [`AttendSpec`] carries each token's visible cells as runs (built once per
/// distinct policy per step, in time proportional to what the step's sequences
/// hold). The spec borrows the cache, so no verb can run while it is alive.
#[derive(Debug)]
pub struct KvCellCache {
    cells: CellCache,
    pools: LayerPools,
}

impl KvCellCache {
    pub fn new(cfg: CacheConfig, n_cells: usize, n_seq_max: usize) -> Result<Self> {
        let cells = CellCache::new(cfg, n_cells, n_seq_max)?;
        let cfg = cells.config();
        // Every layer's pool is indexed by the cells of its table: n_cells deep.
        let pools = LayerPools::new(cfg, |_, _| Ok(n_cells))?;
        Ok(KvCellCache { cells, pools })
    }

    /// The bookkeeping, read-only.
    pub fn cells(&self) -> &CellCache {
        &self.cells
    }

    /// The bookkeeping, for the batch verbs (`seq_new`, `seq_clone`, `seq_rm`,
    /// `seq_free`, `clear`): they never move bytes, so pools need not follow.
    pub fn cells_mut(&mut self) -> &mut CellCache {
        &mut self.cells
    }

    pub fn config(&self) -> &CacheConfig {
        self.cells.config()
    }

    pub fn generation(&self) -> u64 {
        self.cells.generation()
    }

    /// Admission and placement (see [`CellCache::begin_step`]); then what each
    /// token sees is built once per distinct policy, for every layer's spec.
    pub fn begin_step(&mut self, seq_ids: &[SeqId], positions: &[usize]) -> Result<()> {
        self.cells.begin_step(seq_ids, positions)?;
        for layer in 0..self.cells.config().n_layers {
            self.cells.build_runs(layer)?;
        }
        Ok(())
    }

    pub fn plan(&self, layer: usize) -> Result<CellStepPlan<'_>> {
        self.cells.plan(layer)
    }

    pub fn pool(&self, layer: usize) -> Result<&Pool> {
        self.pools.get(layer)
    }

    /// Bookkeeping and pools together, for snapshots (`kv::snapshot`).
    pub(crate) fn parts_mut(&mut self) -> (&mut CellCache, &mut LayerPools) {
        (&mut self.cells, &mut self.pools)
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
    /// `[n_kv_heads, n_tokens, head_dim]`) to the tokens' cells and returns the
    /// spec. Refused calls write nothing.
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
        let plan = self.cells.plan(layer)?;
        let pool = self.pools.get_mut(layer)?;
        let t = plan.n_tokens();
        check_rows(&k_new, &v_new, pool.n_heads(), t, pool.head_dim())?;
        let max_cell = plan
            .cells()
            .iter()
            .map(|&c| (c as usize).saturating_add(1))
            .max()
            .unwrap_or(0);
        pool.ensure(max_cell.max(plan.read_len()))?;
        // Consecutive tokens in consecutive cells go in one copy per head.
        let cells = plan.cells();
        let mut i = 0;
        while i < t {
            let start = cells.get(i).copied().unwrap_or(0) as usize;
            let mut n = 1;
            while cells
                .get(i.saturating_add(n))
                .is_some_and(|&c| c as usize == start.saturating_add(n))
            {
                n = n.saturating_add(1);
            }
            pool.write_rows_in(k_new, v_new, t, i, start, n)?;
            i = i.saturating_add(n);
        }
        self.cells.build_runs(layer)?;
        self.spec(layer)
    }

    /// The open step's spec for `layer`: its pool and what each token sees
    /// (built once per distinct policy per step, by `begin_step` or `update`).
    /// `StepProtocol` when no step is open, or when the step was opened through
    /// [`Self::cells_mut`] and `layer` was not updated yet.
    pub fn spec(&self, layer: usize) -> Result<AttendSpec<'_>> {
        let plan = self.cells.plan(layer)?;
        let (offsets, runs) = self.cells.runs(layer)?;
        let pool = self.pool(layer)?;
        if plan.read_len() > pool.slots() {
            return Err(CacheError::StepProtocol(format!(
                "spec: layer {layer} was not updated this step (read extent {} beyond its pool of {} rows)",
                plan.read_len(),
                pool.slots()
            )));
        }
        Ok(AttendSpec {
            k: pool.k(),
            v: pool.v(),
            n_kv_heads: pool.n_heads(),
            head_dim: pool.head_dim(),
            slots: pool.slots(),
            positions: plan.positions(),
            keys: KeyLayout::Cells {
                offsets,
                runs,
                read_len: plan.read_len(),
            },
        })
    }

    /// The open step's dense mask for `layer` (`[T, read_len]`, 1 = visible).
    pub fn dense_mask(&mut self, layer: usize) -> Result<&[u8]> {
        self.cells.dense_mask(layer)
    }
}
