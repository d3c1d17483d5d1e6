//! One layer's K and V pools: `[n_kv_heads, slots, row]` rows stored in the
//! config's dtypes (`row` = `dtype.row_bytes(head_dim)` bytes), growing by
//! doubling from `initial_capacity` up to the layer's depth.
//!
//! Rows are reached through a small typed API ([`Pool::k`], [`Pool::k_row`],
//! [`Pool::write_rows_in`], ...), never by element arithmetic outside this file,
//! so every pool dtype shares one layout rule: head `h`'s row `s` starts at
//! byte `(h * slots + s) * row_bytes`.

use std::sync::Arc;

use super::buffer::Buffer;
use crate::dtype::{encode, KvDtype, KvRows, RowsIn};
use crate::error::{CacheError, Result};

/// K and V storage of one layer.
#[derive(Debug)]
pub struct Pool {
    n_heads: usize,
    head_dim: usize,
    slots: usize,
    depth: usize,
    k_dtype: KvDtype,
    v_dtype: KvDtype,
    k: Arc<Buffer>,
    v: Arc<Buffer>,
    /// One row widened to f32 (reused by every write).
    tmp: Vec<f32>,
}

/// Which of a layer's two pools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    K,
    V,
}

impl Pool {
    /// A float32 pool of `initial` slots (clamped to `depth`).
    pub fn new(n_heads: usize, head_dim: usize, initial: usize, depth: usize) -> Result<Self> {
        Self::with_dtypes(
            n_heads,
            head_dim,
            initial,
            depth,
            KvDtype::Float32,
            KvDtype::Float32,
        )
    }

    /// A pool of `initial` slots (clamped to `depth`) storing K as `k_dtype`
    /// and V as `v_dtype`. Sizes are bounded by `CacheConfig::validate`, so
    /// the products below cannot overflow.
    // Sizes bounded by CacheConfig::validate: n_heads <= 2^12, slots <= depth <=
    // 2^31, row bytes <= 4 * 2^16, so n_heads * slots * row < 2^61.
    #[allow(clippy::arithmetic_side_effects)]
    pub fn with_dtypes(
        n_heads: usize,
        head_dim: usize,
        initial: usize,
        depth: usize,
        k_dtype: KvDtype,
        v_dtype: KvDtype,
    ) -> Result<Self> {
        k_dtype.check_head_dim(head_dim)?;
        v_dtype.check_head_dim(head_dim)?;
        let slots = initial.clamp(1, depth.max(1));
        Ok(Pool {
            n_heads,
            head_dim,
            slots,
            depth,
            k_dtype,
            v_dtype,
            k: Buffer::zeroed(n_heads * slots * k_dtype.row_bytes(head_dim))?,
            v: Buffer::zeroed(n_heads * slots * v_dtype.row_bytes(head_dim))?,
            tmp: vec![0.0; head_dim],
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

    pub fn k_dtype(&self) -> KvDtype {
        self.k_dtype
    }

    pub fn v_dtype(&self) -> KvDtype {
        self.v_dtype
    }

    /// The storage type of one side.
    pub fn dtype(&self, side: Side) -> KvDtype {
        match side {
            Side::K => self.k_dtype,
            Side::V => self.v_dtype,
        }
    }

    /// Bytes one stored row of `side` takes.
    pub fn row_bytes(&self, side: Side) -> usize {
        self.dtype(side).row_bytes(self.head_dim)
    }

    /// Bytes the K and V buffers hold.
    pub fn nbytes(&self) -> usize {
        self.k.len().saturating_add(self.v.len())
    }

    /// The whole K pool as stored.
    pub fn k(&self) -> KvRows<'_> {
        KvRows {
            dtype: self.k_dtype,
            bytes: self.k.as_bytes(),
        }
    }

    /// The whole V pool as stored.
    pub fn v(&self) -> KvRows<'_> {
        KvRows {
            dtype: self.v_dtype,
            bytes: self.v.as_bytes(),
        }
    }

    fn buf(&self, side: Side) -> &Arc<Buffer> {
        match side {
            Side::K => &self.k,
            Side::V => &self.v,
        }
    }

    /// Byte range of head `head`'s row `slot`, `None` when out of range.
    fn row_range(&self, side: Side, head: usize, slot: usize) -> Option<std::ops::Range<usize>> {
        if head >= self.n_heads || slot >= self.slots {
            return None;
        }
        let rb = self.row_bytes(side);
        let start = head
            .checked_mul(self.slots)?
            .checked_add(slot)?
            .checked_mul(rb)?;
        Some(start..start.checked_add(rb)?)
    }

    /// The stored bytes of head `head`'s row `slot` of `side`; `None` out of range.
    pub fn row(&self, side: Side, head: usize, slot: usize) -> Option<&[u8]> {
        let r = self.row_range(side, head, slot)?;
        self.buf(side).as_bytes().get(r)
    }

    /// The stored K row (head, slot).
    pub fn k_row(&self, head: usize, slot: usize) -> Option<&[u8]> {
        self.row(Side::K, head, slot)
    }

    /// The stored V row (head, slot).
    pub fn v_row(&self, head: usize, slot: usize) -> Option<&[u8]> {
        self.row(Side::V, head, slot)
    }

    /// Overwrites one stored row with `bytes` as stored (a snapshot's rows);
    /// `InvalidArgument` when out of range or of the wrong length.
    pub fn set_row(&mut self, side: Side, head: usize, slot: usize, bytes: &[u8]) -> Result<()> {
        let r = self
            .row_range(side, head, slot)
            .filter(|r| r.len() == bytes.len() && r.end <= self.buf(side).len())
            .ok_or_else(|| {
                CacheError::InvalidArgument(format!(
                    "pool row ({head}, {slot}): expected head < {}, slot < {} and {} bytes, got {} bytes",
                    self.n_heads,
                    self.slots,
                    self.row_bytes(side),
                    bytes.len()
                ))
            })?;
        let buf = self.buf(side);
        // SAFETY: r lies inside the buffer (checked above); `&mut self` makes this
        // the only writer; `bytes` cannot alias the pool (it is borrowed while
        // `self` is borrowed mutably).
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf.as_mut_ptr().add(r.start), r.len());
        }
        Ok(())
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
        let n_heads = self.n_heads;
        let old_slots = self.slots;
        // Sizes bounded by CacheConfig::validate (see `with_dtypes`).
        #[allow(clippy::arithmetic_side_effects)]
        let relayout = |old: &Buffer, row: usize| -> Result<Arc<Buffer>> {
            let (new_len, new_run, old_run) = (n_heads * slots * row, slots * row, old_slots * row);
            let new = Buffer::zeroed(new_len)?;
            if new_run == 0 || old_run == 0 {
                return Ok(new);
            }
            let src = old.as_bytes();
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
        let k = relayout(&self.k, self.row_bytes(Side::K))?;
        let v = relayout(&self.v, self.row_bytes(Side::V))?;
        self.k = k;
        self.v = v;
        self.slots = slots;
        Ok(())
    }

    /// Copies tokens `t0..t0+count` of float32 `k_new`/`v_new`
    /// (`[n_heads, t_total, head_dim]`) into slots `slot..slot+count` of every head.
    pub fn write_rows(
        &mut self,
        k_new: &[f32],
        v_new: &[f32],
        t_total: usize,
        t0: usize,
        slot: usize,
        count: usize,
    ) -> Result<()> {
        self.write_rows_in(
            RowsIn::F32(k_new),
            RowsIn::F32(v_new),
            t_total,
            t0,
            slot,
            count,
        )
    }

    /// Like [`Pool::write_rows`] for rows in any input type: each row is
    /// widened exactly to f32 and rounded once into the pool's dtype.
    pub fn write_rows_in(
        &mut self,
        k_new: RowsIn<'_>,
        v_new: RowsIn<'_>,
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
        let src_len = self
            .n_heads
            .checked_mul(t_total)
            .and_then(|x| x.checked_mul(row))
            .ok_or_else(out_of_bounds)?;
        if t0.checked_add(count).is_none_or(|e| e > t_total)
            || slot.checked_add(count).is_none_or(|e| e > self.slots)
            || k_new.len() != src_len
            || v_new.len() != src_len
        {
            return Err(out_of_bounds());
        }
        for (side, src) in [(Side::K, k_new), (Side::V, v_new)] {
            let dtype = self.dtype(side);
            let rb = self.row_bytes(side);
            let buf = self.buf(side).clone();
            for h in 0..self.n_heads {
                for i in 0..count {
                    // Bounded by the checks above: h < n_heads, t0 + count <= t_total,
                    // n_heads * t_total * row == src.len(); slot + count <= slots.
                    #[allow(clippy::arithmetic_side_effects)]
                    let (s0, d0) = (
                        (h * t_total + t0 + i) * row,
                        (h * self.slots + slot + i) * rb,
                    );
                    if d0.checked_add(rb).is_none_or(|e| e > buf.len()) {
                        return Err(out_of_bounds());
                    }
                    // SAFETY: [d0, d0 + rb) lies inside the buffer (checked above);
                    // `&mut self` makes this the only writer and Rust readers borrow
                    // the pool. Python views may read concurrently; see Buffer.
                    let dst =
                        unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().add(d0), rb) };
                    let done = match (src, dtype) {
                        // The common float32 case is a plain copy.
                        (RowsIn::F32(s), KvDtype::Float32) => {
                            #[allow(clippy::arithmetic_side_effects)]
                            let from = s.get(s0..s0 + row).ok_or_else(out_of_bounds)?;
                            encode(KvDtype::Float32, from, dst)
                        }
                        _ => src.widen(s0, &mut self.tmp) && encode(dtype, &self.tmp, dst),
                    };
                    if !done {
                        return Err(out_of_bounds());
                    }
                }
            }
        }
        Ok(())
    }
}
