//! The matmul driver: checks every argument before writing anything,
//! quantizes the activations once, splits the output rows of all weights of
//! the call into contiguous ranges (by bytes) over the worker pool, and in
//! each range reads every row once per tile of tokens: the row stays in L1
//! while all the tile's tokens (their quantized activations in L2) pass it.

use super::act::{Act, ActBuf, ActKind};
use super::isa::Path;
use super::kernel::{Kernel, LANES};
use super::portable;
use super::QMatrix;
use crate::error::{EngineError, Result};
use crate::ggml_type::GgmlType;
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};

/// Weights handled in one pass of the pool (a call with more runs several).
const GROUP: usize = 8;
/// Tokens per kernel call: a row's decoded block is used for this many.
pub(super) const TOK: usize = 4;
/// Tokens per kernel call for the 32-value block types.
const TOK_WIDE: usize = 8;
/// Tokens per lanes-kernel call: 16 accumulators, 8 weight registers.
const TOK_LANES: usize = 16;
/// Activation bytes a token tile may take (L2 is 2 MiB a core here).
const TILE_BYTES: usize = 512 * 1024;
/// Weight bytes of a row block (half of L1d).
const ROW_BLOCK_BYTES: usize = 24 * 1024;
/// Weight bytes x tokens below which another part costs more than it saves.
const PART_WORK: u64 = 32 * 1024;

/// The output of one weight, shared by the parts: each writes only the
/// indices of its own rows.
struct Out {
    ptr: *mut f32,
    len: usize,
}

// SAFETY: parts write disjoint indices (their row ranges do not overlap) and
// the caller's `&mut` borrow outlives the pool call.
unsafe impl Sync for Out {}

impl Out {
    #[inline(always)]
    fn put(&self, i: usize, v: f32) -> bool {
        if i < self.len {
            // SAFETY: in bounds (checked); no other part writes index `i`.
            unsafe { self.ptr.add(i).write(v) };
            true
        } else {
            false
        }
    }
}

/// Rows taken together by a matvec pass (single-token chunks): kernels that
/// override [`Kernel::dots_rows`] then run this many FMA chains at once.
const ROWS: usize = 4;
/// Rows taken together against a chunk of [`TOK`] tokens: each token's
/// registers serve both rows, and the (row, token) accumulators fit.
const ROWS_BATCHED: usize = 2;

struct Portable;

impl Kernel for Portable {
    #[inline(always)]
    fn dots<const T: usize>(ty: GgmlType, row: &[u8], a: &[Act<'_>; T]) -> Option<[f32; T]> {
        Some(core::array::from_fn(|t| {
            a.get(t).map_or(0.0, |a| portable::dot(ty, row, a))
        }))
    }
}

struct Job<'a> {
    w: QMatrix<'a>,
    out: Out,
    row_bytes: usize,
    /// Whether the call runs this weight's whole groups of [`LANES`] rows
    /// by the lanes kernels; parts then split it at multiples of `LANES`,
    /// so which kernel computes a row does not depend on the split.
    lanes: bool,
    /// The packed groups and one group's bytes, when the lanes kernels read
    /// them (`repack`) instead of the rows in place.
    packed: Option<(&'a [u8], usize)>,
    /// Where this weight's rows start in the call's byte space.
    off: u64,
}

impl Job<'_> {
    /// The first row at or after byte position `pos` of the call.
    fn row_at(&self, pos: u64) -> usize {
        let rb = self.row_bytes.max(1) as u64;
        let r = pos.saturating_sub(self.off).div_ceil(rb);
        let r = usize::try_from(r).unwrap_or(usize::MAX);
        let r = if self.lanes {
            r.div_ceil(LANES).saturating_mul(LANES)
        } else {
            r
        };
        r.min(self.w.rows)
    }
}

thread_local! {
    /// The caller thread's quantized activations (Q8, Q8K); they only grow.
    static SCRATCH: RefCell<[ActBuf; 2]> = RefCell::new(Default::default());
}

fn invalid(msg: String) -> EngineError {
    EngineError::InvalidArgument(msg)
}

pub(super) fn run(
    path: Path,
    ws: &[&QMatrix],
    x: &[f32],
    n: usize,
    outs: &mut [&mut [f32]],
    threads: usize,
) -> Result<()> {
    if ws.len() != outs.len() {
        return Err(invalid(format!(
            "matmul: {} weights but {} outputs",
            ws.len(),
            outs.len()
        )));
    }
    let Some(first) = ws.first() else {
        return Ok(());
    };
    let cols = first.cols;
    for (i, (w, o)) in ws.iter().zip(outs.iter()).enumerate() {
        w.row_bytes_checked()?;
        w.packed_checked()?;
        if w.cols != cols {
            return Err(invalid(format!(
                "matmul: weight {i} has {} cols, weight 0 has {cols}",
                w.cols
            )));
        }
        let need = n.checked_mul(w.rows);
        if need.is_none_or(|need| o.len() < need) {
            return Err(invalid(format!(
                "matmul: output {i} needs {n} tokens x {} rows values, got {}",
                w.rows,
                o.len()
            )));
        }
    }
    let need = n.checked_mul(cols);
    if need.is_none_or(|need| x.len() < need) {
        return Err(invalid(format!(
            "matmul: x needs {n} tokens x {cols} cols values, got {}",
            x.len()
        )));
    }
    if n == 0 {
        return Ok(());
    }
    SCRATCH.with(|s| match s.try_borrow_mut() {
        Ok(mut bufs) => run_filled(path, ws, x, n, outs, threads, &mut bufs),
        // Re-entered on this thread (not done by the engine): fresh buffers.
        Err(_) => run_filled(path, ws, x, n, outs, threads, &mut Default::default()),
    })
}

fn run_filled(
    path: Path,
    ws: &[&QMatrix],
    x: &[f32],
    n: usize,
    outs: &mut [&mut [f32]],
    threads: usize,
    bufs: &mut [ActBuf; 2],
) -> Result<()> {
    let cols = ws.first().map_or(0, |w| w.cols);
    let [q8, q8k] = bufs;
    let kinds = || ws.iter().map(|w| ActKind::of(w.ty));
    if kinds().any(|k| k == ActKind::Q8) {
        q8.fill(ActKind::Q8, x, cols, n);
    }
    if kinds().any(|k| k == ActKind::Q8K) {
        q8k.fill(ActKind::Q8K, x, cols, n);
    }
    let f32buf = ActBuf::default();
    let mut f32buf = f32buf;
    f32buf.fill(ActKind::F32, x, cols, n);
    for (wg, og) in ws.chunks(GROUP).zip(outs.chunks_mut(GROUP)) {
        let mut jobs: [Option<Job>; GROUP] = Default::default();
        let mut total = 0u64;
        for ((slot, w), o) in jobs.iter_mut().zip(wg).zip(og.iter_mut()) {
            let row_bytes = w.row_bytes_checked()?;
            let packed = match (w.packed, w.packed_checked()?) {
                (Some(p), Some(gb)) if super::repack::runs_packed(path, w.ty) => Some((p, gb)),
                _ => None,
            };
            *slot = Some(Job {
                w: **w,
                out: Out {
                    ptr: o.as_mut_ptr(),
                    len: o.len(),
                },
                row_bytes,
                lanes: packed.is_some() || lanes_for(path, w.ty),
                packed,
                off: total,
            });
            total = total.saturating_add((row_bytes as u64).saturating_mul(w.rows as u64));
        }
        let work = total.saturating_mul(n as u64);
        let parts = threads.clamp(
            1,
            usize::try_from(work / PART_WORK)
                .unwrap_or(usize::MAX)
                .max(1),
        );
        let failed = AtomicBool::new(false);
        let part = |p: usize| {
            let lo = (u128::from(total) * p as u128 / parts as u128) as u64;
            let hi = (u128::from(total) * (p as u128 + 1) / parts as u128) as u64;
            for job in jobs.iter().flatten() {
                let (r0, r1) = (job.row_at(lo), job.row_at(hi));
                if r0 >= r1 {
                    continue;
                }
                let buf = match ActKind::of(job.w.ty) {
                    ActKind::Q8 => &*q8,
                    ActKind::Q8K => &*q8k,
                    ActKind::F32 => &f32buf,
                };
                if !rows(path, job, buf, x, n, r0, r1) {
                    failed.store(true, Ordering::Relaxed);
                }
            }
        };
        let ran = offgraph_kv::workers::run(parts, &part);
        if ran.is_err() || failed.load(Ordering::Relaxed) {
            return Err(invalid(
                "matmul: a part failed on its rows (inconsistent buffers)".into(),
            ));
        }
    }
    Ok(())
}

/// Whether `path` takes `ty`'s whole groups of rows by the lanes kernels,
/// for every token count (one summation order per row: a token's result
/// does not depend on the step it ran in).
fn lanes_for(path: Path, ty: GgmlType) -> bool {
    #[cfg(target_arch = "x86_64")]
    if path == Path::Vnni {
        return super::vnni_lanes::supports(ty);
    }
    let _ = (path, ty);
    false
}

fn rows(path: Path, job: &Job, buf: &ActBuf, x: &[f32], n: usize, r0: usize, r1: usize) -> bool {
    match path {
        Path::Portable => compute::<Portable>(job, buf, x, n, r0, r1),
        // SAFETY: `isa::select` returned Avx2 only after detecting avx2, fma and f16c.
        #[cfg(target_arch = "x86_64")]
        Path::Avx2 => unsafe { compute_avx2(job, buf, x, n, r0, r1) },
        // SAFETY: `isa::select` returned Vnni only after detecting avx2, fma,
        // f16c, avx512f/bw/vl and avx512vnni.
        #[cfg(target_arch = "x86_64")]
        Path::Vnni => unsafe { compute_vnni(job, buf, x, n, r0, r1) },
    }
}

/// [`compute`] compiled with AVX-512 VNNI (and AVX2's set).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn compute_vnni(job: &Job, buf: &ActBuf, x: &[f32], n: usize, r0: usize, r1: usize) -> bool {
    compute::<super::vnni::Vnni>(job, buf, x, n, r0, r1)
}

/// [`compute`] compiled with AVX2, so the kernels inline into its loops.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn compute_avx2(job: &Job, buf: &ActBuf, x: &[f32], n: usize, r0: usize, r1: usize) -> bool {
    compute::<super::avx2::Avx2>(job, buf, x, n, r0, r1)
}

/// Rows `r0..r1` of `job` for all `n` tokens; false when a view or an
/// output index was out of range (the checks in `run` rule it out).
#[inline(always)]
fn compute<K: Kernel>(job: &Job, buf: &ActBuf, x: &[f32], n: usize, r0: usize, r1: usize) -> bool {
    let (w, rb) = (&job.w, job.row_bytes);
    let per_token = match ActKind::of(w.ty) {
        ActKind::F32 => w.cols * 4,
        ActKind::Q8 => w.cols + w.cols / 8,
        ActKind::Q8K => w.cols + w.cols / 8 + w.cols / 64,
    };
    let tile = (TILE_BYTES / per_token.max(1)).max(TOK_LANES) / TOK_LANES * TOK_LANES;
    // The 32-value types without mins take chunks of eight tokens: a row's
    // unpacked blocks and scales then serve twice the tokens (`vnni_wide`;
    // measured 10-12% faster). Q4_1's min accumulators spill at eight.
    let wide = matches!(w.ty, GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0);
    // A type with a lanes kernel runs its whole groups of 16 rows by it, for
    // every token count; the rows a block leaves over run the per-row ones.
    let lanes = job.lanes;
    // Rows of a block stay in L1 while each token chunk passes them.
    let mut rblock = (ROW_BLOCK_BYTES / rb.max(1)).max(1);
    if lanes {
        rblock = rblock.div_ceil(LANES) * LANES;
    }
    let mut ok = true;
    let mut t0 = 0;
    while t0 < n {
        let t1 = n.min(t0.saturating_add(tile));
        let mut b0 = r0;
        while b0 < r1 {
            let b1 = r1.min(b0.saturating_add(rblock));
            // The block's whole groups of LANES rows, then the rest row by row.
            let rest = if lanes {
                lanes_rows::<K>(job, buf, x, (t0, t1), b0, b1, &mut ok)
            } else {
                b0
            };
            let mut t = t0;
            while t < t1 && rest < b1 {
                if wide && t + TOK_WIDE <= t1 {
                    let views: [Option<Act>; TOK_WIDE] =
                        core::array::from_fn(|i| buf.token(x, t + i));
                    let Some(views) = all(views) else {
                        return false;
                    };
                    ok &= rows_chunk::<K, TOK_WIDE>(job, &views, t, rest, b1);
                    t += TOK_WIDE;
                } else if t + TOK <= t1 {
                    let views: [Option<Act>; TOK] = core::array::from_fn(|i| buf.token(x, t + i));
                    let Some(views) = all(views) else {
                        return false;
                    };
                    ok &= rows_chunk::<K, TOK>(job, &views, t, rest, b1);
                    t += TOK;
                } else {
                    let Some(view) = buf.token(x, t) else {
                        return false;
                    };
                    ok &= rows_chunk::<K, 1>(job, &[view], t, rest, b1);
                    t += 1;
                }
            }
            b0 = b1;
        }
        t0 = t1;
    }
    ok
}

/// The whole groups of [`LANES`] rows from `b0` (up to `b1`) against the
/// tokens `t0..t1` by the lanes kernels; returns the first row left over.
#[inline(always)]
fn lanes_rows<K: Kernel>(
    job: &Job,
    buf: &ActBuf,
    x: &[f32],
    (t0, t1): (usize, usize),
    b0: usize,
    b1: usize,
    ok: &mut bool,
) -> usize {
    let end = b0 + (b1 - b0) / LANES * LANES;
    if end == b0 {
        return b0;
    }
    let mut t = t0;
    while t < t1 {
        let step = if t + TOK_LANES <= t1 {
            *ok &= lanes_chunk::<K, TOK_LANES>(job, buf, x, t, b0, end);
            TOK_LANES
        } else if t + 8 <= t1 {
            *ok &= lanes_chunk::<K, 8>(job, buf, x, t, b0, end);
            8
        } else if t + 4 <= t1 {
            *ok &= lanes_chunk::<K, 4>(job, buf, x, t, b0, end);
            4
        } else {
            // The last one to three tokens as one chunk: each chunk unpacks
            // the rows' blocks again.
            match t1 - t {
                3 => *ok &= lanes_chunk::<K, 3>(job, buf, x, t, b0, end),
                2 => *ok &= lanes_chunk::<K, 2>(job, buf, x, t, b0, end),
                _ => *ok &= lanes_chunk::<K, 1>(job, buf, x, t, b0, end),
            }
            t1 - t
        };
        t += step;
    }
    end
}

/// Rows `b0..b1` (a multiple of [`LANES`]) against the `T` tokens from `t`
/// by the kernel's lanes dots; false when a view or index was out of range.
#[inline(always)]
fn lanes_chunk<K: Kernel, const T: usize>(
    job: &Job,
    buf: &ActBuf,
    x: &[f32],
    t: usize,
    b0: usize,
    b1: usize,
) -> bool {
    let views: [Option<Act>; T] = core::array::from_fn(|i| buf.token(x, t + i));
    let Some(views) = all(views) else {
        return false;
    };
    let (w, rb) = (&job.w, job.row_bytes);
    let mut ok = true;
    let mut r = b0;
    while r + LANES <= b1 {
        if let Some((p, gb)) = job.packed {
            let g = (r / LANES).checked_mul(gb);
            let group = g.and_then(|lo| p.get(lo..lo.checked_add(gb)?));
            let Some(v) = group.and_then(|g| K::dots_packed::<T>(w.ty, g, &views, w.cols)) else {
                return false;
            };
            for (i, v) in v.iter().enumerate() {
                for (j, &v) in v.iter().enumerate() {
                    ok &= job.out.put((t + i) * w.rows + r + j, v);
                }
            }
            r += LANES;
            continue;
        }
        let rows = r
            .checked_mul(rb)
            .and_then(|lo| w.data.get(lo..lo.checked_add(LANES * rb)?));
        let Some(v) = rows.and_then(|rows| K::dots_lanes::<T>(w.ty, rows, rb, &views, w.cols))
        else {
            return false;
        };
        for (i, v) in v.iter().enumerate() {
            for (j, &v) in v.iter().enumerate() {
                ok &= job.out.put((t + i) * w.rows + r + j, v);
            }
        }
        r += LANES;
    }
    ok
}

/// Rows `b0..b1` against the `T` tokens from `t`.
#[inline(always)]
fn rows_chunk<K: Kernel, const T: usize>(
    job: &Job,
    views: &[Act<'_>; T],
    t: usize,
    b0: usize,
    b1: usize,
) -> bool {
    let (w, rb) = (&job.w, job.row_bytes);
    let mut ok = true;
    let row = |r: usize| r.checked_mul(rb).and_then(|lo| w.data.get(lo..lo + rb));
    // Several rows per pass (independent accumulators).
    let r = if T == 1 {
        multi::<K, ROWS, T>(job, views, t, b0, b1, &mut ok)
    } else {
        multi::<K, ROWS_BATCHED, T>(job, views, t, b0, b1, &mut ok)
    };
    let Some(r) = r else {
        return false;
    };
    for r in r..b1 {
        let Some(row) = row(r) else {
            return false;
        };
        match K::dots::<T>(w.ty, row, views) {
            Some(v) => {
                for (i, v) in v.into_iter().enumerate() {
                    ok &= job.out.put((t + i) * w.rows + r, v);
                }
            }
            None => return false,
        }
    }
    ok
}

/// Rows from `b0` in passes of `R` against the `T` tokens from `t`; the
/// first row left over, or `None` when a row view was out of range.
#[inline(always)]
fn multi<K: Kernel, const R: usize, const T: usize>(
    job: &Job,
    views: &[Act<'_>; T],
    t: usize,
    b0: usize,
    b1: usize,
    ok: &mut bool,
) -> Option<usize> {
    let (w, rb) = (&job.w, job.row_bytes);
    let row = |r: usize| r.checked_mul(rb).and_then(|lo| w.data.get(lo..lo + rb));
    let mut r = b0;
    while r + R <= b1 {
        let rs: [Option<&[u8]>; R] = core::array::from_fn(|i| row(r + i));
        let v = K::dots_rows::<R, T>(w.ty, &all(rs)?, views)?;
        for (i, v) in v.into_iter().enumerate() {
            for (j, v) in v.into_iter().enumerate() {
                *ok &= job.out.put((t + j) * w.rows + r + i, v);
            }
        }
        r += R;
    }
    Some(r)
}

fn all<T: Copy, const N: usize>(a: [Option<T>; N]) -> Option<[T; N]> {
    if a.iter().any(Option::is_none) {
        return None;
    }
    let first = a.iter().flatten().next().copied()?;
    Some(core::array::from_fn(|i| {
        a.get(i).copied().flatten().unwrap_or(first)
    }))
}
