//! The byte layer: per-layer K/V pools behind the neutral caches.
//!
//! It knows bytes, never policy: where rows go comes from the neutral layer's
//! plans. Pools reserve their depth once and the OS commits pages as rows are
//! written (see [`pool`](Pool) for the memory model and its fallback), so no
//! step allocates or copies for another's growth.

mod buffer;
mod cell;
mod pool;
mod pools;
mod seq;
pub mod snapshot;
mod written;

pub use buffer::Buffer;
pub use cell::KvCellCache;
pub use pool::{Pool, PoolMemory, Side, POOLS_ENV};
pub use pools::LayerPools;
pub use seq::KvSequenceCache;

use crate::dtype::RowsIn;
use crate::error::{CacheError, Result};
use crate::spec::{AttendSpec, KeyLayout};
use written::Written;

/// The faces both byte-layer caches show alike: config and generation from
/// the bookkeeping in field `$book` (of type `$Book`), the pools and their
/// bytes, and `update`/`update_rows` over the type's own `write_layer` (the
/// rows' placement) and `spec`.
macro_rules! pool_faces {
    ($book:ident: $Book:ty) => {
        pub fn config(&self) -> &$crate::config::CacheConfig {
            self.$book.config()
        }

        pub fn generation(&self) -> u64 {
            self.$book.generation()
        }

        pub fn pool(&self, layer: usize) -> $crate::error::Result<&$crate::kv::Pool> {
            self.pools.get(layer)
        }

        /// Bookkeeping and pools together, for snapshots (`kv::snapshot`).
        pub(crate) fn parts_mut(&mut self) -> (&mut $Book, &mut $crate::kv::LayerPools) {
            (&mut self.$book, &mut self.pools)
        }

        /// Bytes the rows of `layer`'s pools need at the high-water mark.
        pub fn nbytes(&self, layer: usize) -> $crate::error::Result<usize> {
            self.pools.nbytes(layer)
        }

        /// Bytes the rows of all pools need at their high-water marks.
        pub fn nbytes_total(&self) -> usize {
            self.pools.nbytes_total()
        }

        /// Address space all pools hold: their whole depth when reserved
        /// (committed only where rows were written), else the grown buffers.
        pub fn reserved_bytes(&self) -> usize {
            self.pools.reserved_bytes_total()
        }

        /// Memory all pools hold now: the resident pages of reserved pools
        /// (rows written and not given back by `clear`/`trim`), the whole
        /// buffers of grown ones. At most [`Self::reserved_bytes`].
        pub fn committed_bytes(&self) -> usize {
            self.pools.committed_bytes_total()
        }

        /// How the pools hold their rows: `Reserve` unless a reservation
        /// was refused or the fallback asked for (`OFFGRAPH_KV_POOLS=grow`).
        pub fn pool_memory(&self) -> $crate::kv::PoolMemory {
            self.pools.memory()
        }

        /// [`Self::update`] with rows in any input type ([`RowsIn`](crate::RowsIn):
        /// float32, float16 or bfloat16 bits), each rounded once into the pool's dtype.
        pub fn update_rows(
            &mut self,
            layer: usize,
            k_new: $crate::dtype::RowsIn<'_>,
            v_new: $crate::dtype::RowsIn<'_>,
        ) -> $crate::error::Result<$crate::spec::AttendSpec<'_>> {
            self.write_layer(layer, k_new, v_new)?;
            let generation = self.generation();
            self.written.mark(layer, generation);
            self.spec(layer)
        }

        /// Writes the open step's rows of `layer` (`k_new`, `v_new`:
        /// `[n_kv_heads, n_tokens, head_dim]`, row-major) where the step's plan
        /// puts them and returns the layer's spec. Refused calls write nothing.
        pub fn update(
            &mut self,
            layer: usize,
            k_new: &[f32],
            v_new: &[f32],
        ) -> $crate::error::Result<$crate::spec::AttendSpec<'_>> {
            self.update_rows(
                layer,
                $crate::dtype::RowsIn::F32(k_new),
                $crate::dtype::RowsIn::F32(v_new),
            )
        }
    };
}
use pool_faces;

/// The spec over `pool` for a step's query `positions` and `keys`.
fn pool_spec<'a>(pool: &'a Pool, positions: &'a [usize], keys: KeyLayout<'a>) -> AttendSpec<'a> {
    AttendSpec {
        k: pool.k(),
        v: pool.v(),
        n_kv_heads: pool.n_heads(),
        head_dim: pool.head_dim(),
        slots: pool.slots(),
        positions,
        keys,
    }
}

/// Writes a step's `n_tokens` rows to `pool`: `runs` are `(first slot, count)`
/// in token order, covering the tokens once. The pool first grows to hold every
/// run and at least `min_rows` rows. Checks the shapes before writing anything.
fn write_step<I>(
    pool: &mut Pool,
    k_new: RowsIn<'_>,
    v_new: RowsIn<'_>,
    n_tokens: usize,
    min_rows: usize,
    runs: I,
) -> Result<()>
where
    I: Iterator<Item = (usize, usize)> + Clone,
{
    check_rows(&k_new, &v_new, pool.n_heads(), n_tokens, pool.head_dim())?;
    let needed = runs
        .clone()
        .map(|(start, n)| start.saturating_add(n))
        .max()
        .unwrap_or(0);
    pool.ensure(needed.max(min_rows))?;
    let mut t0 = 0;
    for (start, n) in runs {
        pool.write_rows_in(k_new, v_new, n_tokens, t0, start, n)?;
        t0 = t0.saturating_add(n);
    }
    Ok(())
}

/// Checks that `k_new`/`v_new` hold `[n_heads, n_tokens, head_dim]` values.
fn check_rows(
    k_new: &RowsIn<'_>,
    v_new: &RowsIn<'_>,
    n_heads: usize,
    n_tokens: usize,
    head_dim: usize,
) -> Result<()> {
    let want = n_heads
        .checked_mul(n_tokens)
        .and_then(|x| x.checked_mul(head_dim))
        .ok_or_else(|| {
            CacheError::Shape(format!(
                "[{n_heads}, {n_tokens}, {head_dim}] rows: the size overflows"
            ))
        })?;
    for (name, got) in [("k_new", k_new.len()), ("v_new", v_new.len())] {
        if got != want {
            return Err(CacheError::Shape(format!(
                "{name}: expected {want} values ([{n_heads}, {n_tokens}, {head_dim}]), got {got}"
            )));
        }
    }
    Ok(())
}
