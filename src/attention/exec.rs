//! Running a call's tasks: contiguous task ranges over the persistent
//! workers of `crate::workers` (the caller's thread being one of them), and
//! per-thread scratch that only grows. Each task writes whole output rows,
//! so which thread runs it changes no bit.

use super::geometry::{Block, Geometry};
#[cfg(feature = "xnnpack")]
use super::xnn;
use super::{kernel, softmax, Exec};
use crate::dtype::KvRows;
use crate::error::{CacheError, Result};
use crate::workers;
use std::cell::RefCell;
use std::sync::Mutex;

/// A raw output pointer shared by workers that write disjoint rows.
#[derive(Clone, Copy)]
struct SyncPtr(*mut f32);
// SAFETY: workers write disjoint ranges (each output row belongs to exactly one
// task), and `workers::run` joins them all before the buffer is used again.
unsafe impl Send for SyncPtr {}
// SAFETY: as above.
unsafe impl Sync for SyncPtr {}

#[derive(Default)]
struct Scratch {
    f: Vec<f32>,
    u: Vec<usize>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

// Task ranges and partial-state sizes: bounded by the validated shapes ("Arithmetic bounds" in validate.rs).
#[allow(clippy::arithmetic_side_effects)]
pub(super) fn run_tasks(
    geo: &Geometry<'_>,
    exec: Exec,
    threads: usize,
    out: &mut [f32],
) -> Result<()> {
    let n_tasks = geo.n_tasks();
    let out_ptr = SyncPtr(out.as_mut_ptr());
    let nthreads = threads.min(n_tasks).max(1);
    let range = |w: usize| (w * n_tasks / nthreads, (w + 1) * n_tasks / nthreads);
    let failed: Mutex<Option<CacheError>> = Mutex::new(None);
    let work = |w: usize| {
        let (a, b) = range(w);
        let res = with_scratch(|scr| {
            for task in a..b {
                run_task(geo, exec, task, scr, out_ptr)?;
            }
            Ok(())
        });
        if let Err(e) = res {
            if let Ok(mut f) = failed.lock() {
                f.get_or_insert(e);
            }
        }
    };
    workers::run(nthreads, &work)
        .map_err(|()| CacheError::Backend("attention worker thread panicked".into()))?;
    if let Some(e) = failed.into_inner().ok().flatten() {
        return Err(e);
    }
    Ok(())
}

fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    SCRATCH.with(|s| match s.try_borrow_mut() {
        Ok(mut s) => f(&mut s),
        Err(_) => f(&mut Scratch::default()),
    })
}

// Scratch sizes and row offsets of one task: bounded by the validated shapes ("Arithmetic bounds" in validate.rs).
#[allow(clippy::arithmetic_side_effects)]
fn run_task<'a>(
    geo: &Geometry<'a>,
    exec: Exec,
    task: usize,
    scr: &mut Scratch,
    out: SyncPtr,
) -> Result<()> {
    let (kvh, blk) = geo.task(task);
    let (r0, nr) = geo.block_rows(blk);
    let hd = geo.hd;
    let rb = geo.rb;
    let need_f = rb * hd * 2 + rb * 2 + 2 * kernel::RB * kernel::KT + 2 * kernel::KT * hd;
    if scr.f.len() < need_f {
        scr.f.resize(need_f, 0.0);
    }
    if scr.u.len() < 2 * rb {
        scr.u.resize(2 * rb, 0);
    }
    let (qs, rest) = scr.f.split_at_mut(rb * hd);
    let (acc, rest) = rest.split_at_mut(rb * hd);
    let (m, rest) = rest.split_at_mut(rb);
    let (l, rest) = rest.split_at_mut(rb);
    let (sc, conv) = rest.split_at_mut(2 * kernel::RB * kernel::KT);
    let (lo, hi) = scr.u.split_at_mut(rb);
    for i in 0..nr {
        let off = geo.row_off(kvh, r0 + i);
        let src = geo.q.get(off..off + hd).unwrap_or(&[]);
        if let Some(dst) = qs.get_mut(i * hd..(i + 1) * hd) {
            for (d, s) in dst.iter_mut().zip(src) {
                *d = s * geo.qscale;
            }
        }
        let (a, b) = geo.interval(r0 + i);
        if let (Some(x), Some(y)) = (lo.get_mut(i), hi.get_mut(i)) {
            *x = a;
            *y = b;
        }
    }
    m.fill(f32::NEG_INFINITY);
    l.fill(0.0);
    acc.fill(0.0);
    let head = |rows: KvRows<'a>| -> KvRows<'a> {
        let n = geo.slots * rows.dtype.row_bytes(hd);
        KvRows {
            dtype: rows.dtype,
            bytes: rows.bytes.get(kvh * n..(kvh + 1) * n).unwrap_or(&[]),
        }
    };
    let block = Block {
        k: head(geo.k),
        v: head(geo.v),
        hd,
        qs: qs.get(..nr * hd).unwrap_or(&[]),
        nr,
        lo: lo.get(..nr).unwrap_or(&[]),
        hi: hi.get(..nr).unwrap_or(&[]),
        segs: geo.segs(blk),
        anchor: geo.anchor,
        softcap: geo.softcap,
    };
    let mut st = softmax::State {
        m,
        l,
        acc,
        sc,
        conv,
    };
    match exec {
        Exec::Native(isa) => kernel::run_native(isa, &block, &mut st),
        #[cfg(feature = "xnnpack")]
        Exec::Xnn => xnn::run_block(&block, &mut st)?,
    }
    let softmax::State { l, acc, .. } = st;
    for i in 0..nr {
        let off = geo.row_off(kvh, r0 + i);
        let li = l.get(i).copied().unwrap_or(0.0);
        let inv = if li > 0.0 { 1.0 / li } else { 0.0 };
        for (d, x) in acc
            .get(i * hd..(i + 1) * hd)
            .unwrap_or(&[])
            .iter()
            .enumerate()
        {
            // SAFETY: off + d < q.len() == out.len() (validated shape); the
            // row (kvh, r0 + i) belongs to this task alone.
            unsafe { *out.0.add(off + d) = x * inv };
        }
    }
    Ok(())
}
