//! One layer's K and V pools: `[n_kv_heads, slots, row]` rows stored in the
//! config's dtypes (`row` = `dtype.row_bytes(head_dim)` bytes).
//!
//! **Memory model.** A pool reserves address space for its whole depth once
//! ([`PoolMemory::Reserve`]): `slots`, the row stride, is the depth from the
//! start, and the OS commits a page when a row on it is first written, so
//! growth never copies or moves a byte and a view keeps its address. `clear`
//! gives every page back and a cell cache's `trim` the pages of free cells.
//! Where the OS refuses the reservation (or `OFFGRAPH_KV_POOLS=grow` asks for
//! it) a pool falls back to [`PoolMemory::Grow`]: heap buffers doubling from
//! `initial_capacity` up to the depth, each growth a copy to a wider stride;
//! the refusal is said once on stderr, and [`Pool::memory`] tells which.
//!
//! A reservation commits each head's next page a little before a row reaches
//! it ([`Pool::write_rows_in`]), at a point that differs per head and pool:
//! otherwise every head of every layer would cross onto a fresh page in the
//! same decode step and that one step would pay all their page faults.
//!
//! Rows are reached through a small typed API ([`Pool::k`], [`Pool::k_row`],
//! [`Pool::write_rows_in`], ...), never by element arithmetic outside this file,
//! so every pool dtype shares one layout rule: head `h`'s row `s` starts at
//! byte `(h * slots + s) * row_bytes`.

use std::sync::{Arc, Once};

use super::buffer::Buffer;
use crate::dtype::{encode, KvDtype, KvRows, RowsIn};
use crate::error::{CacheError, Result};

/// How a pool holds its rows (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolMemory {
    /// The whole depth reserved once, pages committed as rows are written.
    Reserve,
    /// Heap buffers grown by doubling and copying (the fallback).
    Grow,
}

/// The environment variable that forces the fallback: `OFFGRAPH_KV_POOLS=grow`.
pub const POOLS_ENV: &str = "OFFGRAPH_KV_POOLS";

impl PoolMemory {
    /// What new pools ask for: [`PoolMemory::Grow`] when `OFFGRAPH_KV_POOLS`
    /// is `grow`, else [`PoolMemory::Reserve`].
    pub fn from_env() -> Self {
        match std::env::var(POOLS_ENV) {
            Ok(v) if v.eq_ignore_ascii_case("grow") => PoolMemory::Grow,
            _ => PoolMemory::Reserve,
        }
    }

    /// `"reserve"` or `"grow"`.
    pub fn name(self) -> &'static str {
        match self {
            PoolMemory::Reserve => "reserve",
            PoolMemory::Grow => "grow",
        }
    }
}

/// Says once per process that a reservation was refused.
fn say_refused(bytes: usize, why: &str) {
    static SAID: Once = Once::new();
    SAID.call_once(|| {
        eprintln!(
            "offgraph-kv: the OS refused to reserve {bytes} bytes for a K/V pool ({why}); \
             pools that cannot reserve their depth grow by doubling and copying instead"
        );
    });
}

/// K and V storage of one layer.
#[derive(Debug)]
pub struct Pool {
    n_heads: usize,
    head_dim: usize,
    /// The row stride: the depth for a reservation, the grown size otherwise.
    slots: usize,
    depth: usize,
    /// Rows written since the last clear: one past the highest (high-water).
    rows: usize,
    /// Slots a grown pool starts (and restarts after `clear`) with.
    initial: usize,
    memory: PoolMemory,
    k_dtype: KvDtype,
    v_dtype: KvDtype,
    k: Arc<Buffer>,
    v: Arc<Buffer>,
    /// One row widened to f32 (reused by every write).
    tmp: Vec<f32>,
    /// The OS page size (what `prefault_ahead` commits ahead).
    page: usize,
}

/// A 64-bit mix (splitmix64's finalizer): spreads each head's lead.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
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

    /// A pool storing K as `k_dtype` and V as `v_dtype`, in the memory
    /// [`PoolMemory::from_env`] names (see [`Pool::with_memory`]).
    pub fn with_dtypes(
        n_heads: usize,
        head_dim: usize,
        initial: usize,
        depth: usize,
        k_dtype: KvDtype,
        v_dtype: KvDtype,
    ) -> Result<Self> {
        Self::with_memory(
            n_heads,
            head_dim,
            initial,
            depth,
            k_dtype,
            v_dtype,
            PoolMemory::from_env(),
        )
    }

    /// A pool `depth` rows deep storing K as `k_dtype` and V as `v_dtype`.
    /// [`PoolMemory::Reserve`] reserves the depth (falling back to growth
    /// when the OS refuses); [`PoolMemory::Grow`] starts at `initial` slots
    /// (clamped to `depth`). `OutOfCapacity` when the depth's bytes overflow
    /// `usize` or an allocation is refused.
    pub fn with_memory(
        n_heads: usize,
        head_dim: usize,
        initial: usize,
        depth: usize,
        k_dtype: KvDtype,
        v_dtype: KvDtype,
        memory: PoolMemory,
    ) -> Result<Self> {
        k_dtype.check_head_dim(head_dim)?;
        v_dtype.check_head_dim(head_dim)?;
        let initial = initial.clamp(1, depth.max(1));
        let bytes = |slots: usize, dtype: KvDtype| {
            n_heads
                .checked_mul(slots)
                .and_then(|x| x.checked_mul(dtype.row_bytes(head_dim)))
                .ok_or_else(|| {
                    CacheError::OutOfCapacity(format!(
                        "pool: {n_heads} heads x {slots} rows of {head_dim} values overflow the address space"
                    ))
                })
        };
        // Checked for both memories: a grown pool may reach its depth.
        let (k_full, v_full) = (bytes(depth, k_dtype)?, bytes(depth, v_dtype)?);
        let mut pool = Pool {
            n_heads,
            head_dim,
            slots: initial,
            depth,
            rows: 0,
            initial,
            memory: PoolMemory::Grow,
            k_dtype,
            v_dtype,
            k: Buffer::zeroed(0)?,
            v: Buffer::zeroed(0)?,
            tmp: vec![0.0; head_dim],
            page: super::buffer::page_size().max(1),
        };
        if memory == PoolMemory::Reserve {
            match Buffer::reserve(k_full).and_then(|k| Ok((k, Buffer::reserve(v_full)?))) {
                Ok((k, v)) => {
                    pool.k = k;
                    pool.v = v;
                    pool.slots = depth.max(1);
                    pool.memory = PoolMemory::Reserve;
                    // Each head's first page now, so the first step does not
                    // fault them all at once (one page per head, as budgeted).
                    for side in [Side::K, Side::V] {
                        let run = pool.slots.saturating_mul(pool.row_bytes(side));
                        for h in 0..n_heads {
                            pool.buf(side).prefault(h.saturating_mul(run));
                        }
                    }
                    return Ok(pool);
                }
                Err(why) => say_refused(k_full.saturating_add(v_full), &why),
            }
        }
        pool.k = Buffer::zeroed(bytes(initial, k_dtype)?)?;
        pool.v = Buffer::zeroed(bytes(initial, v_dtype)?)?;
        Ok(pool)
    }

    /// How this pool holds its rows (a refused reservation reads `Grow`).
    pub fn memory(&self) -> PoolMemory {
        self.memory
    }

    /// Rows written since the last clear: one past the highest slot written
    /// or made room for (a cell cache's `trim` lowers it to its live cells).
    pub fn rows(&self) -> usize {
        self.rows
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

    /// Bytes the rows need at the high-water mark ([`Pool::rows`] rows of
    /// every head, K and V).
    pub fn nbytes(&self) -> usize {
        let row = self
            .row_bytes(Side::K)
            .saturating_add(self.row_bytes(Side::V));
        self.n_heads.saturating_mul(self.rows).saturating_mul(row)
    }

    /// Address space the K and V buffers hold: the whole depth for a
    /// reservation (committed only where written), the grown size otherwise.
    pub fn reserved_bytes(&self) -> usize {
        self.k.len().saturating_add(self.v.len())
    }

    /// Memory the K and V buffers hold now: a reservation's resident pages
    /// (those rows were written on, or committed ahead of a write, and not
    /// given back by `clear` or `trim`), a grown pool's whole buffers.
    pub fn committed_bytes(&self) -> usize {
        self.k
            .committed_bytes()
            .saturating_add(self.v.committed_bytes())
    }

    /// Gives every page back (the rows read as zeros); a grown pool returns
    /// to its initial size. Views keep their memory alive, and a view of a
    /// reservation reads the zeros and whatever later steps write.
    pub fn release_all(&mut self) {
        self.rows = 0;
        if self.memory == PoolMemory::Reserve {
            self.k.release(0, self.k.len());
            self.v.release(0, self.v.len());
            return;
        }
        if self.slots > self.initial {
            let (rk, rv) = (self.row_bytes(Side::K), self.row_bytes(Side::V));
            let len = |row: usize| {
                self.n_heads
                    .saturating_mul(self.initial)
                    .saturating_mul(row)
            };
            // A refused allocation keeps the grown buffers: clear cannot fail.
            if let (Ok(k), Ok(v)) = (Buffer::zeroed(len(rk)), Buffer::zeroed(len(rv))) {
                self.k = k;
                self.v = v;
                self.slots = self.initial;
            }
        }
    }

    /// Gives back the whole pages that lie inside the given `(first slot,
    /// count)` runs of every head (rows nothing holds), and lowers the
    /// high-water mark to `rows` if below it. A grown pool keeps its memory.
    pub fn release_runs(&mut self, runs: &[(usize, usize)], rows: usize) {
        self.rows = self.rows.min(rows);
        if self.memory != PoolMemory::Reserve {
            return;
        }
        for side in [Side::K, Side::V] {
            let rb = self.row_bytes(side);
            let buf = self.buf(side);
            for h in 0..self.n_heads {
                let head = h.saturating_mul(self.slots);
                for &(start, n) in runs {
                    let a = head.saturating_add(start).saturating_mul(rb);
                    let b = head
                        .saturating_add(start.saturating_add(n).min(self.slots))
                        .saturating_mul(rb);
                    buf.release(a, b);
                }
            }
        }
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
        self.rows = self.rows.max(slot.saturating_add(1));
        Ok(())
    }

    /// The shared buffers, for views that must outlive growth and the cache.
    pub fn buffers(&self) -> (Arc<Buffer>, Arc<Buffer>) {
        (self.k.clone(), self.v.clone())
    }

    /// Makes room for `needed` rows (raising the high-water mark). A
    /// reservation has room for its depth already; a grown pool doubles
    /// (capped at the depth) until `needed` slots fit, re-laying out every
    /// head since the row stride widens.
    pub fn ensure(&mut self, needed: usize) -> Result<()> {
        if needed <= self.rows {
            return Ok(());
        }
        if needed > self.depth {
            return Err(CacheError::OutOfCapacity(format!(
                "pool: {needed} slots needed, depth is {}",
                self.depth
            )));
        }
        if needed > self.slots {
            self.grow(needed)?;
        }
        self.rows = needed;
        Ok(())
    }

    /// Grows a heap pool to fit `needed` (<= depth) slots.
    fn grow(&mut self, needed: usize) -> Result<()> {
        let mut slots = self.slots;
        while slots < needed {
            slots = slots.saturating_mul(2);
        }
        let slots = slots.min(self.depth);
        let n_heads = self.n_heads;
        let old_slots = self.slots;
        // slots <= depth, and n_heads * depth * row was checked by `with_memory`.
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

    /// Commits the page after head `h`'s rows `slot..slot + count` once the
    /// write comes within this head's lead of it (a lead below a page, spread
    /// over heads and pools by a hash of the buffer's address), so page faults
    /// are paid a few per step rather than all heads at once. Exact for
    /// rows written in order; anything else at worst commits one page early.
    fn prefault_ahead(&self, side: Side, buf: &Buffer, h: usize, slot: usize, count: usize) {
        if self.memory != PoolMemory::Reserve || count == 0 {
            return;
        }
        let page = self.page;
        let rb = self.row_bytes(side);
        let key = (buf.as_ptr() as u64) ^ ((h as u64) << 1) ^ u64::from(side == Side::V);
        // 1..=page bytes: a lead of 0 would never commit ahead.
        let lead = mix(key)
            .checked_rem(page as u64)
            .and_then(|x| usize::try_from(x).ok())
            .unwrap_or(0)
            .saturating_add(1);
        let head = h.saturating_mul(self.slots).saturating_mul(rb);
        let end = head.saturating_add(self.slots.saturating_mul(rb));
        let a = head.saturating_add(slot.saturating_mul(rb));
        let b = head.saturating_add(slot.saturating_add(count).saturating_mul(rb));
        let next = b.div_ceil(page).saturating_mul(page);
        // The lead reaches the next page in this write and did not before it.
        if a.saturating_add(lead) <= next && next < b.saturating_add(lead) && next < end {
            buf.prefault(next);
        }
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
                self.prefault_ahead(side, &buf, h, slot, count);
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
        self.rows = self.rows.max(slot.saturating_add(count));
        Ok(())
    }
}
