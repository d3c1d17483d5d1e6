//! Running a call's tasks: contiguous task ranges over the persistent
//! workers of `crate::workers` (the caller's thread being one of them), per-thread scratch that
//! only grows, and the merge of key-split partial softmax states.

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
// task; each task's partial slot to that task), and `workers::run` joins them all
// before the buffer is used again.
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
    let mut partial = if geo.ksplit > 1 {
        vec![0.0f32; n_tasks * geo.partial_len()]
    } else {
        Vec::new()
    };
    let out_ptr = SyncPtr(out.as_mut_ptr());
    let part_ptr = if geo.ksplit > 1 {
        Some(SyncPtr(partial.as_mut_ptr()))
    } else {
        None
    };
    let nthreads = threads.min(n_tasks).max(1);
    let range = |w: usize| (w * n_tasks / nthreads, (w + 1) * n_tasks / nthreads);
    let failed: Mutex<Option<CacheError>> = Mutex::new(None);
    let work = |w: usize| {
        let (a, b) = range(w);
        let res = with_scratch(|scr| {
            for task in a..b {
                run_task(geo, exec, task, scr, out_ptr, part_ptr)?;
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
    if geo.ksplit > 1 {
        merge_partials(geo, &partial, out);
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
    partial: Option<SyncPtr>,
) -> Result<()> {
    let (kvh, blk, split) = geo.task(task);
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
    let (k0, k1) = geo.split_range(split);
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
        k0,
        k1,
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
    let softmax::State { m, l, acc, .. } = st;
    match partial {
        Some(p) => {
            let base = task * geo.partial_len();
            for i in 0..nr {
                let row = base + i * (hd + 2);
                // SAFETY: the partial buffer holds n_tasks * partial_len floats;
                // task < n_tasks and i < nr <= rb, so [row, row + hd + 2) is inside
                // this task's slot, which no other worker touches.
                unsafe {
                    *p.0.add(row) = m.get(i).copied().unwrap_or(f32::NEG_INFINITY);
                    *p.0.add(row + 1) = l.get(i).copied().unwrap_or(0.0);
                    for (d, x) in acc
                        .get(i * hd..(i + 1) * hd)
                        .unwrap_or(&[])
                        .iter()
                        .enumerate()
                    {
                        *p.0.add(row + 2 + d) = *x;
                    }
                }
            }
        }
        None => {
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
        }
    }
    Ok(())
}

/// Combines the key-split partial states of each row: the softmax of a union is
/// the max-rescaled sum of the parts.
// Partial-state offsets: bounded by the validated shapes ("Arithmetic bounds" in validate.rs).
#[allow(clippy::arithmetic_side_effects)]
fn merge_partials(geo: &Geometry<'_>, partial: &[f32], out: &mut [f32]) {
    let hd = geo.hd;
    for unit in 0..geo.n_kv * geo.blocks_per_head {
        let kvh = unit / geo.blocks_per_head;
        let (r0, nr) = geo.block_rows(unit % geo.blocks_per_head);
        for i in 0..nr {
            let row = |s: usize| (unit * geo.ksplit + s) * geo.partial_len() + i * (hd + 2);
            let mmax = (0..geo.ksplit)
                .map(|s| partial.get(row(s)).copied().unwrap_or(f32::NEG_INFINITY))
                .fold(f32::NEG_INFINITY, f32::max);
            let off = geo.row_off(kvh, r0 + i);
            let Some(dst) = out.get_mut(off..off + hd) else {
                continue;
            };
            dst.fill(0.0);
            if mmax == f32::NEG_INFINITY {
                continue;
            }
            let mut lsum = 0.0f32;
            for s in 0..geo.ksplit {
                let b = row(s);
                let ms = partial.get(b).copied().unwrap_or(f32::NEG_INFINITY);
                if ms == f32::NEG_INFINITY {
                    continue;
                }
                let w = softmax::exp2(ms - mmax);
                lsum += w * partial.get(b + 1).copied().unwrap_or(0.0);
                for (d, x) in dst
                    .iter_mut()
                    .zip(partial.get(b + 2..b + 2 + hd).unwrap_or(&[]))
                {
                    *d += w * x;
                }
            }
            let inv = if lsum > 0.0 { 1.0 / lsum } else { 0.0 };
            for d in dst.iter_mut() {
                *d *= inv;
            }
        }
    }
}
