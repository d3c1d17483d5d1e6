//! One layer's K and V pools: `[n_kv_heads, slots, head_dim]` f32, growing by
//! doubling from `initial_capacity` up to the layer's depth.

use std::sync::Arc;

use super::buffer::Buffer;
use crate::error::{CacheError, Result};

/// K and V storage of one layer.
#[derive(Debug)]
pub struct Pool {
    n_heads: usize,
    head_dim: usize,
    slots: usize,
    depth: usize,
    k: Arc<Buffer>,
    v: Arc<Buffer>,
}

impl Pool {
    /// A pool of `initial` slots (clamped to `depth`). Sizes are bounded by
    /// `CacheConfig::validate`, so the products below cannot overflow.
    // Sizes bounded by CacheConfig::validate: n_heads <= 2^12, slots <= depth <=
    // 2^31, head_dim <= 2^16, so n_heads * slots * head_dim < 2^59.
    #[allow(clippy::arithmetic_side_effects)]
    pub fn new(n_heads: usize, head_dim: usize, initial: usize, depth: usize) -> Result<Self> {
        let slots = initial.clamp(1, depth.max(1));
        let len = n_heads * slots * head_dim;
        Ok(Pool {
            n_heads,
            head_dim,
            slots,
            depth,
            k: Buffer::zeroed(len)?,
            v: Buffer::zeroed(len)?,
        })
    }

    pub fn slots(&self) -> usize {
        self.slots
    }

    pub fn depth(&self) -> usize {
        self.depth
    }

    pub fn n_heads(&self) -> usize {
        self.n_heads
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Bytes the K and V buffers hold.
    pub fn nbytes(&self) -> usize {
        self.k
            .len()
            .saturating_add(self.v.len())
            .saturating_mul(std::mem::size_of::<f32>())
    }

    pub fn k(&self) -> &[f32] {
        self.k.as_slice()
    }

    pub fn v(&self) -> &[f32] {
        self.v.as_slice()
    }

    /// The shared buffers, for views that must outlive growth and the cache.
    pub fn buffers(&self) -> (Arc<Buffer>, Arc<Buffer>) {
        (self.k.clone(), self.v.clone())
    }

    /// Grows (doubling, capped at the depth) until `needed` slots fit.
    /// Re-lays out every head, since the row stride widens.
    pub fn ensure(&mut self, needed: usize) -> Result<()> {
        if needed <= self.slots {
            return Ok(());
        }
        if needed > self.depth {
            return Err(CacheError::OutOfCapacity(format!(
                "pool: {needed} slots needed, depth is {}",
                self.depth
            )));
        }
        let mut slots = self.slots;
        while slots < needed {
            slots = slots.saturating_mul(2);
        }
        let slots = slots.min(self.depth);
        let row = self.head_dim;
        // Sizes bounded by CacheConfig::validate (see `new`): slots <= depth <= 2^31,
        // so every product below is < 2^59.
        #[allow(clippy::arithmetic_side_effects)]
        let (new_len, new_run, old_run) =
            (self.n_heads * slots * row, slots * row, self.slots * row);
        let relayout = |old: &Buffer| -> Result<Arc<Buffer>> {
            let new = Buffer::zeroed(new_len)?;
            let src = old.as_slice();
            // SAFETY: `new` was just allocated and is not shared yet.
            let dst = unsafe { std::slice::from_raw_parts_mut(new.as_mut_ptr(), new_len) };
            for (d, s) in dst.chunks_exact_mut(new_run).zip(src.chunks_exact(old_run)) {
                if let Some(d) = d.get_mut(..old_run) {
                    d.copy_from_slice(s);
                }
            }
            Ok(new)
        };
        // Both allocations succeed before either pool changes: a refused
        // growth leaves the pool as it was.
        let (k, v) = (relayout(&self.k)?, relayout(&self.v)?);
        self.k = k;
        self.v = v;
        self.slots = slots;
        Ok(())
    }

    /// Copies tokens `t0..t0+count` of `k_new`/`v_new` (`[n_heads, t_total, head_dim]`)
    /// into slots `slot..slot+count` of every head.
    pub fn write_rows(
        &mut self,
        k_new: &[f32],
        v_new: &[f32],
        t_total: usize,
        t0: usize,
        slot: usize,
        count: usize,
    ) -> Result<()> {
        let row = self.head_dim;
        let out_of_bounds = || {
            CacheError::InvalidArgument(format!(
                "pool write out of bounds: tokens {t0}+{count} of {t_total}, slots {slot}+{count} of {}",
                self.slots
            ))
        };
        let span = count.checked_mul(row).ok_or_else(out_of_bounds)?;
        let src_len = self
            .n_heads
            .checked_mul(t_total)
            .and_then(|x| x.checked_mul(row))
            .ok_or_else(out_of_bounds)?;
        if t0.checked_add(count).is_none_or(|e| e > t_total)
            || slot.checked_add(count).is_none_or(|e| e > self.slots)
            || k_new.len() != src_len
            || v_new.len() != k_new.len()
        {
            return Err(out_of_bounds());
        }
        for (buf, src) in [(&self.k, k_new), (&self.v, v_new)] {
            for h in 0..self.n_heads {
                // Bounded by the checks above: h < n_heads, t0 + count <= t_total and
                // n_heads * t_total * row == src.len(); slot + count <= slots and
                // n_heads * slots * row == buf.len() (bounded by CacheConfig::validate).
                #[allow(clippy::arithmetic_side_effects)]
                let (s0, d0) = ((h * t_total + t0) * row, (h * self.slots + slot) * row);
                #[allow(clippy::arithmetic_side_effects)]
                let from = src.get(s0..s0 + span).ok_or_else(|| {
                    CacheError::InvalidArgument("pool write: source too short".to_string())
                })?;
                // SAFETY: d0 + span <= n_heads * slots * row == buf.len() (checked
                // above); `&mut self` makes this the only writer, and Rust readers
                // borrow the pool. Python views may read concurrently; see Buffer.
                unsafe {
                    std::ptr::copy_nonoverlapping(from.as_ptr(), buf.as_mut_ptr().add(d0), span);
                }
            }
        }
        Ok(())
    }
}
