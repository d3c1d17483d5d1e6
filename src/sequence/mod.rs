//! `SequenceCache`: one sequence, one controller for every layer.
//!
//! One logical length for the whole model; each layer's slot layout comes from
//! its policy. Layers that share a policy share a plan (policies are
//! deduplicated at construction).
//!
//! Single-threaded per sequence: the cache takes `&mut self` for every verb that
//! changes it; share it across threads behind a lock.

mod plan;

pub use plan::SeqStepPlan;

use std::ops::Range;

use crate::config::{CacheConfig, LayerPolicy, PolicyTable};
use crate::error::{CacheError, Result};
use crate::runs::Runs;

/// The step opened by the last successful `begin_step`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Step {
    position: usize,
    n_tokens: usize,
}

/// Bookkeeping for one sequence: lengths, admission, and per-layer plans.
#[derive(Debug, Clone)]
pub struct SequenceCache {
    cfg: CacheConfig,
    /// Distinct policies and which one each layer uses.
    table: PolicyTable,
    length: usize,
    /// Highest length reached since the last clear: what bounds a ring rewind.
    high_water: usize,
    step: Option<Step>,
    /// Per policy, the lowest position a restored snapshot left intact (0: no
    /// restore since the last clear). Positions below it were never written.
    floors: Vec<usize>,
    /// Counts opened and closed steps, so a consumer can tell a stale plan.
    generation: u64,
}

impl SequenceCache {
    /// Validates `cfg` and builds an empty cache.
    pub fn new(cfg: CacheConfig) -> Result<Self> {
        cfg.validate()?;
        let table = cfg.distinct_policies()?;
        let floors = vec![0; table.policies().len()];
        Ok(SequenceCache {
            cfg,
            floors,
            table,
            length: 0,
            high_water: 0,
            step: None,
            generation: 0,
        })
    }

    pub fn config(&self) -> &CacheConfig {
        &self.cfg
    }

    /// Tokens committed so far.
    pub fn length(&self) -> usize {
        self.length
    }

    /// Most tokens the sequence may hold.
    pub fn capacity(&self) -> usize {
        self.cfg.capacity
    }

    /// Whether `n` more tokens fit (in any number of steps).
    pub fn can_extend(&self, n: usize) -> bool {
        self.length
            .checked_add(n)
            .is_some_and(|end| end <= self.cfg.capacity)
    }

    /// Highest length reached since the last clear.
    pub fn high_water(&self) -> usize {
        self.high_water
    }

    /// The distinct policies, and which one each layer uses.
    pub fn policies(&self) -> &[LayerPolicy] {
        self.table.policies()
    }

    /// Index into [`Self::policies`] of a layer's policy.
    pub fn policy_index(&self, layer: usize) -> Result<usize> {
        self.table.index(layer)
    }

    /// A counter that changes whenever a step opens or closes.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Whether a step is open (`plan` serves it).
    pub fn step_open(&self) -> bool {
        self.step.is_some()
    }

    /// The admission gate: checks `1 <= n <= max_step` and room for `n` more
    /// tokens, then commits the step (length grows by `n`) and returns its first
    /// position. A refused call changes nothing and leaves the previous step open.
    pub fn begin_step(&mut self, n_tokens: usize) -> Result<usize> {
        if n_tokens == 0 || n_tokens > self.cfg.max_step {
            return Err(CacheError::InvalidArgument(format!(
                "begin_step: n_tokens must be in 1..=max_step ({}), got {n_tokens}",
                self.cfg.max_step
            )));
        }
        if !self.can_extend(n_tokens) {
            return Err(CacheError::OutOfCapacity(format!(
                "begin_step: {n_tokens} tokens do not fit: length {} + {n_tokens} > capacity {}",
                self.length, self.cfg.capacity
            )));
        }
        let position = self.length;
        // can_extend checked length + n_tokens <= capacity.
        self.length = self.length.saturating_add(n_tokens);
        self.high_water = self.high_water.max(self.length);
        self.step = Some(Step { position, n_tokens });
        self.generation = self.generation.wrapping_add(1);
        Ok(position)
    }

    /// The lowest length a rewind may reach: the next step's queries must find
    /// every key their window needs, so each ring layer bounds it below by
    /// `high_water - max_step` (the ring holds `window + max_step - 1` slots).
    pub fn min_rewind(&self) -> usize {
        let mut lo = 0;
        for (i, p) in self.table.policies().iter().enumerate() {
            if let LayerPolicy::Ring { window } = *p {
                // The next query at new_len needs new_len - window + 1 onwards.
                let oldest_intact = self.oldest_intact(i);
                let need = oldest_intact.saturating_add(window).saturating_sub(1);
                if oldest_intact > 0 {
                    lo = lo.max(need);
                }
            }
        }
        lo.min(self.length)
    }

    /// The lowest position policy `idx`'s pool still holds (0 for a flat
    /// layer): a ring overwrote positions below `high_water - depth`, and a
    /// restored snapshot may have carried only a tail.
    pub fn oldest_intact(&self, idx: usize) -> usize {
        match self.table.policies().get(idx) {
            Some(p @ LayerPolicy::Ring { .. }) => {
                let floor = self.floors.get(idx).copied().unwrap_or(0);
                self.high_water
                    .saturating_sub(self.cfg.depth(*p))
                    .max(floor)
            }
            _ => 0,
        }
    }

    /// Sets the length to `length` after a snapshot wrote the rows of
    /// `[self.length(), length)`, with `floors[i]` the lowest position policy
    /// `i` now holds intact. Closes the step. The byte layer has checked
    /// everything; this only refuses sizes that do not fit the config.
    pub(crate) fn restore(&mut self, length: usize, floors: &[usize]) -> Result<()> {
        if length > self.cfg.capacity || length < self.length || floors.len() != self.floors.len() {
            return Err(CacheError::Snapshot(format!(
                "restore: length {length} with {} floors does not fit (length {}, capacity {}, {} policies)",
                floors.len(),
                self.length,
                self.cfg.capacity,
                self.floors.len()
            )));
        }
        self.floors.copy_from_slice(floors);
        self.length = length;
        self.high_water = self.high_water.max(length);
        self.close_step();
        Ok(())
    }

    /// Drops the tokens from `new_len` on and closes the step. Refused (nothing
    /// changes) above the length or below [`Self::min_rewind`].
    pub fn rewind(&mut self, new_len: usize) -> Result<()> {
        if new_len > self.length {
            return Err(CacheError::InvalidArgument(format!(
                "rewind: new_len {new_len} is above the length {}",
                self.length
            )));
        }
        let lo = self.min_rewind();
        if new_len < lo {
            return Err(CacheError::InvalidArgument(format!(
                "rewind: new_len {new_len} is below {lo}, the oldest length whose window keys a ring layer still holds"
            )));
        }
        self.length = new_len;
        self.close_step();
        Ok(())
    }

    /// Forgets everything and closes the step.
    pub fn clear(&mut self) {
        self.length = 0;
        self.high_water = 0;
        self.floors.fill(0);
        self.close_step();
    }

    fn close_step(&mut self) {
        if self.step.take().is_some() {
            self.generation = self.generation.wrapping_add(1);
        }
    }

    /// Positions whose rows `layer` holds now: `[oldest, length)`, where `oldest`
    /// is the first position its pool has not overwritten (0 for a flat layer;
    /// `high_water - depth` for a ring once it wrapped). It is the cache's own
    /// answer, valid with or without an open step and after any rewind: a
    /// rewind drops positions from the top, and the overwritten ones at the
    /// bottom stay lost until `clear`. The positions of an open step count as
    /// held from `begin_step` on; their rows are what the layer's update wrote.
    pub fn held_range(&self, layer: usize) -> Result<Range<usize>> {
        let policy = self.table.policy(layer)?;
        let oldest = self
            .high_water
            .saturating_sub(self.cfg.depth(policy))
            .min(self.length);
        Ok(oldest..self.length)
    }

    /// The slot runs (oldest first; two when the ring wraps) holding positions
    /// `[lo, hi)` of `layer`. Refused with `InvalidArgument` unless
    /// `lo <= hi` and the range lies within [`Self::held_range`]; an empty
    /// range gives no runs. Pure: it never changes the cache.
    pub fn held_runs(&self, layer: usize, lo: usize, hi: usize) -> Result<Runs> {
        let held = self.held_range(layer)?;
        if lo > hi || lo < held.start || hi > held.end {
            return Err(CacheError::InvalidArgument(format!(
                "held_runs: positions [{lo}, {hi}) of layer {layer} are not held: it holds [{}, {})",
                held.start, held.end
            )));
        }
        let policy = self.table.policy(layer)?;
        Ok(Runs::ring(
            lo,
            hi.saturating_sub(lo),
            self.cfg.depth(policy),
        ))
    }

    /// The plan of the open step for `layer`: pure, the same on every call.
    pub fn plan(&self, layer: usize) -> Result<SeqStepPlan> {
        self.policy_index(layer)?; // a bad layer is refused before a closed step
        let step = self.step.ok_or_else(|| {
            CacheError::StepProtocol(
                "plan: no open step (call begin_step first; rewind and clear close the step)"
                    .to_string(),
            )
        })?;
        let policy = self.table.policy(layer)?;
        Ok(SeqStepPlan::build(
            policy,
            self.cfg.depth(policy),
            step.position,
            step.n_tokens,
        ))
    }
}
