//! `KvCellCache` chunk snapshots: one sequence's positions `[start, end)`,
//! restored as consecutive chunks from position 0.
//!
//! A whole-prefix cell snapshot (`cell.rs`) repeats every earlier row, so a
//! store that keeps one per chunk boundary holds `n (n + 1) / 2` chunks' rows
//! for `n` chunks. A chunk snapshot carries its own range only, so chunks of a
//! shared prefix are stored once and chained.
//!
//! State after the fingerprint: `start u64, end u64, ring_from u64`. Flat
//! layers carry a row per position of `[start, end)` (a chunk is saved only
//! when the sequence holds all of them). Ring layers carry the positions
//! `[ring_from, end)`: what the ring table still held when the chunk was saved
//! (a suffix, possibly empty: `ring_from == end`). A cache without ring layers
//! writes `ring_from == end`.
//!
//! Loading takes the chunks of `[0, end)` in order and makes one new sequence:
//! flat rows from every chunk; ring rows for the positions the next step needs
//! (from `end - W + 1`, `W` the largest ring window, the ring layers sharing
//! one cell table). Parts that lack one of those are refused as incomplete.

use super::access;
use super::format::{check_prints, open, snap_err, LayerPrint, Reader, Writer, KIND_CHUNK};
use crate::cell::SeqId;
use crate::error::{CacheError, Result};
use crate::kv::KvCellCache;

/// One parsed, checked chunk.
struct Part<'a> {
    start: usize,
    end: usize,
    ring_from: usize,
    rows: Vec<&'a [u8]>,
}

/// `start, end, ring_from` of a chunk snapshot, checked against each other.
pub(crate) fn parse_range(r: &mut Reader<'_>) -> Result<(usize, usize, usize)> {
    let start = r.pos("start")?;
    let end = r.pos("end")?;
    let ring_from = r.pos("ring_from")?;
    if start >= end || ring_from < start || ring_from > end {
        return Err(snap_err(format!(
            "chunk [{start}, {end}) with ring rows from {ring_from} is empty or inconsistent"
        )));
    }
    Ok((start, end, ring_from))
}

fn parse<'a>(r: &mut Reader<'a>, prints: &[LayerPrint]) -> Result<Part<'a>> {
    let (start, end, ring_from) = parse_range(r)?;
    let has_ring = prints.iter().any(|p| p.policy.window().is_some());
    if !has_ring && ring_from != end {
        return Err(snap_err(
            "ring rows in a chunk for a cache without ring layers",
        ));
    }
    let rows = access::take_rows(r, prints, |_, p| {
        if p.policy.window().is_some() {
            end.saturating_sub(ring_from)
        } else {
            end.saturating_sub(start)
        }
    })?;
    r.end()?;
    Ok(Part {
        start,
        end,
        ring_from,
        rows,
    })
}

/// Runs `(t0, cell, count)` writing block positions `t0..` into `cells[c0..]`.
fn runs_of(cells: &[u32], t0: usize, c0: usize, n: usize) -> Vec<(usize, usize, usize)> {
    let mut runs: Vec<(usize, usize, usize)> = Vec::new();
    for i in 0..n {
        let Some(&c) = cells.get(c0.saturating_add(i)) else {
            break;
        };
        let c = c as usize;
        match runs.last_mut() {
            Some(last) if last.1.saturating_add(last.2) == c => last.2 = last.2.saturating_add(1),
            _ => runs.push((t0.saturating_add(i), c, 1)),
        }
    }
    runs
}

impl KvCellCache {
    /// A snapshot of `seq`'s positions `[start, end)`, which it must hold
    /// every one of (`InvalidArgument` otherwise, or for an empty range):
    /// flat rows of the whole range, ring rows of the range's positions the
    /// ring table still holds (a suffix, recorded as such). Chunks from 0 that
    /// meet end to end load as one sequence with [`Self::load_seq_chunks`].
    pub fn save_seq_chunk(&self, seq: SeqId, start: usize, end: usize) -> Result<Vec<u8>> {
        if start >= end {
            return Err(CacheError::InvalidArgument(format!(
                "save_seq_chunk: the range [{start}, {end}) is empty"
            )));
        }
        let cells = self.cells();
        let held = cells.held_ranges(seq, end)?;
        if !held.iter().any(|&(a, b)| a <= start && end <= b) {
            return Err(CacheError::InvalidArgument(format!(
                "save_seq_chunk: sequence {seq} does not hold every position of [{start}, {end})"
            )));
        }
        let in_range = |table: Option<usize>| -> Result<Vec<(usize, u32)>> {
            match table {
                Some(t) => cells.seq_cells_in(seq, t, start, end),
                None => Ok(Vec::new()),
            }
        };
        let full: Vec<usize> = in_range(cells.full_table())?
            .into_iter()
            .map(|(_, c)| c as usize)
            .collect();
        let ring = in_range(cells.ring_table())?;
        let ring_from = ring.first().map_or(end, |r| r.0);
        // The ring table keeps a sequence's newest positions: within a range
        // it held they are the range's tail, one per position.
        if end.saturating_sub(ring_from) != ring.len() {
            return Err(CacheError::InvalidArgument(format!(
                "save_seq_chunk: the ring table's positions of [{start}, {end}) are not its tail"
            )));
        }
        let ring: Vec<usize> = ring.into_iter().map(|(_, c)| c as usize).collect();
        let prints = self.prints()?;
        let hint = prints
            .iter()
            .map(|p| {
                let n = if p.policy.window().is_some() {
                    ring.len()
                } else {
                    full.len()
                };
                access::rows_len(p, n).unwrap_or(0)
            })
            .fold(0usize, usize::saturating_add);
        let mut w = Writer::new(KIND_CHUNK, &prints, hint)?;
        w.pos(start);
        w.pos(end);
        w.pos(ring_from);
        access::read_layers(&prints, |l| self.pool(l), &full, &ring, w.buf())?;
        Ok(w.finish())
    }

    /// Restores chunks `parts` ([`Self::save_seq_chunk`] snapshots of
    /// `[0, e1), [e1, e2), ...`) as one new sequence holding `[0, end)`;
    /// returns its id. All or nothing, every check before a pool grows: a
    /// damaged, foreign, truncated or newer part, parts that do not meet end
    /// to end from 0, or parts lacking a ring row the next step needs
    /// (incomplete) are [`CacheError::Snapshot`] naming the part; no room is
    /// `OutOfCapacity`. The cache is unchanged on any refusal.
    pub fn load_seq_chunks(&mut self, parts: &[&[u8]]) -> Result<SeqId> {
        let prints = self.prints()?;
        let mut chain: Vec<Part<'_>> = Vec::with_capacity(parts.len());
        for (i, data) in parts.iter().enumerate() {
            let part_err = |e: CacheError| match e {
                CacheError::Snapshot(m) => snap_err(format!("part {i}: {m}")),
                e => e,
            };
            let (mut r, found) = open(data, KIND_CHUNK).map_err(part_err)?;
            check_prints(&found, &prints).map_err(part_err)?;
            let p = parse(&mut r, &prints).map_err(part_err)?;
            let want = chain.last().map_or(0, |q| q.end);
            if p.start != want {
                return Err(snap_err(format!(
                    "part {i}: starts at {}, expected {want} (parts run end to end from 0)",
                    p.start
                )));
            }
            chain.push(p);
        }
        let end = chain
            .last()
            .map(|p| p.end)
            .ok_or_else(|| CacheError::InvalidArgument("load_seq_chunks: no parts".into()))?;
        let cells = self.cells();
        let ring_t = cells.ring_table();
        // Ring positions restored: what the next step needs, [lo, end).
        let lo = match ring_t {
            Some(_) => end.saturating_sub(cells.ring_window().saturating_sub(1)),
            None => end,
        };
        for (i, p) in chain.iter().enumerate() {
            if p.end > lo && p.ring_from > p.start.max(lo) {
                return Err(snap_err(format!(
                    "part {i}: incomplete: the next step after {end} needs ring rows from {} and the part carries them from {}",
                    p.start.max(lo),
                    p.ring_from
                )));
            }
        }
        let ring_need = end.saturating_sub(lo);
        self.make_room(&prints, end, ring_need, "load_seq_chunks")?;
        let ring_pos: Vec<usize> = (lo..end).collect();
        let (cells, pools) = self.parts_mut();
        let (id, full_cells, ring_cells) = cells.restore_seq(&[(0, end)], end, &ring_pos)?;
        for p in &chain {
            for (l, pr) in prints.iter().enumerate() {
                let rows = p.rows.get(l).copied().unwrap_or(&[]);
                let (n, runs) = if pr.policy.window().is_some() {
                    // Block position t is p.ring_from + t; ring cell i is lo + i.
                    let from = p.ring_from.max(lo);
                    let n = p.end.saturating_sub(from);
                    let runs = if n == 0 {
                        Vec::new()
                    } else {
                        runs_of(
                            &ring_cells,
                            from.saturating_sub(p.ring_from),
                            from.saturating_sub(lo),
                            n,
                        )
                    };
                    (p.end.saturating_sub(p.ring_from), runs)
                } else {
                    let n = p.end.saturating_sub(p.start);
                    (n, runs_of(&full_cells, 0, p.start, n))
                };
                access::write_rows(pools.get_mut(l)?, rows, n, &runs)?;
            }
        }
        Ok(id)
    }
}
