//! Snapshots for C: a sequence's K/V out of a cache as bytes and back, the
//! same bytes the Rust and Python faces write (one format, `offgraph_kv`'s
//! `kv::snapshot`), so C and Python processes exchange them.
//!
//! Saving follows the header's buffer convention: the caller passes a buffer
//! of `cap` bytes; when the snapshot does not fit, the call returns
//! `OKV_ERR_BUFFER_TOO_SMALL`, writes the size needed to `*out_len` and leaves
//! the buffer untouched (a first call with `cap` 0 and a NULL buffer is the
//! size query). Each call builds the snapshot anew, so a size query followed
//! by a save costs two encodings; the cache is never changed by a save.

use offgraph_kv::kv::Pool;
use offgraph_kv::{KvCellCache, KvSequenceCache};

use crate::cell::{okv_kv_cell_cache, OKV_NONE};
use crate::handle::{lock, Opaque};
use crate::ptr::{out, overlaps, slice, slice_mut, span, span_of, Out};
use crate::sequence::okv_kv_seq_cache;
use crate::status::{fail, guard, okv_status, Fail, R};

/// The pools of a cache, for the overlap checks.
trait Pools {
    fn n_layers(&self) -> usize;
    fn pool_of(&self, layer: usize) -> Option<&Pool>;
}
impl Pools for KvSequenceCache {
    fn n_layers(&self) -> usize {
        self.config().n_layers
    }
    fn pool_of(&self, layer: usize) -> Option<&Pool> {
        self.pool(layer).ok()
    }
}
impl Pools for KvCellCache {
    fn n_layers(&self) -> usize {
        self.config().n_layers
    }
    fn pool_of(&self, layer: usize) -> Option<&Pool> {
        self.pool(layer).ok()
    }
}

/// Refuses a caller's buffer that shares memory with the cache's pools.
fn apart_from_pools(c: &impl Pools, buf: (usize, usize), what: &str) -> R<()> {
    for l in 0..c.n_layers() {
        if let Some(p) = c.pool_of(l) {
            if overlaps(buf, span_of(p.k().bytes)) || overlaps(buf, span_of(p.v().bytes)) {
                return Err(fail(
                    okv_status::OKV_ERR_INVALID_ARGUMENT,
                    format!("{what}: the buffer overlaps the cache's own pools"),
                ));
            }
        }
    }
    Ok(())
}

/// Copies `data` into the caller's buffer, or reports the size needed.
unsafe fn deliver(data: &[u8], buf: *mut u8, cap: usize, o: Out<usize>, what: &str) -> R<()> {
    if data.len() > cap {
        o.set(data.len());
        return Err(fail(
            okv_status::OKV_ERR_BUFFER_TOO_SMALL,
            format!(
                "{what}: the snapshot takes {} bytes, the buffer holds {cap}",
                data.len()
            ),
        ));
    }
    let dst = unsafe { slice_mut(buf, data.len(), "buf") }.map_err(|f| f.within(what))?;
    dst.copy_from_slice(data);
    o.set(data.len());
    Ok(())
}

/// The save body both caches share: check the outputs and the buffer, build
/// the snapshot with `make`, deliver it.
unsafe fn save<H: Opaque>(
    h: *const H,
    (buf, cap): (*mut u8, usize),
    out_len: *mut usize,
    what: &str,
    make: impl FnOnce(&H::Inner) -> offgraph_kv::Result<Vec<u8>>,
) -> R<()>
where
    H::Inner: Pools,
{
    let o = out(out_len, what)?;
    let c = unsafe { lock(h, what) }?;
    apart_from_pools(&*c, span(buf as *const u8, cap), what)?;
    let data = make(&c).map_err(|e| Fail::from(e).within(what))?;
    unsafe { deliver(&data, buf, cap, o, what) }
}

/// The load body both caches share: the caller's bytes, apart from the pools.
unsafe fn load<H: Opaque, T>(
    h: *const H,
    (data, len): (*const u8, usize),
    what: &str,
    f: impl FnOnce(&mut H::Inner, &[u8]) -> offgraph_kv::Result<T>,
) -> R<T>
where
    H::Inner: Pools,
{
    let mut c = unsafe { lock(h, what) }?;
    apart_from_pools(&*c, span(data, len), what)?;
    let bytes = unsafe { slice(data, len, "data") }.map_err(|f| f.within(what))?;
    f(&mut c, bytes).map_err(|e| Fail::from(e).within(what))
}

/// A snapshot of the sequence's positions into `buf` (room for `cap` bytes);
/// `*out_len` gets its size. `upto` is one past the last position
/// (`OKV_NONE`: the length). `start` is `OKV_NONE` for a whole state, positions
/// `[0, upto)`, that `okv_kv_seq_cache_load_state` restores into an empty cache
/// (refused when a ring layer no longer holds the tail `upto` needs); a
/// position makes a range `[start, upto)` (a prefix chunk) that continues a
/// cache whose length is `start`, as Python's `save_state(upto, start=start)`.
/// The bytes equal those of Python's `KvSequenceCache.save_state` and Rust's
/// `save_state` / `save_range` for the same state. Take it between steps: a
/// step whose layers are not all updated holds unwritten rows.
///
/// Statuses: `OKV_ERR_BUFFER_TOO_SMALL` when the snapshot takes more than
/// `cap` bytes (`*out_len` is then the size needed, `buf` untouched; `buf` may
/// be NULL when `cap` is 0); `OKV_ERR_INVALID_ARGUMENT` when `[start, upto)`
/// is not within the length, when a whole state's ring tail was overwritten,
/// or when `buf` overlaps the pools; `OKV_ERR_NULL_POINTER` for a NULL
/// `out_len`, or a NULL `buf` with the snapshot fitting in a nonzero `cap`.
/// The cache never changes.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_seq_cache_save_state(
    cache: *const okv_kv_seq_cache,
    start: usize,
    upto: usize,
    buf: *mut u8,
    cap: usize,
    out_len: *mut usize,
) -> okv_status {
    guard(|| unsafe {
        save(
            cache,
            (buf, cap),
            out_len,
            "okv_kv_seq_cache_save_state",
            |c| {
                let upto = (upto != OKV_NONE).then_some(upto);
                match start {
                    OKV_NONE => c.save_state(upto),
                    s => c.save_range(s, upto.unwrap_or(c.length())),
                }
            },
        )
    })
}

/// Restores a snapshot of `len` bytes at `data` (a whole state into an empty
/// cache, or a range starting at this cache's length). All or nothing.
///
/// Statuses: `OKV_ERR_SNAPSHOT` for data that is truncated, damaged (checksum),
/// foreign (another layout or dtype, a cell snapshot), of a newer format,
/// incomplete alone, or that does not start at this cache's length or ends
/// beyond its capacity; `OKV_ERR_INVALID_ARGUMENT` when `data` overlaps the
/// pools; `OKV_ERR_NULL_POINTER` for NULL `data` with a nonzero `len`. On a
/// refusal the cache's state is unchanged (its pools may have grown).
#[no_mangle]
pub unsafe extern "C" fn okv_kv_seq_cache_load_state(
    cache: *mut okv_kv_seq_cache,
    data: *const u8,
    len: usize,
) -> okv_status {
    guard(|| unsafe {
        load(cache, (data, len), "okv_kv_seq_cache_load_state", |c, b| {
            c.load_state(b)
        })
    })
}

/// Restores a chain of `n` ranges (`data[i]`, `lens[i]` bytes each), the first
/// starting at this cache's length and each starting where the previous ends,
/// as one all-or-nothing load (prefix chunks saved with a `start`).
///
/// Statuses: as `okv_kv_seq_cache_load_state` (the message names the chain
/// member), and `OKV_ERR_SNAPSHOT` for an empty chain or members that do not
/// continue each other.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_seq_cache_load_states(
    cache: *mut okv_kv_seq_cache,
    data: *const *const u8,
    lens: *const usize,
    n: usize,
) -> okv_status {
    guard(|| unsafe {
        let what = "okv_kv_seq_cache_load_states";
        let ptrs = slice(data, n, "data").map_err(|f| f.within(what))?;
        let lens = slice(lens, n, "lens").map_err(|f| f.within(what))?;
        let mut c = lock(cache, what)?;
        let mut chain = Vec::with_capacity(n);
        for (i, (&p, &l)) in ptrs.iter().zip(lens).enumerate() {
            apart_from_pools(&*c, span(p, l), what)?;
            chain.push(slice(p, l, &format!("data[{i}]")).map_err(|f| f.within(what))?);
        }
        c.load_states(&chain)
            .map_err(|e| Fail::from(e).within(what))
    })
}

/// A snapshot of sequence `seq`'s positions below `upto` (`OKV_NONE`: all)
/// into `buf` (room for `cap` bytes); `*out_len` gets its size. It restores as
/// a new sequence with `okv_kv_cell_cache_load_seq`, here or in another cache
/// of the same layout and dtypes. The bytes equal Python's `save_seq`.
///
/// Statuses: `OKV_ERR_BUFFER_TOO_SMALL` (as `okv_kv_seq_cache_save_state`);
/// `OKV_ERR_UNKNOWN_SEQUENCE` when `seq` is not live in this cache;
/// `OKV_ERR_INVALID_ARGUMENT` when the ring table already dropped a position
/// the next step after `upto` needs, or `buf` overlaps the pools. The cache
/// never changes.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_cell_cache_save_seq(
    cache: *const okv_kv_cell_cache,
    seq: u64,
    upto: usize,
    buf: *mut u8,
    cap: usize,
    out_len: *mut usize,
) -> okv_status {
    guard(|| unsafe {
        let what = "okv_kv_cell_cache_save_seq";
        let id = crate::ids::from_c(seq, what)?;
        save(cache, (buf, cap), out_len, what, |c| {
            c.save_seq(id, (upto != OKV_NONE).then_some(upto))
        })
    })
}

/// Restores a `okv_kv_cell_cache_save_seq` snapshot of `len` bytes as a new
/// sequence; `*out_seq` gets its id. All or nothing.
///
/// Statuses: `OKV_ERR_SNAPSHOT` for data that is truncated, damaged, foreign
/// (another layout or dtype, a sequence-cache snapshot) or of a newer format;
/// `OKV_ERR_OUT_OF_CAPACITY` when the free cells (fewer than the sequence
/// holds, or than this cache has at all) or sequence ids do not suffice;
/// `OKV_ERR_INVALID_ARGUMENT` when `data` overlaps the pools. On a refusal the
/// cache's state is unchanged and `*out_seq` is not written.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_cell_cache_load_seq(
    cache: *mut okv_kv_cell_cache,
    data: *const u8,
    len: usize,
    out_seq: *mut u64,
) -> okv_status {
    guard(|| unsafe {
        let what = "okv_kv_cell_cache_load_seq";
        let o = out(out_seq, what)?;
        let id = load(cache, (data, len), what, |c, b| c.load_seq(b))?;
        o.set(crate::ids::to_c(id));
        Ok(())
    })
}

/// A chunk snapshot of sequence `seq`'s positions `[start, end)`, all of
/// which it must hold, into `buf` (room for `cap` bytes); `*out_len` gets its
/// size. Flat layers carry the whole range, ring layers what the ring table
/// still holds of it (its tail). Chunks `[0, e1), [e1, e2), ...` restore as
/// one new sequence with `okv_kv_cell_cache_load_seq_chunks`. The bytes equal
/// Python's `save_seq_chunk`.
///
/// Statuses: `OKV_ERR_BUFFER_TOO_SMALL` (as `okv_kv_seq_cache_save_state`);
/// `OKV_ERR_UNKNOWN_SEQUENCE` when `seq` is not live in this cache;
/// `OKV_ERR_INVALID_ARGUMENT` when the range is empty or `seq` does not hold
/// every position of it, or `buf` overlaps the pools. The cache never changes.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_cell_cache_save_seq_chunk(
    cache: *const okv_kv_cell_cache,
    seq: u64,
    start: usize,
    end: usize,
    buf: *mut u8,
    cap: usize,
    out_len: *mut usize,
) -> okv_status {
    guard(|| unsafe {
        let what = "okv_kv_cell_cache_save_seq_chunk";
        let id = crate::ids::from_c(seq, what)?;
        save(cache, (buf, cap), out_len, what, |c| {
            c.save_seq_chunk(id, start, end)
        })
    })
}

/// Restores `n` chunk snapshots (`data[i]`, `lens[i]` bytes each) covering
/// `[0, end)` end to end as one new sequence; `*out_seq` gets its id. All or
/// nothing.
///
/// Statuses: `OKV_ERR_SNAPSHOT` for a part that is truncated, damaged,
/// foreign or of a newer format, parts that do not run end to end from 0, or
/// parts lacking a ring row the next step needs (the message names the part);
/// `OKV_ERR_OUT_OF_CAPACITY` when the free cells or sequence ids do not
/// suffice; `OKV_ERR_INVALID_ARGUMENT` for `n` 0 or a part overlapping the
/// pools; `OKV_ERR_NULL_POINTER` for NULL arrays with a nonzero `n`, or a NULL
/// `out_seq`. On a refusal the cache's state is unchanged and `*out_seq` is
/// not written.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_cell_cache_load_seq_chunks(
    cache: *mut okv_kv_cell_cache,
    data: *const *const u8,
    lens: *const usize,
    n: usize,
    out_seq: *mut u64,
) -> okv_status {
    guard(|| unsafe {
        let what = "okv_kv_cell_cache_load_seq_chunks";
        let o = out(out_seq, what)?;
        let ptrs = slice(data, n, "data").map_err(|f| f.within(what))?;
        let lens = slice(lens, n, "lens").map_err(|f| f.within(what))?;
        let mut c = lock(cache, what)?;
        let mut parts = Vec::with_capacity(n);
        for (i, (&p, &l)) in ptrs.iter().zip(lens).enumerate() {
            apart_from_pools(&*c, span(p, l), what)?;
            parts.push(slice(p, l, &format!("data[{i}]")).map_err(|f| f.within(what))?);
        }
        let id = c
            .load_seq_chunks(&parts)
            .map_err(|e| Fail::from(e).within(what))?;
        o.set(crate::ids::to_c(id));
        Ok(())
    })
}
