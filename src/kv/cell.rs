//! `KvCellCache`: a `CellCache` plus one K/V pool per layer, indexed by the
//! cells of the table that layer reads (flat layers: the full table; ring
//! layers: the ring table). Pools reserve `n_cells` rows (see the memory
//! model in [`Pool`](super::Pool)); placement takes the lowest free cell, so
//! the pages written track the cells in use, and [`KvCellCache::trim`] gives
//! back the pages of cells freed since.

use super::{pool_faces, pool_spec, write_step, LayerPools, PoolMemory, Written};
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
    /// The layers the open step has written: only those have a spec.
    written: Written,
}

impl KvCellCache {
    pool_faces!(cells: CellCache);

    /// Pools in the memory [`PoolMemory::from_env`] names (a reservation by default).
    pub fn new(cfg: CacheConfig, n_cells: usize, n_seq_max: usize) -> Result<Self> {
        Self::with_memory(cfg, n_cells, n_seq_max, PoolMemory::from_env())
    }

    /// Pools in `memory` (`Grow` forces the fallback).
    pub fn with_memory(
        cfg: CacheConfig,
        n_cells: usize,
        n_seq_max: usize,
        memory: PoolMemory,
    ) -> Result<Self> {
        let cells = CellCache::new(cfg, n_cells, n_seq_max)?;
        let cfg = cells.config();
        // Every layer's pool is indexed by the cells of its table: n_cells deep.
        let pools = LayerPools::new(cfg, memory, |_, _| Ok(n_cells))?;
        let written = Written::new(cfg.n_layers);
        Ok(KvCellCache {
            cells,
            pools,
            written,
        })
    }

    /// Frees every cell, retires every id (see [`CellCache::clear`]) and
    /// gives the pools' pages back to the OS.
    pub fn clear(&mut self) {
        self.cells.clear();
        self.pools.release_all();
    }

    /// Gives back the whole pages of every layer's pool that no occupied
    /// cell of the layer's table touches (rows of freed cells read as zeros
    /// afterwards), and lowers each pool's high-water mark to its highest
    /// occupied cell. Changes no bookkeeping, so an open step stays open.
    /// O(n_cells x heads) per layer: call it after freeing sequences, not per
    /// step. A pool that grows by copying keeps its memory until `clear`.
    pub fn trim(&mut self) -> Result<()> {
        let mut by_table: Vec<Option<FreeRuns>> = vec![None; self.cells.n_tables()];
        for layer in 0..self.cells.config().n_layers {
            let table = self.cells.table_of(layer)?;
            let runs = match by_table.get_mut(table) {
                Some(Some(r)) => r,
                Some(slot) => slot.insert(self.cells.free_runs(table)?),
                None => continue,
            };
            let (free, used_end) = (&runs.0, runs.1);
            self.pools.get_mut(layer)?.release_runs(free, used_end);
        }
        Ok(())
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

    /// Writes the step's rows of `layer` to the tokens' cells, then builds
    /// what each token sees if `begin_step` did not.
    fn write_layer(&mut self, layer: usize, k_new: RowsIn<'_>, v_new: RowsIn<'_>) -> Result<()> {
        let plan = self.cells.plan(layer)?;
        let pool = self.pools.get_mut(layer)?;
        write_step(
            pool,
            k_new,
            v_new,
            plan.n_tokens(),
            plan.read_len(),
            cell_runs(plan.cells()),
        )?;
        self.cells.build_runs(layer)
    }

    /// The open step's spec for `layer`: its pool and what each token sees
    /// (built once per distinct policy per step, by `begin_step` or `update`).
    /// `StepProtocol` when no step is open, or when the open step has not
    /// written `layer` yet (`update` it first: its cells hold no rows of this
    /// step).
    pub fn spec(&self, layer: usize) -> Result<AttendSpec<'_>> {
        let plan = self.cells.plan(layer)?;
        self.written.check(layer, self.cells.generation())?;
        let (offsets, runs) = self.cells.runs(layer)?;
        let pool = self.pool(layer)?;
        if plan.read_len() > pool.rows() {
            return Err(CacheError::StepProtocol(format!(
                "spec: layer {layer} was not updated this step (read extent {} beyond its pool of {} rows)",
                plan.read_len(),
                pool.rows()
            )));
        }
        let keys = KeyLayout::Cells {
            offsets,
            runs,
            read_len: plan.read_len(),
        };
        Ok(pool_spec(pool, plan.positions(), keys))
    }

    /// The open step's dense mask for `layer` (`[T, read_len]`, 1 = visible).
    pub fn dense_mask(&mut self, layer: usize) -> Result<&[u8]> {
        self.cells.dense_mask(layer)
    }
}

/// A table's free cell runs `(first, count)` and one past its highest occupied cell.
type FreeRuns = (Vec<(usize, usize)>, usize);

/// `(first cell, count)` runs of consecutive tokens in consecutive cells, so
/// each run is one copy per head.
fn cell_runs(cells: &[u32]) -> impl Iterator<Item = (usize, usize)> + Clone + '_ {
    let mut i = 0usize;
    std::iter::from_fn(move || {
        let start = *cells.get(i)? as usize;
        let mut n = 1usize;
        while cells
            .get(i.saturating_add(n))
            .is_some_and(|&c| c as usize == start.saturating_add(n))
        {
            n = n.saturating_add(1);
        }
        i = i.saturating_add(n);
        Some((start, n))
    })
}
