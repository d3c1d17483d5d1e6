//! `KvSequenceCache` snapshots: the rows of positions `[start, end)`.
//!
//! State after the fingerprint: `start u64, end u64`, then per layer
//! `from u64`: the layer carries positions `[from, end)`. A flat layer carries
//! the whole range (`from == start`). A ring layer of window `w` carries only
//! what a following step needs: the earliest query of the next step, at `end`,
//! sees `end - w + 1` onwards, so `[max(start, end - (w - 1)), end)` (a
//! multi-token step's later queries see less, and the step's own rows arrive
//! with it). After loading, a rewind below `end` is refused for such a layer:
//! the history before the carried tail was never written into this cache.
//!
//! A range whose ring tail the source ring already overwrote (an early chunk
//! of a long prompt) carries the intact part only (`from` above its natural
//! start). Such a snapshot is *incomplete*: it loads only as part of a chain
//! ([`KvSequenceCache::load_states`]) whose later members carry the tail the
//! final state needs; the loader computes what every ring layer holds and
//! refuses a chain that would leave a hole.

use super::access;
use super::format::{check_prints, open, snap_err, LayerPrint, Reader, Writer, KIND_SEQ};
use crate::error::{CacheError, Result};
use crate::kv::KvSequenceCache;
use crate::runs::Runs;

/// What a snapshot holds, read without a cache (the store uses it to pick a
/// chain that ends on a complete member).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// 0: a `KvSequenceCache` range; 1: a `KvCellCache` sequence.
    pub kind: u8,
    pub version: u16,
    pub n_layers: usize,
    /// First position carried (kind 0) or 0 (kind 1).
    pub start: usize,
    /// One past the last position: the length after loading (kind 0), the
    /// sequence's next position (kind 1).
    pub end: usize,
    /// Every ring layer carries the tail its next step needs (always true for
    /// kind 1; for kind 2, within the chunk's own range).
    pub complete: bool,
    /// First position every ring layer carries rows from: `end` when none
    /// does (or there are no ring layers; kind 0: `start` then).
    pub ring_from: usize,
}

/// One parsed, checked member of a chain.
struct Parsed<'a> {
    start: usize,
    end: usize,
    froms: Vec<usize>,
    rows: Vec<&'a [u8]>,
}

/// The natural first position a layer carries for `[start, end)`.
fn need_from(p: &LayerPrint, start: usize, end: usize) -> usize {
    match p.policy.window() {
        None => start,
        Some(w) => start.max(end.saturating_sub(w.saturating_sub(1))),
    }
}

fn parse<'a>(r: &mut Reader<'a>, prints: &[LayerPrint]) -> Result<Parsed<'a>> {
    let start = r.pos("start")?;
    let end = r.pos("end")?;
    if start > end {
        return Err(snap_err(format!("start {start} is above end {end}")));
    }
    let mut froms = Vec::with_capacity(prints.len());
    for (i, p) in prints.iter().enumerate() {
        let from = r.pos("from")?;
        let ok = match p.policy.window() {
            None => from == start,
            Some(_) => from >= start && from <= end,
        };
        if !ok {
            return Err(snap_err(format!(
                "layer {i}: carries positions from {from}, outside [{start}, {end}] for its policy"
            )));
        }
        froms.push(from);
    }
    let rows = access::take_rows(r, prints, |i, _| {
        end.saturating_sub(froms.get(i).copied().unwrap_or(end))
    })?;
    r.end()?;
    Ok(Parsed {
        start,
        end,
        froms,
        rows,
    })
}

/// Reads a snapshot's header and state without a cache.
pub fn snapshot_info(data: &[u8]) -> Result<SnapshotInfo> {
    let kind = data.get(10).copied().unwrap_or(u8::MAX);
    let (mut r, prints) = open(data, kind)?;
    let version = u16::from_le_bytes([
        data.get(8).copied().unwrap_or(0),
        data.get(9).copied().unwrap_or(0),
    ]);
    if kind == super::format::KIND_CELL {
        let (next, ring_from) = super::cell::peek_next(&mut r, &prints)?;
        return Ok(SnapshotInfo {
            kind,
            version,
            n_layers: prints.len(),
            start: 0,
            end: next,
            complete: true,
            ring_from,
        });
    }
    if kind == super::format::KIND_CHUNK {
        let (start, end, ring_from) = super::chunk::parse_range(&mut r)?;
        let w = prints
            .iter()
            .filter_map(|p| p.policy.window())
            .max()
            .unwrap_or(0);
        let need = start.max(end.saturating_sub(w.saturating_sub(1)));
        return Ok(SnapshotInfo {
            kind,
            version,
            n_layers: prints.len(),
            start,
            end,
            complete: w == 0 || ring_from <= need,
            ring_from,
        });
    }
    let p = parse(&mut r, &prints)?;
    let complete = prints
        .iter()
        .zip(&p.froms)
        .all(|(pr, &f)| f == need_from(pr, p.start, p.end));
    let ring_from = prints
        .iter()
        .zip(&p.froms)
        .filter(|(pr, _)| pr.policy.window().is_some())
        .map(|(_, &f)| f)
        .max()
        .unwrap_or(p.start);
    Ok(SnapshotInfo {
        kind,
        version,
        n_layers: prints.len(),
        start: p.start,
        end: p.end,
        complete,
        ring_from,
    })
}

impl KvSequenceCache {
    fn prints(&self) -> Result<Vec<LayerPrint>> {
        access::prints(self.config(), |l| self.pool(l))
    }

    /// A snapshot of positions `[0, upto)` (`None`: the whole length) that
    /// [`Self::load_state`] restores into an empty cache of the same layout.
    /// Refused (`InvalidArgument`) when `upto` is above the length or a ring
    /// layer no longer holds the tail `upto` needs. Take it between steps: a
    /// step whose layers are not all updated holds unwritten rows.
    pub fn save_state(&self, upto: Option<usize>) -> Result<Vec<u8>> {
        self.save_snapshot(0, upto.unwrap_or(self.length()), true)
    }

    /// A snapshot of positions `[start, upto)`, for prefix chunks: it loads
    /// into a cache whose length is `start`, alone or in a chain
    /// ([`Self::load_states`]). A ring layer carries what it still holds of
    /// the tail it needs, so an early chunk of a long sequence may be
    /// incomplete (see the module docs); it is never wrong.
    pub fn save_range(&self, start: usize, upto: usize) -> Result<Vec<u8>> {
        self.save_snapshot(start, upto, false)
    }

    fn save_snapshot(&self, start: usize, upto: usize, complete: bool) -> Result<Vec<u8>> {
        if upto > self.length() || start > upto {
            return Err(CacheError::InvalidArgument(format!(
                "snapshot: positions [{start}, {upto}) are not within the length {}",
                self.length()
            )));
        }
        let prints = self.prints()?;
        let seq = self.sequence();
        let mut froms = Vec::with_capacity(prints.len());
        let mut hint = 0usize;
        for (l, p) in prints.iter().enumerate() {
            let need = need_from(p, start, upto);
            let intact = seq.oldest_intact(seq.policy_index(l)?);
            let from = need.max(intact).min(upto);
            if complete && from > need {
                return Err(CacheError::InvalidArgument(format!(
                    "save_state: upto {upto} needs position {need} of ring layer {l}, which it no longer holds (it holds {intact} onwards)"
                )));
            }
            hint = hint.saturating_add(access::rows_len(p, upto.saturating_sub(from)).unwrap_or(0));
            froms.push(from);
        }
        let mut w = Writer::new(KIND_SEQ, &prints, hint)?;
        w.pos(start);
        w.pos(upto);
        for &f in &froms {
            w.pos(f);
        }
        let mut slots = Vec::new();
        for (l, (p, &from)) in prints.iter().zip(&froms).enumerate() {
            let depth = self.config().depth(p.policy);
            slots.clear();
            for run in Runs::ring(from, upto.saturating_sub(from), depth).as_slice() {
                slots.extend(run.start..run.end());
            }
            access::read_rows(self.pool(l)?, &slots, w.buf())?;
        }
        Ok(w.finish())
    }

    /// Restores a [`Self::save_state`] snapshot (or any complete range that
    /// starts at this cache's length). All or nothing: a truncated, damaged,
    /// foreign, newer-format or non-continuing snapshot is
    /// [`CacheError::Snapshot`] and the cache is unchanged.
    pub fn load_state(&mut self, data: &[u8]) -> Result<()> {
        self.load_states(&[data])
    }

    /// Restores a chain of ranges, the first starting at this cache's length
    /// and each starting where the previous ends, as one all-or-nothing load.
    /// Every size a snapshot claims (each layer's rows against its depth, the
    /// end against the capacity) is checked against this cache's layout and
    /// the data's length before any pool is touched: a refusal changes
    /// nothing, pool sizes included.
    pub fn load_states(&mut self, chain: &[&[u8]]) -> Result<()> {
        let prints = self.prints()?;
        let mut parsed = Vec::with_capacity(chain.len());
        for (i, data) in chain.iter().enumerate() {
            let (mut r, found) = open(data, KIND_SEQ).map_err(|e| chain_err(i, e))?;
            check_prints(&found, &prints).map_err(|e| chain_err(i, e))?;
            parsed.push(parse(&mut r, &prints).map_err(|e| chain_err(i, e))?);
        }
        let (Some(first), Some(last)) = (parsed.first(), parsed.last()) else {
            return Err(snap_err("load_states: an empty chain"));
        };
        if first.start != self.length() {
            return Err(snap_err(format!(
                "snapshot starts at position {}, this cache's length is {} (load_state needs an empty cache, a range the length it starts at)",
                first.start,
                self.length()
            )));
        }
        let end = last.end;
        if end > self.capacity() {
            return Err(snap_err(format!(
                "snapshot ends at position {end}, beyond this cache's capacity {}",
                self.capacity()
            )));
        }
        for (i, pair) in parsed.windows(2).enumerate() {
            if let [a, b] = pair {
                if b.start != a.end {
                    return Err(snap_err(format!(
                        "chain member {} starts at {}, the previous one ends at {}",
                        i.saturating_add(1),
                        b.start,
                        a.end
                    )));
                }
            }
        }
        // What each layer holds intact after the load, merged per policy.
        let seq = self.sequence();
        let mut floors = vec![0usize; seq.policies().len()];
        for (l, p) in prints.iter().enumerate() {
            let Some(w) = p.policy.window() else {
                continue;
            };
            let pi = seq.policy_index(l)?;
            let mut floor = end;
            let mut reached = true;
            for s in parsed.iter().rev() {
                let from = s.froms.get(l).copied().unwrap_or(s.end);
                floor = from;
                if from > s.start {
                    reached = false;
                    break;
                }
            }
            if reached {
                floor = seq.oldest_intact(pi).min(first.start);
            }
            if floor > 0 && floor.saturating_add(w.saturating_sub(1)) > end {
                return Err(snap_err(format!(
                    "ring layer {l} (window {w}) would hold positions from {floor} only, but its next step at {end} needs {} onwards: the chain misses a tail",
                    end.saturating_sub(w.saturating_sub(1))
                )));
            }
            if let Some(f) = floors.get_mut(pi) {
                *f = (*f).max(floor);
            }
        }
        // Every layer's rows against its depth before any pool is touched: a
        // ring layer carrying more positions than it has slots would overwrite
        // its own rows (and ask its pool for slots past the depth).
        let cfg = self.config().clone();
        let mut needed = vec![0usize; prints.len()];
        for (l, (p, need)) in prints.iter().zip(needed.iter_mut()).enumerate() {
            let depth = cfg.depth(p.policy);
            for (i, s) in parsed.iter().enumerate() {
                let from = s.froms.get(l).copied().unwrap_or(s.end);
                let n = s.end.saturating_sub(from);
                if n > depth {
                    return Err(chain_err(
                        i,
                        snap_err(format!(
                            "layer {l}: carries {n} positions [{from}, {}), more than its {depth} slots",
                            s.end
                        )),
                    ));
                }
                for run in Runs::ring(from, n, depth).as_slice() {
                    *need = (*need).max(run.end());
                }
            }
        }
        // Room (growth may fail), then the rows, then the length.
        let (seq, pools) = self.parts_mut();
        for (l, &need) in needed.iter().enumerate() {
            pools.get_mut(l)?.ensure(need)?;
        }
        for s in &parsed {
            for (l, p) in prints.iter().enumerate() {
                let from = s.froms.get(l).copied().unwrap_or(s.end);
                let n = s.end.saturating_sub(from);
                let mut runs = Vec::with_capacity(2);
                let mut t0 = 0usize;
                for run in Runs::ring(from, n, cfg.depth(p.policy)).as_slice() {
                    runs.push((t0, run.start, run.len));
                    t0 = t0.saturating_add(run.len);
                }
                let rows = s.rows.get(l).copied().unwrap_or(&[]);
                access::write_rows(pools.get_mut(l)?, rows, n, &runs)?;
            }
        }
        seq.restore(end, &floors)
    }
}

fn chain_err(i: usize, e: CacheError) -> CacheError {
    match e {
        CacheError::Snapshot(m) if i > 0 => CacheError::Snapshot(format!("chain member {i}: {m}")),
        e => e,
    }
}
