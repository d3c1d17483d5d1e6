//! Argument and spec validation: every input checked against every other
//! before anything is read.
//!
//! # Arithmetic bounds
//!
//! Once [`validate`] passes, every size the rest of `attention` computes
//! with is bounded: `q` (and the output) holds `n_q * t * hd` floats and each
//! pool `n_kv * slots * row_bytes` bytes, both products checked with
//! `checked_mul`; `n_kv >= 1` divides `n_q`; every read run lies inside the
//! pool, every cell run inside `read_len <= slots`; cell offsets have `t + 1`
//! non-decreasing entries. The task geometry adds `rb`, `bpt`, `anchor < KT` and
//! `blocks_per_head >= 1` by construction, and the kernels' blocks hold at
//! most `RB` rows, tiles at most `KT` keys, XNNPACK chunks at most `CHUNK`.
//! So no product, sum, division or index derived from these overflows,
//! divides by zero or leaves its slice: the modules that allow
//! `clippy::arithmetic_side_effects` or `clippy::indexing_slicing` rely on
//! this paragraph, and an out-of-range index there would be a bug, not input.

use super::AttendOptions;
use crate::dtype::KvDtype;
use crate::error::{CacheError, Result};
use crate::runs::Run;
use crate::spec::{AttendSpec, KeyLayout};

/// Proof that [`validate`] passed for a call: the backends run only with one,
/// so each call is checked exactly once.
#[derive(Debug, Clone, Copy)]
pub(super) struct Validated(());

/// Checks every input against every other (`out_len`: floats of the output
/// buffer); nothing is read before this passes.
pub(super) fn validate(
    q: &[f32],
    q_shape: [usize; 3],
    spec: &AttendSpec<'_>,
    opts: &AttendOptions,
    out_len: usize,
) -> Result<Validated> {
    let [n_q_heads, t, hd] = q_shape;
    if spec.head_dim == 0 || spec.n_kv_heads == 0 {
        return Err(CacheError::Shape(format!(
            "spec: expected head_dim > 0 and n_kv_heads > 0, got head_dim {} and n_kv_heads {}",
            spec.head_dim, spec.n_kv_heads
        )));
    }
    let expected_len = n_q_heads
        .checked_mul(t)
        .and_then(|x| x.checked_mul(hd))
        .ok_or_else(|| {
            CacheError::Shape(format!("q shape {q_shape:?}: element count overflows"))
        })?;
    if q.len() != expected_len {
        return Err(CacheError::Shape(format!(
            "q: expected {expected_len} floats for shape {q_shape:?}, got {}",
            q.len()
        )));
    }
    if hd != spec.head_dim {
        return Err(CacheError::Shape(format!(
            "q head_dim: expected {} (the spec's), got {hd}",
            spec.head_dim
        )));
    }
    if t != spec.n_tokens() {
        return Err(CacheError::Shape(format!(
            "q tokens: expected {} (the spec's step), got {t}",
            spec.n_tokens()
        )));
    }
    if n_q_heads == 0 || n_q_heads.checked_rem(spec.n_kv_heads) != Some(0) {
        return Err(CacheError::Shape(format!(
            "q heads: expected a nonzero multiple of n_kv_heads = {}, got {n_q_heads}",
            spec.n_kv_heads
        )));
    }
    for (name, rows) in [("k", spec.k), ("v", spec.v)] {
        rows.dtype
            .check_head_dim(hd)
            .map_err(|e| CacheError::Shape(format!("spec.{name}: {}", e.message())))?;
        let rb = rows.dtype.row_bytes(hd);
        let pool = spec
            .n_kv_heads
            .checked_mul(spec.slots)
            .and_then(|x| x.checked_mul(rb))
            .ok_or_else(|| CacheError::Shape("spec pool size overflows".into()))?;
        let len = rows.bytes.len();
        if len != pool {
            return Err(CacheError::Shape(format!(
                "spec.{name}: expected n_kv_heads*slots*row_bytes = {}*{}*{rb} = {pool} bytes ({} rows of {hd}), got {len}",
                spec.n_kv_heads,
                spec.slots,
                rows.dtype.name()
            )));
        }
        let aligned = match rows.dtype {
            KvDtype::Float32 => rows.f32().is_some(),
            KvDtype::Float16 | KvDtype::Bfloat16 => rows.u16().is_some(),
            KvDtype::Q8_0 => true,
        };
        if !aligned {
            return Err(CacheError::Shape(format!(
                "spec.{name}: expected {} rows aligned to their element size, got a misaligned slice",
                rows.dtype.name()
            )));
        }
    }
    let check_run = |run: &Run, bound: usize, what: &str| -> Result<()> {
        match run.start.checked_add(run.len) {
            Some(end) if end <= bound => Ok(()),
            _ => Err(CacheError::InvalidArgument(format!(
                "{what} run (start {}, len {}): expected inside [0, {bound}), got it past the end",
                run.start, run.len
            ))),
        }
    };
    match spec.keys {
        KeyLayout::Runs { read, .. } => {
            for run in read.as_slice() {
                check_run(run, spec.slots, "read")?;
            }
        }
        KeyLayout::Cells {
            offsets,
            runs,
            read_len,
        } => {
            if read_len > spec.slots {
                return Err(CacheError::InvalidArgument(format!(
                    "cells read_len: expected <= slots = {}, got {read_len}",
                    spec.slots
                )));
            }
            if t.checked_add(1) != Some(offsets.len()) {
                return Err(CacheError::Shape(format!(
                    "cells offsets: expected T + 1 = {} entries, got {}",
                    t.saturating_add(1),
                    offsets.len()
                )));
            }
            let mut prev = 0usize;
            for (i, &o) in offsets.iter().enumerate() {
                if o < prev || o > runs.len() || (i == 0 && o != 0) {
                    return Err(CacheError::InvalidArgument(format!(
                        "cells offsets[{i}]: expected non-decreasing from 0 and <= {} runs, got {o}",
                        runs.len()
                    )));
                }
                prev = o;
            }
            for w in offsets.windows(2) {
                let (a, b) = match w {
                    [a, b] => (*a, *b),
                    _ => continue,
                };
                let tok = runs.get(a..b).unwrap_or(&[]);
                for run in tok {
                    check_run(run, read_len, "cell")?;
                }
                SORTED.with(|s| match s.try_borrow_mut() {
                    Ok(mut sorted) => check_disjoint(tok, &mut sorted),
                    Err(_) => check_disjoint(tok, &mut Vec::new()),
                })?;
            }
        }
    }
    if let Some(s) = opts.scale {
        if !s.is_finite() {
            return Err(CacheError::InvalidArgument(format!(
                "scale: expected a finite number, got {s}"
            )));
        }
    }
    if let Some(c) = opts.softcap {
        if !(c.is_finite() && c > 0.0) {
            return Err(CacheError::InvalidArgument(format!(
                "softcap: expected a finite number > 0, got {c}"
            )));
        }
    }
    if opts.threads == Some(0) {
        return Err(CacheError::InvalidArgument(
            "threads: expected >= 1, got 0".into(),
        ));
    }
    if out_len != q.len() {
        return Err(CacheError::Shape(format!(
            "out: expected {} floats (the size of q), got {out_len}",
            q.len()
        )));
    }
    Ok(Validated(()))
}

thread_local! {
    /// The sorted copy of a token's many out-of-order runs: kept per thread,
    /// so a warm decode step allocates nothing.
    static SORTED: std::cell::RefCell<Vec<Run>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs of a token checked pairwise when out of cell order (a ring that
/// wrapped gives two): no allocation in a warm decode step.
const PAIRWISE_RUNS: usize = 16;

/// Refuses a token's cell runs (in position order, so in any cell order)
/// that name a cell twice: in order of start when they already are, pairwise
/// when few, else through a sorted copy in `sorted` (allocated only for
/// tokens of many runs out of cell order).
fn check_disjoint(runs: &[Run], sorted: &mut Vec<Run>) -> Result<()> {
    let ascending = runs.windows(2).all(|w| match w {
        [a, b] => a.start <= b.start,
        _ => true,
    });
    if !ascending && runs.len() <= PAIRWISE_RUNS {
        for (j, a) in runs.iter().enumerate() {
            for b in runs.iter().skip(j.saturating_add(1)) {
                let overlap = a.start < b.start.saturating_add(b.len)
                    && b.start < a.start.saturating_add(a.len);
                if overlap {
                    return Err(CacheError::InvalidArgument(format!(
                        "cell runs of a token: expected disjoint, got cell {} in two runs",
                        a.start.max(b.start)
                    )));
                }
            }
        }
        return Ok(());
    }
    let runs = if ascending {
        runs
    } else {
        sorted.clear();
        sorted.extend_from_slice(runs);
        sorted.sort_unstable_by_key(|r| r.start);
        sorted.as_slice()
    };
    let mut end = 0usize;
    for (j, run) in runs.iter().enumerate() {
        if j > 0 && run.start < end {
            return Err(CacheError::InvalidArgument(format!(
                "cell runs of a token: expected disjoint, got cell {} in two runs",
                run.start
            )));
        }
        end = end.max(run.start.saturating_add(run.len));
    }
    Ok(())
}
