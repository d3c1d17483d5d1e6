//! The one place snapshots touch pool bytes: a layer's fingerprint, reading
//! the rows of some slots as stored bytes, and writing stored bytes back.
//! Rows travel as stored (float32, float16, bfloat16 or q8_0 blocks): never
//! converted, so a round trip is bit-exact and costs no re-quantization.

use super::format::{snap_err, LayerPrint, Reader};
use crate::config::{CacheConfig, LayerPolicy};
use crate::error::Result;
use crate::kv::{Pool, Side};

/// Dtype code of float32 rows in the format (the codes are `KvDtype::code`,
/// append-only).
pub const DTYPE_F32: u8 = 0;

/// The fingerprint of a layer with this policy and pool.
fn print(policy: LayerPolicy, pool: &Pool) -> LayerPrint {
    LayerPrint {
        policy,
        n_kv_heads: pool.n_heads(),
        head_dim: pool.head_dim(),
        k_dtype: pool.k_dtype().code(),
        v_dtype: pool.v_dtype().code(),
        k_row_bytes: pool.row_bytes(Side::K),
        v_row_bytes: pool.row_bytes(Side::V),
    }
}

/// The fingerprints of a cache's layers: each layer's policy in `cfg` over
/// its pool.
pub(crate) fn prints<'p>(
    cfg: &CacheConfig,
    pool: impl Fn(usize) -> Result<&'p Pool>,
) -> Result<Vec<LayerPrint>> {
    (0..cfg.n_layers)
        .map(|l| Ok(print(cfg.layer(l)?.policy, pool(l)?)))
        .collect()
}

/// Appends K as `[heads][slots][row]` bytes, then V alike, for `slots` in order.
pub(crate) fn read_rows(pool: &Pool, slots: &[usize], out: &mut Vec<u8>) -> Result<()> {
    let n = pool.rows();
    for side in [Side::K, Side::V] {
        for h in 0..pool.n_heads() {
            for &s in slots {
                let row = pool.row(side, h, s).filter(|_| s < n).ok_or_else(|| {
                    snap_err(format!(
                        "slot {s} is beyond the pool's {n} rows (a step left unwritten?)"
                    ))
                })?;
                out.extend_from_slice(row);
            }
        }
    }
    Ok(())
}

/// Bytes `read_rows` produces for `n_pos` positions.
/// Appends every layer's rows to `out`, in layer order: a ring layer's
/// from the ring table's `ring` slots, a flat layer's from `full`.
pub(crate) fn read_layers<'p>(
    prints: &[LayerPrint],
    pool: impl Fn(usize) -> Result<&'p Pool>,
    full: &[usize],
    ring: &[usize],
    out: &mut Vec<u8>,
) -> Result<()> {
    for (l, p) in prints.iter().enumerate() {
        let slots = if p.policy.window().is_some() {
            ring
        } else {
            full
        };
        read_rows(pool(l)?, slots, out)?;
    }
    Ok(())
}

pub(crate) fn rows_len(p: &LayerPrint, n_pos: usize) -> Option<usize> {
    p.position_bytes()?.checked_mul(n_pos)
}

/// Takes each layer's row block from `r`: `n_pos(layer, print)` positions of
/// `read_rows`' layout, the size checked against the data before taking.
pub(crate) fn take_rows<'a>(
    r: &mut Reader<'a>,
    prints: &[LayerPrint],
    n_pos: impl Fn(usize, &LayerPrint) -> usize,
) -> Result<Vec<&'a [u8]>> {
    let mut rows = Vec::with_capacity(prints.len());
    for (i, p) in prints.iter().enumerate() {
        let len = rows_len(p, n_pos(i, p))
            .ok_or_else(|| snap_err(format!("layer {i}: row bytes overflow")))?;
        rows.push(r.take(len, "rows")?);
    }
    Ok(rows)
}

/// Writes `rows` (`read_rows`' layout for `n_pos` positions) into the pool:
/// each run `(t0, slot, count)` puts positions `t0..t0+count` of the block
/// into slots `slot..slot+count`. The pool must already hold those slots.
pub(crate) fn write_rows(
    pool: &mut Pool,
    rows: &[u8],
    n_pos: usize,
    runs: &[(usize, usize, usize)],
) -> Result<()> {
    let heads = pool.n_heads();
    let (kb, vb) = (pool.row_bytes(Side::K), pool.row_bytes(Side::V));
    let k_len = heads
        .checked_mul(n_pos)
        .and_then(|x| x.checked_mul(kb))
        .ok_or_else(|| snap_err("row block size overflows"))?;
    if rows.len() != k_len.saturating_add(heads.saturating_mul(n_pos).saturating_mul(vb)) {
        return Err(snap_err(format!(
            "row block of {} bytes does not hold {n_pos} positions of this layer",
            rows.len()
        )));
    }
    let (k, v) = rows.split_at(k_len);
    for (side, block, rb) in [(Side::K, k, kb), (Side::V, v, vb)] {
        for h in 0..heads {
            for &(t0, slot, count) in runs {
                for i in 0..count {
                    // h < heads, t0 + i < n_pos: the offset is within the block (checked above).
                    let at = h
                        .saturating_mul(n_pos)
                        .saturating_add(t0.saturating_add(i))
                        .saturating_mul(rb);
                    let bytes = block
                        .get(at..at.saturating_add(rb))
                        .ok_or_else(|| snap_err("row run beyond the block"))?;
                    pool.set_row(side, h, slot.saturating_add(i), bytes)?;
                }
            }
        }
    }
    Ok(())
}
