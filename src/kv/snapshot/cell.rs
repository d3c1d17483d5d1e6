//! `KvCellCache` sequence snapshots.
//!
//! State after the fingerprint: `n_ranges u32`, then the held positions below
//! `upto` as `(start u64, end u64)` ranges (sorted, disjoint, non-adjacent);
//! `n_ring u32`, then the ring-table positions carried (`u64` each). Flat
//! layers carry a row per held position (in order); ring layers carry a row
//! per ring position: the held positions above `next - W`, where `next` is
//! one past the last held position and `W` the largest ring window (what the
//! next step's earliest query needs; the ring layers share one cell table).
//! Loading makes a new sequence id; positions and bytes are as saved, cells
//! are whatever the loading cache has free.

use super::access;
use super::format::{check_prints, open, snap_err, LayerPrint, Reader, Writer, KIND_CELL};
use crate::cell::SeqId;
use crate::error::{CacheError, Result};
use crate::kv::KvCellCache;

struct Parsed<'a> {
    held: Vec<(usize, usize)>,
    held_count: usize,
    ring: Vec<usize>,
    rows: Vec<&'a [u8]>,
}

/// Held ranges, their position count, and the ring positions.
type Positions = (Vec<(usize, usize)>, usize, Vec<usize>);

/// Ranges and ring positions; sizes bounded by the data before allocating.
fn parse_positions(r: &mut Reader<'_>) -> Result<Positions> {
    let n = r.u32("n_ranges")? as usize;
    if n.saturating_mul(16) > r.remaining() {
        return Err(snap_err(format!("truncated: {n} ranges claimed")));
    }
    let mut held = Vec::with_capacity(n);
    let mut count = 0usize;
    let mut prev_end: Option<usize> = None;
    for _ in 0..n {
        let (a, b) = (r.pos("range start")?, r.pos("range end")?);
        if a >= b || b == usize::MAX || prev_end.is_some_and(|e| a <= e) {
            return Err(snap_err(format!(
                "held range [{a}, {b}) is empty, unordered or overlapping"
            )));
        }
        count = count.saturating_add(b.saturating_sub(a));
        prev_end = Some(b);
        held.push((a, b));
    }
    let m = r.u32("n_ring")? as usize;
    if m.saturating_mul(8) > r.remaining() {
        return Err(snap_err(format!("truncated: {m} ring positions claimed")));
    }
    let mut ring = Vec::with_capacity(m);
    for _ in 0..m {
        let p = r.pos("ring position")?;
        if ring.last().is_some_and(|&q| p <= q) {
            return Err(snap_err("ring positions are not strictly increasing"));
        }
        ring.push(p);
    }
    Ok((held, count, ring))
}

/// One past the last held position of a cell snapshot (for `snapshot_info`).
/// and the first ring position carried (`next` when none is).
pub(crate) fn peek_next(r: &mut Reader<'_>, _prints: &[LayerPrint]) -> Result<(usize, usize)> {
    let (held, _, ring) = parse_positions(r)?;
    let next = held.last().map_or(0, |h| h.1);
    Ok((next, ring.first().copied().unwrap_or(next)))
}

fn held_contains(held: &[(usize, usize)], p: usize) -> bool {
    let k = held.partition_point(|h| h.0 <= p);
    k.checked_sub(1)
        .and_then(|i| held.get(i))
        .is_some_and(|h| p < h.1)
}

/// Held positions at or above `x`.
fn count_from(held: &[(usize, usize)], x: usize) -> usize {
    held.iter()
        .map(|&(a, b)| b.saturating_sub(a.max(x)).min(b.saturating_sub(a)))
        .sum()
}

/// Consecutive cells as `(t0, cell, count)` runs.
fn cell_runs(cells: &[u32]) -> Vec<(usize, usize, usize)> {
    let mut runs: Vec<(usize, usize, usize)> = Vec::new();
    for (t, &c) in cells.iter().enumerate() {
        let c = c as usize;
        match runs.last_mut() {
            Some(last) if last.1.saturating_add(last.2) == c => last.2 = last.2.saturating_add(1),
            _ => runs.push((t, c, 1)),
        }
    }
    runs
}

impl KvCellCache {
    pub(super) fn prints(&self) -> Result<Vec<LayerPrint>> {
        access::prints(self.config(), |l| self.pool(l))
    }

    /// A snapshot of `seq`'s positions below `upto` (`None`: all) that
    /// [`Self::load_seq`] restores as a new sequence, here or in another
    /// cache of the same layout. Refused when `seq` is not live, or when the
    /// ring table no longer holds a position the next step after `upto` needs.
    pub fn save_seq(&self, seq: SeqId, upto: Option<usize>) -> Result<Vec<u8>> {
        let cells = self.cells();
        let upto = upto.unwrap_or(usize::MAX);
        let held = cells.held_ranges(seq, upto)?;
        let next = held.last().map_or(0, |h| h.1);
        let w = cells.ring_window();
        let mut ring_pos: Vec<usize> = Vec::new();
        let mut ring_cells: Vec<usize> = Vec::new();
        if let Some(rt) = cells.ring_table() {
            let lo = next.saturating_sub(w.saturating_sub(1));
            for (p, c) in cells.seq_cells(seq, rt)? {
                if p >= lo && p < upto {
                    ring_pos.push(p);
                    ring_cells.push(c as usize);
                }
            }
            if count_from(&held, lo) != ring_pos.len() {
                return Err(CacheError::InvalidArgument(format!(
                    "save_seq: sequence {seq} up to {next} needs its positions from {lo} in the ring table, which already dropped some"
                )));
            }
        }
        let full_cells: Vec<usize> = match cells.full_table() {
            Some(ft) => cells
                .seq_cells(seq, ft)?
                .into_iter()
                .filter(|(p, _)| *p < upto)
                .map(|(_, c)| c as usize)
                .collect(),
            None => Vec::new(),
        };
        let prints = self.prints()?;
        let mut w = Writer::new(KIND_CELL, &prints, 0)?;
        w.u32(u32::try_from(held.len()).map_err(|_| snap_err("too many ranges"))?);
        for &(a, b) in &held {
            w.pos(a);
            w.pos(b);
        }
        w.u32(u32::try_from(ring_pos.len()).map_err(|_| snap_err("too many ring rows"))?);
        for &p in &ring_pos {
            w.pos(p);
        }
        access::read_layers(&prints, |l| self.pool(l), &full_cells, &ring_cells, w.buf())?;
        Ok(w.finish())
    }

    /// Restores a [`Self::save_seq`] snapshot as a new sequence and returns
    /// its id. All or nothing: a truncated, damaged, foreign or newer-format
    /// snapshot is [`CacheError::Snapshot`], no room is `OutOfCapacity`, and
    /// the cache is unchanged, its pools included (every check runs before a
    /// pool grows).
    pub fn load_seq(&mut self, data: &[u8]) -> Result<SeqId> {
        let prints = self.prints()?;
        let (mut r, found) = open(data, KIND_CELL)?;
        check_prints(&found, &prints)?;
        let p = self.parse(&mut r, &prints)?;
        self.make_room(&prints, p.held_count, p.ring.len(), "load_seq")?;
        let (cells, pools) = self.parts_mut();
        let (id, full_cells, ring_cells) = cells.restore_seq(&p.held, p.held_count, &p.ring)?;
        let (full_runs, ring_runs) = (cell_runs(&full_cells), cell_runs(&ring_cells));
        for (l, pr) in prints.iter().enumerate() {
            let (runs, n) = if pr.policy.window().is_some() {
                (&ring_runs, ring_cells.len())
            } else {
                (&full_runs, full_cells.len())
            };
            let rows = p.rows.get(l).copied().unwrap_or(&[]);
            access::write_rows(pools.get_mut(l)?, rows, n, runs)?;
        }
        Ok(id)
    }

    /// Refuses a restore of `need_full` flat-table and `need_ring`
    /// ring-table cells the cache has no room or no sequence id for
    /// (`OutOfCapacity`, naming `what`), else grows every pool to cover the
    /// cells it will take: the lowest free ones, so below occupied + taken.
    /// Nothing changes on a refusal (every check runs before a pool grows).
    pub(super) fn make_room(
        &mut self,
        prints: &[LayerPrint],
        need_full: usize,
        need_ring: usize,
        what: &str,
    ) -> Result<()> {
        let cells = self.cells();
        let (full_t, ring_t) = (cells.full_table(), cells.ring_table());
        let need_full = if full_t.is_some() { need_full } else { 0 };
        let room = |t: Option<usize>, need: usize| -> Result<usize> {
            let Some(t) = t else { return Ok(0) };
            let free = cells.free_cells_in(t)?;
            if need > free {
                return Err(CacheError::OutOfCapacity(format!(
                    "{what}: the sequence needs {need} cells of table {t}, {free} free"
                )));
            }
            let occupied = cells.capacity().saturating_sub(free);
            Ok(occupied.saturating_add(need).min(cells.capacity()))
        };
        let (grow_full, grow_ring) = (room(full_t, need_full)?, room(ring_t, need_ring)?);
        if cells.live_seqs().len() >= cells.n_seq_max() {
            return Err(CacheError::OutOfCapacity(format!(
                "{what}: all {} sequence ids are live (n_seq_max)",
                cells.n_seq_max()
            )));
        }
        let (_, pools) = self.parts_mut();
        for (l, pr) in prints.iter().enumerate() {
            let n = if pr.policy.window().is_some() {
                grow_ring
            } else {
                grow_full
            };
            pools.get_mut(l)?.ensure(n)?;
        }
        Ok(())
    }

    fn parse<'a>(&self, r: &mut Reader<'a>, prints: &[LayerPrint]) -> Result<Parsed<'a>> {
        let cells = self.cells();
        let (held, held_count, ring) = parse_positions(r)?;
        let next = held.last().map_or(0, |h| h.1);
        // Only what the data says of itself is checked here (a refusal is a
        // Snapshot error: damaged). Whether this cache has the cells for it is
        // `load_seq`'s room check (OutOfCapacity: an intact snapshot from a
        // larger cache is no room here, not damage).
        match cells.ring_table() {
            None if !ring.is_empty() => {
                return Err(snap_err(
                    "ring rows in a snapshot for a cache without ring layers",
                ));
            }
            None => {}
            Some(_) => {
                let keep = cells.ring_keep().unwrap_or(0);
                let lo = next.saturating_sub(cells.ring_window().saturating_sub(1));
                let first = ring.first().copied().unwrap_or(next);
                // The ring rows are exactly the held positions the next step
                // needs (a suffix of the held ones, from `lo`), as `save_seq`
                // writes them: more rows than that, or a hole, is damage
                // whatever the room, so a shared store deletes such a value
                // rather than keeping it as a miss for a larger cache.
                if ring.len() > keep
                    || count_from(&held, first) != ring.len()
                    || count_from(&held, lo) != ring.len()
                    || !ring.iter().all(|&q| held_contains(&held, q))
                {
                    return Err(snap_err(format!(
                        "ring positions ({} carried) are not the held tail from {lo} the next step needs (at most {keep})",
                        ring.len()
                    )));
                }
            }
        }
        let rows = access::take_rows(r, prints, |_, pr| {
            if pr.policy.window().is_some() {
                ring.len()
            } else {
                held_count
            }
        })?;
        r.end()?;
        Ok(Parsed {
            held,
            held_count,
            ring,
            rows,
        })
    }
}
