//! `okv_cell_cache` (CellCache: many sequences in one pool of cells) and
//! `okv_kv_cell_cache` (KvCellCache: the same plus K/V pools): batch verbs,
//! step, plan, update, attend.
//!
//! Thread-safety: as for the sequence caches, calls on one handle must not
//! overlap (`OKV_ERR_BUSY`). Pointers in an `okv_cell_plan`, a dense mask or
//! an `okv_pool_view` stay valid until the next mutating call on that cache
//! (`_begin_step`, `_update`, any batch verb, `_clear`, `_free`).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;

use offgraph_kv::{CellCache, KvCellCache};

use crate::attend::{self, okv_attend_options, AttendArgs};
use crate::config::{config_of, okv_config};
use crate::handle::{lock, opaque, publish, release, Opaque};
use crate::ids;
use crate::ptr::{out, slice, slice_mut, span};
use crate::sequence::{check_rows_apart, okv_pool_view, okv_run, pool_to_c};
use crate::status::{fail, finish, okv_status, R};

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
trait CellFace {
    fn cells(&self) -> &CellCache;
    fn cells_mut(&mut self) -> &mut CellCache;
}

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
}

unsafe fn read<H: Opaque, T>(
    h: *const H,
    o: *mut T,
    what: &str,
    f: impl FnOnce(&CellCache) -> R<T>,
) -> R<()>
where
    H::Inner: CellFace,
{
    let o = out(o, what)?;
    let c = unsafe { lock(h, what) }?;
    o.set(f(c.cells())?);
    Ok(())
}

unsafe fn write<H: Opaque>(
    h: *const H,
    what: &str,
    f: impl FnOnce(&mut CellCache) -> R<()>,
) -> R<()>
where
    H::Inner: CellFace,
{
    let mut c = unsafe { lock(h, what) }?;
    f(c.cells_mut())
}

unsafe fn seq_new<H: Opaque>(h: *const H, o: *mut u64, what: &str) -> R<()>
where
    H::Inner: CellFace,
{
    let o = out(o, what)?;
    let mut c = unsafe { lock(h, what) }?;
    o.set(ids::to_c(c.cells_mut().seq_new()?));
    Ok(())
}

unsafe fn seq_clone<H: Opaque>(h: *const H, src: u64, upto: usize, o: *mut u64, what: &str) -> R<()>
where
    H::Inner: CellFace,
{
    let o = out(o, what)?;
    let mut c = unsafe { lock(h, what) }?;
    let src = ids::from_c(src, what)?;
    let upto = (upto != OKV_NONE).then_some(upto);
    o.set(ids::to_c(c.cells_mut().seq_clone(src, upto)?));
    Ok(())
}

unsafe fn begin_step<H: Opaque>(
    h: *const H,
    seq_ids: *const u64,
    positions: *const usize,
    n: usize,
    what: &str,
) -> R<()>
where
    H::Inner: CellFace,
{
    let mut c = unsafe { lock(h, what) }?;
    let raw = unsafe { slice(seq_ids, n, "begin_step: seq_ids") }?;
    let pos = unsafe { slice(positions, n, "begin_step: positions") }?;
    // The ids converted into a per-thread buffer that only grows: a decode
    // loop allocates nothing here once warm.
    ID_SCRATCH.with(|cell| {
        let mut fresh = Vec::new();
        let mut held = cell.try_borrow_mut();
        let ids = match held.as_deref_mut() {
            Ok(v) => v,
            Err(_) => &mut fresh,
        };
        ids.clear();
        for &i in raw {
            ids.push(ids::from_c(i, what)?);
        }
        c.cells_mut().begin_step(ids, pos)?;
        Ok(())
    })
}

thread_local! {
    static ID_SCRATCH: std::cell::RefCell<Vec<offgraph_kv::SeqId>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

unsafe fn plan<H: Opaque>(h: *const H, layer: usize, o: *mut okv_cell_plan, what: &str) -> R<()>
where
    H::Inner: CellFace,
{
    let o = out(o, what)?;
    let c = unsafe { lock(h, what) }?;
    let p = c.cells().plan(layer)?;
    o.set(okv_cell_plan {
        n_tokens: p.n_tokens(),
        cells: p.cells().as_ptr(),
        positions: p.positions().as_ptr(),
        read_len: p.read_len(),
        window: p.window().unwrap_or(0),
        table: p.table(),
    });
    Ok(())
}

unsafe fn visible<H: Opaque>(
    h: *const H,
    layer: usize,
    token: usize,
    runs: *mut okv_run,
    cap: usize,
    n_out: *mut usize,
    what: &str,
) -> R<()>
where
    H::Inner: CellFace,
{
    let n_out = out(n_out, what)?;
    let c = unsafe { lock(h, what) }?;
    let v = c.cells().plan(layer)?.visible(token)?;
    if v.len() > cap {
        n_out.set(v.len());
        return Err(fail(
            okv_status::OKV_ERR_BUFFER_TOO_SMALL,
            format!(
                "{what}: token {token} sees {} runs, the buffer holds {cap}",
                v.len()
            ),
        ));
    }
    let dst = unsafe { slice_mut(runs, v.len(), "visible: runs") }?;
    for (d, r) in dst.iter_mut().zip(&v) {
        *d = okv_run {
            start: r.start,
            len: r.len,
        };
    }
    n_out.set(v.len());
    Ok(())
}

unsafe fn dense_mask<H: Opaque>(
    h: *const H,
    layer: usize,
    mask: *mut *const u8,
    rows: *mut usize,
    cols: *mut usize,
    what: &str,
) -> R<()>
where
    H::Inner: CellFace,
{
    let (mask, rows, cols) = (out(mask, what)?, out(rows, what)?, out(cols, what)?);
    let mut c = unsafe { lock(h, what) }?;
    let cells = c.cells_mut();
    let (t, read_len) = {
        let p = cells.plan(layer)?;
        (p.n_tokens(), p.read_len())
    };
    let m = cells.dense_mask(layer)?;
    mask.set(m.as_ptr());
    rows.set(t);
    cols.set(read_len);
    Ok(())
}

// ---------------------------------------------------------------------------
// okv_cell_cache

/// A cell cache (bookkeeping only) of `n_cells` cells per table and at most
/// `n_seq_max` live sequences, for `cfg` (validated; copied).
#[no_mangle]
pub unsafe extern "C" fn okv_cell_cache_new(
    cfg: *const okv_config,
    n_cells: usize,
    n_seq_max: usize,
    out_cache: *mut *mut okv_cell_cache,
) -> okv_status {
    finish(catch_unwind(AssertUnwindSafe(|| -> R<()> {
        let o = out(out_cache, "okv_cell_cache_new: out_cache")?;
        let c = CellCache::new(
            unsafe { config_of(cfg, "okv_cell_cache_new") }?,
            n_cells,
            n_seq_max,
        )?;
        publish::<okv_cell_cache>(c, o);
        Ok(())
    })))
}

/// Frees the cache. NULL is a no-op.
#[no_mangle]
pub unsafe extern "C" fn okv_cell_cache_free(cache: *mut okv_cell_cache) -> okv_status {
    finish(catch_unwind(AssertUnwindSafe(|| unsafe {
        release(cache, "okv_cell_cache_free")
    })))
}

/// A new empty sequence; its id is never handed out again in this process.
#[no_mangle]
pub unsafe extern "C" fn okv_cell_cache_seq_new(
    cache: *mut okv_cell_cache,
    out_seq: *mut u64,
) -> okv_status {
    finish(catch_unwind(AssertUnwindSafe(|| unsafe {
        seq_new(cache, out_seq, "okv_cell_cache_seq_new")
    })))
}

/// A new sequence owning `src`'s cells with position < `upto` (`OKV_NONE`:
/// all); no K/V is copied. Closes the open step.
#[no_mangle]
pub unsafe extern "C" fn okv_cell_cache_seq_clone(
    cache: *mut okv_cell_cache,
    src: u64,
    upto: usize,
    out_seq: *mut u64,
) -> okv_status {
    finish(catch_unwind(AssertUnwindSafe(|| unsafe {
        seq_clone(cache, src, upto, out_seq, "okv_cell_cache_seq_clone")
    })))
}

/// Drops `seq`'s positions in [p0, p1) (`p1` = `OKV_NONE`: to the end).
/// Closes the open step.
#[no_mangle]
pub unsafe extern "C" fn okv_cell_cache_seq_rm(
    cache: *mut okv_cell_cache,
    seq: u64,
    p0: usize,
    p1: usize,
) -> okv_status {
    finish(catch_unwind(AssertUnwindSafe(|| unsafe {
        write(cache, "okv_cell_cache_seq_rm", |c| {
            let s = ids::from_c(seq, "okv_cell_cache_seq_rm")?;
            Ok(c.seq_rm(s, p0, (p1 != OKV_NONE).then_some(p1))?)
        })
    })))
}

/// Frees `seq` (its id is refused from now on). Closes the open step.
#[no_mangle]
pub unsafe extern "C" fn okv_cell_cache_seq_free(
    cache: *mut okv_cell_cache,
    seq: u64,
) -> okv_status {
    finish(catch_unwind(AssertUnwindSafe(|| unsafe {
        write(cache, "okv_cell_cache_seq_free", |c| {
            Ok(c.seq_free(ids::from_c(seq, "okv_cell_cache_seq_free")?)?)
        })
    })))
}

/// The position `seq`'s next token takes (one past its highest held position).
#[no_mangle]
pub unsafe extern "C" fn okv_cell_cache_next_pos(
    cache: *const okv_cell_cache,
    seq: u64,
    out_pos: *mut usize,
) -> okv_status {
    finish(catch_unwind(AssertUnwindSafe(|| unsafe {
        read(cache, out_pos, "okv_cell_cache_next_pos", |c| {
            Ok(c.next_pos(ids::from_c(seq, "okv_cell_cache_next_pos")?)?)
        })
    })))
}

/// Positions `seq` holds.
#[no_mangle]
pub unsafe extern "C" fn okv_cell_cache_seq_len(
    cache: *const okv_cell_cache,
    seq: u64,
    out_len: *mut usize,
) -> okv_status {
    finish(catch_unwind(AssertUnwindSafe(|| unsafe {
        read(cache, out_len, "okv_cell_cache_seq_len", |c| {
            Ok(c.seq_len(ids::from_c(seq, "okv_cell_cache_seq_len")?)?)
        })
    })))
}

/// Free cells of the tightest table.
#[no_mangle]
pub unsafe extern "C" fn okv_cell_cache_free_cells(
    cache: *const okv_cell_cache,
    out_n: *mut usize,
) -> okv_status {
    finish(catch_unwind(AssertUnwindSafe(|| unsafe {
        read(cache, out_n, "okv_cell_cache_free_cells", |c| {
            Ok(c.free_cells())
        })
    })))
}

/// Cells per table.
#[no_mangle]
pub unsafe extern "C" fn okv_cell_cache_capacity(
    cache: *const okv_cell_cache,
    out_n: *mut usize,
) -> okv_status {
    finish(catch_unwind(AssertUnwindSafe(|| unsafe {
        read(
            cache,
            out_n,
            "okv_cell_cache_capacity",
            |c| Ok(c.capacity()),
        )
    })))
}

/// Whether `n` more tokens fit in the free cells (conservative for ring tables).
#[no_mangle]
pub unsafe extern "C" fn okv_cell_cache_can_extend(
    cache: *const okv_cell_cache,
    n: usize,
    out_ok: *mut bool,
) -> okv_status {
    finish(catch_unwind(AssertUnwindSafe(|| unsafe {
        read(cache, out_ok, "okv_cell_cache_can_extend", |c| {
            Ok(c.can_extend(n))
        })
    })))
}

/// Frees every sequence and cell; closes the open step.
#[no_mangle]
pub unsafe extern "C" fn okv_cell_cache_clear(cache: *mut okv_cell_cache) -> okv_status {
    finish(catch_unwind(AssertUnwindSafe(|| unsafe {
        write(cache, "okv_cell_cache_clear", |c| {
            c.clear();
            Ok(())
        })
    })))
}

/// The admission gate and placement: token i of the step belongs to
/// `seq_ids[i]` at `positions[i]` (`n_tokens` entries each). All or nothing.
#[no_mangle]
pub unsafe extern "C" fn okv_cell_cache_begin_step(
    cache: *mut okv_cell_cache,
    seq_ids: *const u64,
    positions: *const usize,
    n_tokens: usize,
) -> okv_status {
    finish(catch_unwind(AssertUnwindSafe(|| unsafe {
        begin_step(
            cache,
            seq_ids,
            positions,
            n_tokens,
            "okv_cell_cache_begin_step",
        )
    })))
}

/// The open step's plan for `layer` (pointers valid until the next mutating call).
#[no_mangle]
pub unsafe extern "C" fn okv_cell_cache_plan(
    cache: *const okv_cell_cache,
    layer: usize,
    out_plan: *mut okv_cell_plan,
) -> okv_status {
    finish(catch_unwind(AssertUnwindSafe(|| unsafe {
        plan(cache, layer, out_plan, "okv_cell_cache_plan")
    })))
}

/// Token `token`'s visible cells at `layer` as sorted, disjoint runs, into
/// `runs` (room for `cap`); `*out_n` gets the count. With too small a buffer:
/// `OKV_ERR_BUFFER_TOO_SMALL`, `*out_n` the count needed, `runs` untouched.
#[no_mangle]
pub unsafe extern "C" fn okv_cell_cache_visible(
    cache: *const okv_cell_cache,
    layer: usize,
    token: usize,
    runs: *mut okv_run,
    cap: usize,
    out_n: *mut usize,
) -> okv_status {
    finish(catch_unwind(AssertUnwindSafe(|| unsafe {
        visible(
            cache,
            layer,
            token,
            runs,
            cap,
            out_n,
            "okv_cell_cache_visible",
        )
    })))
}

/// The open step's dense mask at `layer`: `*out_rows` (tokens) x `*out_cols`
/// (read_len) bytes, row-major, 1 = visible. Valid until the next mutating call.
#[no_mangle]
pub unsafe extern "C" fn okv_cell_cache_dense_mask(
    cache: *mut okv_cell_cache,
    layer: usize,
    out_mask: *mut *const u8,
    out_rows: *mut usize,
    out_cols: *mut usize,
) -> okv_status {
    finish(catch_unwind(AssertUnwindSafe(|| unsafe {
        dense_mask(
            cache,
            layer,
            out_mask,
            out_rows,
            out_cols,
            "okv_cell_cache_dense_mask",
        )
    })))
}

// ---------------------------------------------------------------------------
// okv_kv_cell_cache

/// A cell cache with K/V pools (`n_cells` rows deep) for `cfg` (validated; copied).
#[no_mangle]
pub unsafe extern "C" fn okv_kv_cell_cache_new(
    cfg: *const okv_config,
    n_cells: usize,
    n_seq_max: usize,
    out_cache: *mut *mut okv_kv_cell_cache,
) -> okv_status {
    finish(catch_unwind(AssertUnwindSafe(|| -> R<()> {
        let o = out(out_cache, "okv_kv_cell_cache_new: out_cache")?;
        let c = KvCellCache::new(
            unsafe { config_of(cfg, "okv_kv_cell_cache_new") }?,
            n_cells,
            n_seq_max,
        )?;
        publish::<okv_kv_cell_cache>(c, o);
        Ok(())
    })))
}

/// Frees the cache and its pools. NULL is a no-op.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_cell_cache_free(cache: *mut okv_kv_cell_cache) -> okv_status {
    finish(catch_unwind(AssertUnwindSafe(|| unsafe {
        release(cache, "okv_kv_cell_cache_free")
    })))
}

/// See `okv_cell_cache_seq_new`.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_cell_cache_seq_new(
    cache: *mut okv_kv_cell_cache,
    out_seq: *mut u64,
) -> okv_status {
    finish(catch_unwind(AssertUnwindSafe(|| unsafe {
        seq_new(cache, out_seq, "okv_kv_cell_cache_seq_new")
    })))
}

/// See `okv_cell_cache_seq_clone` (the clone shares the cells' K/V rows).
#[no_mangle]
pub unsafe extern "C" fn okv_kv_cell_cache_seq_clone(
    cache: *mut okv_kv_cell_cache,
    src: u64,
    upto: usize,
    out_seq: *mut u64,
) -> okv_status {
    finish(catch_unwind(AssertUnwindSafe(|| unsafe {
        seq_clone(cache, src, upto, out_seq, "okv_kv_cell_cache_seq_clone")
    })))
}

/// See `okv_cell_cache_seq_rm`.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_cell_cache_seq_rm(
    cache: *mut okv_kv_cell_cache,
    seq: u64,
    p0: usize,
    p1: usize,
) -> okv_status {
    finish(catch_unwind(AssertUnwindSafe(|| unsafe {
        write(cache, "okv_kv_cell_cache_seq_rm", |c| {
            let s = ids::from_c(seq, "okv_kv_cell_cache_seq_rm")?;
            Ok(c.seq_rm(s, p0, (p1 != OKV_NONE).then_some(p1))?)
        })
    })))
}

/// See `okv_cell_cache_seq_free`.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_cell_cache_seq_free(
    cache: *mut okv_kv_cell_cache,
    seq: u64,
) -> okv_status {
    finish(catch_unwind(AssertUnwindSafe(|| unsafe {
        write(cache, "okv_kv_cell_cache_seq_free", |c| {
            Ok(c.seq_free(ids::from_c(seq, "okv_kv_cell_cache_seq_free")?)?)
        })
    })))
}

/// See `okv_cell_cache_next_pos`.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_cell_cache_next_pos(
    cache: *const okv_kv_cell_cache,
    seq: u64,
    out_pos: *mut usize,
) -> okv_status {
    finish(catch_unwind(AssertUnwindSafe(|| unsafe {
        read(cache, out_pos, "okv_kv_cell_cache_next_pos", |c| {
            Ok(c.next_pos(ids::from_c(seq, "okv_kv_cell_cache_next_pos")?)?)
        })
    })))
}

/// See `okv_cell_cache_seq_len`.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_cell_cache_seq_len(
    cache: *const okv_kv_cell_cache,
    seq: u64,
    out_len: *mut usize,
) -> okv_status {
    finish(catch_unwind(AssertUnwindSafe(|| unsafe {
        read(cache, out_len, "okv_kv_cell_cache_seq_len", |c| {
            Ok(c.seq_len(ids::from_c(seq, "okv_kv_cell_cache_seq_len")?)?)
        })
    })))
}

/// See `okv_cell_cache_free_cells`.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_cell_cache_free_cells(
    cache: *const okv_kv_cell_cache,
    out_n: *mut usize,
) -> okv_status {
    finish(catch_unwind(AssertUnwindSafe(|| unsafe {
        read(cache, out_n, "okv_kv_cell_cache_free_cells", |c| {
            Ok(c.free_cells())
        })
    })))
}

/// See `okv_cell_cache_capacity`.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_cell_cache_capacity(
    cache: *const okv_kv_cell_cache,
    out_n: *mut usize,
) -> okv_status {
    finish(catch_unwind(AssertUnwindSafe(|| unsafe {
        read(cache, out_n, "okv_kv_cell_cache_capacity", |c| {
            Ok(c.capacity())
        })
    })))
}

/// See `okv_cell_cache_can_extend`.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_cell_cache_can_extend(
    cache: *const okv_kv_cell_cache,
    n: usize,
    out_ok: *mut bool,
) -> okv_status {
    finish(catch_unwind(AssertUnwindSafe(|| unsafe {
        read(cache, out_ok, "okv_kv_cell_cache_can_extend", |c| {
            Ok(c.can_extend(n))
        })
    })))
}

/// See `okv_cell_cache_clear` (pool memory is kept).
#[no_mangle]
pub unsafe extern "C" fn okv_kv_cell_cache_clear(cache: *mut okv_kv_cell_cache) -> okv_status {
    finish(catch_unwind(AssertUnwindSafe(|| unsafe {
        write(cache, "okv_kv_cell_cache_clear", |c| {
            c.clear();
            Ok(())
        })
    })))
}

/// See `okv_cell_cache_begin_step`.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_cell_cache_begin_step(
    cache: *mut okv_kv_cell_cache,
    seq_ids: *const u64,
    positions: *const usize,
    n_tokens: usize,
) -> okv_status {
    finish(catch_unwind(AssertUnwindSafe(|| unsafe {
        begin_step(
            cache,
            seq_ids,
            positions,
            n_tokens,
            "okv_kv_cell_cache_begin_step",
        )
    })))
}

/// See `okv_cell_cache_plan`.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_cell_cache_plan(
    cache: *const okv_kv_cell_cache,
    layer: usize,
    out_plan: *mut okv_cell_plan,
) -> okv_status {
    finish(catch_unwind(AssertUnwindSafe(|| unsafe {
        plan(cache, layer, out_plan, "okv_kv_cell_cache_plan")
    })))
}

/// See `okv_cell_cache_visible`.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_cell_cache_visible(
    cache: *const okv_kv_cell_cache,
    layer: usize,
    token: usize,
    runs: *mut okv_run,
    cap: usize,
    out_n: *mut usize,
) -> okv_status {
    finish(catch_unwind(AssertUnwindSafe(|| unsafe {
        visible(
            cache,
            layer,
            token,
            runs,
            cap,
            out_n,
            "okv_kv_cell_cache_visible",
        )
    })))
}

/// See `okv_cell_cache_dense_mask`.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_cell_cache_dense_mask(
    cache: *mut okv_kv_cell_cache,
    layer: usize,
    out_mask: *mut *const u8,
    out_rows: *mut usize,
    out_cols: *mut usize,
) -> okv_status {
    finish(catch_unwind(AssertUnwindSafe(|| unsafe {
        dense_mask(
            cache,
            layer,
            out_mask,
            out_rows,
            out_cols,
            "okv_kv_cell_cache_dense_mask",
        )
    })))
}

/// Writes the open step's rows of `layer` to the tokens' cells: `k` and `v`
/// hold `[n_kv_heads, n_tokens, head_dim]` floats (`k_len`, `v_len`), not
/// overlapping the pools. Refused calls write nothing.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_cell_cache_update(
    cache: *mut okv_kv_cell_cache,
    layer: usize,
    k: *const f32,
    k_len: usize,
    v: *const f32,
    v_len: usize,
) -> okv_status {
    finish(catch_unwind(AssertUnwindSafe(|| -> R<()> {
        let what = "okv_kv_cell_cache_update";
        let mut c = unsafe { lock(cache, what) }?;
        if let Ok(pool) = c.pool(layer) {
            check_rows_apart(pool, span(k, k_len), span(v, v_len), what)?;
        }
        let k = unsafe { slice(k, k_len, "okv_kv_cell_cache_update: k") }?;
        let v = unsafe { slice(v, v_len, "okv_kv_cell_cache_update: v") }?;
        c.update(layer, k, v)?;
        Ok(())
    })))
}

/// Attention of the open step at `layer` into `out` (see
/// `okv_kv_seq_cache_attend`); each token sees exactly its sequence's cells.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_cell_cache_attend(
    cache: *mut okv_kv_cell_cache,
    layer: usize,
    q: *const f32,
    q_len: usize,
    n_q_heads: usize,
    out: *mut f32,
    out_len: usize,
    options: *const okv_attend_options,
) -> okv_status {
    finish(catch_unwind(AssertUnwindSafe(|| -> R<()> {
        let what = "okv_kv_cell_cache_attend";
        let mut c = unsafe { lock(cache, what) }?;
        let spec = c.spec(layer)?;
        let args = AttendArgs {
            q,
            q_len,
            n_q_heads,
            out,
            out_len,
            opts: options,
        };
        unsafe { attend::run(&spec, &args, what) }
    })))
}

/// Layer `layer`'s pools (valid until the next mutating call on the cache).
#[no_mangle]
pub unsafe extern "C" fn okv_kv_cell_cache_pool(
    cache: *const okv_kv_cell_cache,
    layer: usize,
    out_view: *mut okv_pool_view,
) -> okv_status {
    finish(catch_unwind(AssertUnwindSafe(|| -> R<()> {
        let what = "okv_kv_cell_cache_pool";
        let o = out(out_view, what)?;
        let c = unsafe { lock(cache, what) }?;
        o.set(pool_to_c(c.pool(layer)?));
        Ok(())
    })))
}

/// Bytes all pools hold.
#[no_mangle]
pub unsafe extern "C" fn okv_kv_cell_cache_nbytes(
    cache: *const okv_kv_cell_cache,
    out_bytes: *mut usize,
) -> okv_status {
    finish(catch_unwind(AssertUnwindSafe(|| -> R<()> {
        let what = "okv_kv_cell_cache_nbytes";
        let o = out(out_bytes, what)?;
        o.set(unsafe { lock(cache, what) }?.nbytes_total());
        Ok(())
    })))
}
