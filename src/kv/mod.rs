//! The byte layer: per-layer K/V pools behind the neutral caches.
//!
//! It knows bytes, never policy: where rows go comes from the neutral layer's
//! plans. Allocation happens only when a pool grows, never per step.

mod buffer;
mod cell;
mod pool;
mod pools;
mod seq;
pub mod snapshot;

pub use buffer::Buffer;
pub use cell::KvCellCache;
pub use pool::{Pool, Side};
pub use pools::LayerPools;
pub use seq::KvSequenceCache;

use crate::dtype::RowsIn;
use crate::error::{CacheError, Result};

/// Checks that `k_new`/`v_new` hold `[n_heads, n_tokens, head_dim]` values.
pub(crate) fn check_rows(
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
