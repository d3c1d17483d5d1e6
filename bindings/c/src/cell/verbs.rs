//! Every cell-cache verb, written once over [`CellFace`] for both handle
//! kinds. Each checks its out-parameters, then locks the handle, then reads
//! the ids, so a refusal is the same whichever kind it came through.

use std::cell::RefCell;

use offgraph_kv::{CellCache, SeqId};

use super::{okv_cell_plan, CellFace, CellHandle, OKV_NONE};
use crate::handle::{lock, mutate, query};
use crate::ids;
use crate::ptr::{out, slice, slice_mut};
use crate::sequence::okv_run;
use crate::status::{fail, okv_status, R};

/// A value read from the bookkeeping into `o`.
unsafe fn read<H: CellHandle, T>(
    h: *const H,
    o: *mut T,
    what: &str,
    f: impl FnOnce(&CellCache) -> R<T>,
) -> R<()> {
    unsafe { query(h, o, what, |c| f(c.cells())) }
}

/// A change to the bookkeeping.
unsafe fn write<H: CellHandle, T>(
    h: *const H,
    what: &str,
    f: impl FnOnce(&mut CellCache) -> R<T>,
) -> R<T> {
    unsafe { mutate(h, what, |c| f(c.cells_mut())) }
}

/// `OKV_NONE` as "no bound".
fn bound(p: usize) -> Option<usize> {
    (p != OKV_NONE).then_some(p)
}

pub(super) unsafe fn seq_new<H: CellHandle>(h: *const H, o: *mut u64, what: &str) -> R<()> {
    let o = out(o, what)?;
    let id = unsafe { write(h, what, |c| Ok(c.seq_new()?)) }?;
    o.set(ids::to_c(id));
    Ok(())
}

pub(super) unsafe fn seq_clone<H: CellHandle>(
    h: *const H,
    src: u64,
    upto: usize,
    o: *mut u64,
    what: &str,
) -> R<()> {
    let o = out(o, what)?;
    let id = unsafe {
        write(h, what, |c| {
            Ok(c.seq_clone(ids::from_c(src, what)?, bound(upto))?)
        })
    }?;
    o.set(ids::to_c(id));
    Ok(())
}

pub(super) unsafe fn seq_rm<H: CellHandle>(
    h: *const H,
    seq: u64,
    p0: usize,
    p1: usize,
    what: &str,
) -> R<()> {
    unsafe {
        write(h, what, |c| {
            Ok(c.seq_rm(ids::from_c(seq, what)?, p0, bound(p1))?)
        })
    }
}

pub(super) unsafe fn seq_free<H: CellHandle>(h: *const H, seq: u64, what: &str) -> R<()> {
    unsafe { write(h, what, |c| Ok(c.seq_free(ids::from_c(seq, what)?)?)) }
}

pub(super) unsafe fn next_pos<H: CellHandle>(
    h: *const H,
    seq: u64,
    o: *mut usize,
    what: &str,
) -> R<()> {
    unsafe { read(h, o, what, |c| Ok(c.next_pos(ids::from_c(seq, what)?)?)) }
}

pub(super) unsafe fn seq_len<H: CellHandle>(
    h: *const H,
    seq: u64,
    o: *mut usize,
    what: &str,
) -> R<()> {
    unsafe { read(h, o, what, |c| Ok(c.seq_len(ids::from_c(seq, what)?)?)) }
}

pub(super) unsafe fn free_cells<H: CellHandle>(h: *const H, o: *mut usize, what: &str) -> R<()> {
    unsafe { read(h, o, what, |c| Ok(c.free_cells())) }
}

pub(super) unsafe fn capacity<H: CellHandle>(h: *const H, o: *mut usize, what: &str) -> R<()> {
    unsafe { read(h, o, what, |c| Ok(c.capacity())) }
}

pub(super) unsafe fn can_extend<H: CellHandle>(
    h: *const H,
    n: usize,
    o: *mut bool,
    what: &str,
) -> R<()> {
    unsafe { read(h, o, what, |c| Ok(c.can_extend(n))) }
}

pub(super) unsafe fn clear<H: CellHandle>(h: *const H, what: &str) -> R<()> {
    unsafe {
        mutate(h, what, |c| {
            CellFace::clear(c);
            Ok(())
        })
    }
}

thread_local! {
    static ID_SCRATCH: RefCell<Vec<SeqId>> = const { RefCell::new(Vec::new()) };
}

pub(super) unsafe fn begin_step<H: CellHandle>(
    h: *const H,
    seq_ids: *const u64,
    positions: *const usize,
    n: usize,
    what: &str,
) -> R<()> {
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

pub(super) unsafe fn plan<H: CellHandle>(
    h: *const H,
    layer: usize,
    o: *mut okv_cell_plan,
    what: &str,
) -> R<()> {
    unsafe {
        read(h, o, what, |c| {
            let p = c.plan(layer)?;
            Ok(okv_cell_plan {
                n_tokens: p.n_tokens(),
                cells: p.cells().as_ptr(),
                positions: p.positions().as_ptr(),
                read_len: p.read_len(),
                window: p.window().unwrap_or(0),
                table: p.table(),
            })
        })
    }
}

pub(super) unsafe fn visible<H: CellHandle>(
    h: *const H,
    (layer, token): (usize, usize),
    runs: *mut okv_run,
    cap: usize,
    n_out: *mut usize,
    what: &str,
) -> R<()> {
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

pub(super) unsafe fn dense_mask<H: CellHandle>(
    h: *const H,
    layer: usize,
    (mask, rows, cols): (*mut *const u8, *mut usize, *mut usize),
    what: &str,
) -> R<()> {
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
