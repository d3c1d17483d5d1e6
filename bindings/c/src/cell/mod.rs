//! `okv_cell_cache` (CellCache: many sequences in one pool of cells) and
//! `okv_kv_cell_cache` (KvCellCache: the same plus K/V pools): batch verbs,
//! step, plan, update, attend.
//!
//! The two handle kinds share every bookkeeping verb: [`verbs`] writes each
//! once over [`CellFace`], and the two export files only name them for C.
//!
//! Thread-safety: as for the sequence caches, calls on one handle must not
//! overlap (`OKV_ERR_BUSY`). Pointers in an `okv_cell_plan`, a dense mask or
//! an `okv_pool_view` stay valid until the next mutating call on that cache
//! (`_begin_step`, `_update`, any batch verb, `_clear`, `_free`).

use std::sync::Mutex;

use offgraph_kv::{CellCache, KvCellCache};

use crate::handle::{opaque, Opaque};

mod cache;
mod kv_cache;
mod verbs;

pub use cache::*;
pub use kv_cache::*;

/// "No bound": `upto` of `_seq_clone` and `p1` of `_seq_rm`. The header
/// spells it `SIZE_MAX` (cbindgen cannot evaluate `usize::MAX`).
///
/// cbindgen:ignore
pub const OKV_NONE: usize = usize::MAX;

/// One layer's view of the open cell step. The pointers borrow the cache:
/// valid until its next mutating call.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct okv_cell_plan {
    pub n_tokens: usize,
    /// `n_tokens` entries: the cell each token writes, in this layer's table.
    pub cells: *const u32,
    /// `n_tokens` entries: each token's position.
    pub positions: *const usize,
    /// Cells [0, read_len) bound what any token reads in this layer's table.
    pub read_len: usize,
    /// The ring window of the layer (0 for a flat layer).
    pub window: usize,
    /// The cell table this layer's pools are indexed by (0 or 1).
    pub table: usize,
}

/// Many sequences' bookkeeping (opaque).
pub struct okv_cell_cache {
    magic: u64,
    inner: Mutex<CellCache>,
}
opaque!(
    okv_cell_cache,
    CellCache,
    OKV_HANDLE_CELL_CACHE,
    0x6f6b_765f_6365_6c04
);

/// Many sequences' bookkeeping and K/V pools (opaque).
pub struct okv_kv_cell_cache {
    magic: u64,
    inner: Mutex<KvCellCache>,
}
opaque!(
    okv_kv_cell_cache,
    KvCellCache,
    OKV_HANDLE_KV_CELL_CACHE,
    0x6f6b_765f_6b76_6305
);

/// The bookkeeping both cell caches share (batch verbs never move bytes).
pub(crate) trait CellFace {
    fn cells(&self) -> &CellCache;
    fn cells_mut(&mut self) -> &mut CellCache;
    /// Frees every cell; a cache with pools also gives their pages back.
    fn clear(&mut self) {
        self.cells_mut().clear()
    }
}

/// A handle holding either cell cache: the bound every verb takes.
pub(crate) trait CellHandle: Opaque<Inner: CellFace> {}
impl<H: Opaque<Inner: CellFace>> CellHandle for H {}

impl CellFace for CellCache {
    fn cells(&self) -> &CellCache {
        self
    }
    fn cells_mut(&mut self) -> &mut CellCache {
        self
    }
}

impl CellFace for KvCellCache {
    fn cells(&self) -> &CellCache {
        KvCellCache::cells(self)
    }
    fn cells_mut(&mut self) -> &mut CellCache {
        KvCellCache::cells_mut(self)
    }
    fn clear(&mut self) {
        KvCellCache::clear(self)
    }
}
