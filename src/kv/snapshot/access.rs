//! The one place snapshots touch pool bytes: a layer's fingerprint, reading
//! the rows of some slots as stored bytes, and writing stored bytes back.
//! Pools hold float32 today (dtype code 0); a pool of another dtype changes
//! only these functions.

use super::format::{snap_err, LayerPrint};
use crate::config::LayerPolicy;
use crate::error::Result;
use crate::kv::Pool;

/// Dtype codes of the format (append-only).
pub const DTYPE_F32: u8 = 0;
#[allow(dead_code)]
pub const DTYPE_F16: u8 = 1;
#[allow(dead_code)]
pub const DTYPE_BF16: u8 = 2;
#[allow(dead_code)]
pub const DTYPE_Q8_0: u8 = 3;

const F32: usize = std::mem::size_of::<f32>();

/// The fingerprint of a layer with this policy and pool.
pub(crate) fn print(policy: LayerPolicy, pool: &Pool) -> LayerPrint {
    let row = pool.head_dim().saturating_mul(F32);
    LayerPrint {
        policy,
        n_kv_heads: pool.n_heads(),
        head_dim: pool.head_dim(),
        k_dtype: DTYPE_F32,
        v_dtype: DTYPE_F32,
        k_row_bytes: row,
        v_row_bytes: row,
    }
}

/// Appends K as `[heads][slots][row]` bytes, then V alike, for `slots` in order.
pub(crate) fn read_rows(pool: &Pool, slots: &[usize], out: &mut Vec<u8>) -> Result<()> {
    let (d, n) = (pool.head_dim(), pool.slots());
    for buf in [pool.k(), pool.v()] {
        for h in 0..pool.n_heads() {
            for &s in slots {
                let row = h
                    .checked_mul(n)
                    .and_then(|x| x.checked_add(s))
                    .and_then(|x| x.checked_mul(d))
                    .and_then(|a| buf.get(a..a.checked_add(d)?))
                    .filter(|_| s < n)
                    .ok_or_else(|| {
                        snap_err(format!(
                            "slot {s} is beyond the pool's {n} rows (a step left unwritten?)"
                        ))
                    })?;
                for x in row {
                    out.extend_from_slice(&x.to_le_bytes());
                }
            }
        }
    }
    Ok(())
}

/// Bytes `read_rows` produces for `n_pos` positions.
pub(crate) fn rows_len(p: &LayerPrint, n_pos: usize) -> Option<usize> {
    p.position_bytes()?.checked_mul(n_pos)
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
    let decode = |b: &[u8]| -> Vec<f32> {
        b.chunks_exact(F32)
            .map(|c| <[u8; F32]>::try_from(c).map_or(0.0, f32::from_le_bytes))
            .collect()
    };
    let (k, v) = rows.split_at(rows.len() / 2);
    let (k, v) = (decode(k), decode(v));
    for &(t0, slot, count) in runs {
        pool.write_rows(&k, &v, n_pos, t0, slot, count)?;
    }
    Ok(())
}
