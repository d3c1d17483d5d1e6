//! Speculative decoding over the cell cache.
//!
//! A sequence's decode is bound by reading every weight once per step, so a
//! step that scores several tokens costs about one that scores one. Each
//! [`Speculator::step`] drafts up to `k` tokens per sequence ([`ngram`]:
//! prompt lookup over its own tokens; [`draft_model`]: a smaller model of
//! the same vocabulary), scores every sequence's pending token and drafts in
//! one forward (logits for every row), keeps the prefix the target's
//! sampling would have produced ([`verify`]) and drops the rejected cells
//! with `seq_rm` (a sequence may rewind within `max_step` of its highest
//! position, so the verification step's own tokens always can be).
//!
//! Greedy output is unchanged: the engine's logits for a row are the same
//! bits whether the row is scored alone or in a step with others (see
//! `docs/guarantees.md`), and greedy acceptance keeps exactly the tokens
//! plain decode would pick. A draft's length is the one with the most
//! expected tokens per second, from the sequence's acceptance and the
//! measured cost of a forward by its token count ([`adapt`]), within the
//! step's width, so a full batch drafts little.

pub mod adapt;
pub mod draft_model;
pub mod ngram;
pub mod sample;
pub mod verify;

pub use adapt::{Acceptance, StepCost};
pub use draft_model::{check_same_vocab, DraftModel, Proposal};
pub use ngram::Ngram;
pub use sample::{Rng, Sampling};
pub use verify::{verify, Verdict};

use crate::error::{EngineError, Result};
use crate::model::Model;
use offgraph_kv::{KvCellCache, SeqId};

/// Where drafts come from.
#[derive(Debug)]
pub enum Source {
    /// Prompt lookup over each sequence's own tokens.
    Ngram(Ngram),
    /// A draft model of the target's vocabulary.
    Model(Box<DraftModel>),
}

/// Drafted and accepted counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpecStats {
    /// Verification steps (one per sequence per step).
    pub steps: u64,
    /// Tokens drafted and scored.
    pub drafted: u64,
    /// Drafted tokens kept.
    pub accepted: u64,
    /// Tokens produced (the kept drafts and one token from the target per step).
    pub emitted: u64,
}

impl SpecStats {
    /// Accepted over drafted (0 when nothing was drafted).
    pub fn acceptance(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            self.accepted as f64 / self.drafted as f64
        }
    }

    fn add(&mut self, o: &SpecStats) {
        self.steps += o.steps;
        self.drafted += o.drafted;
        self.accepted += o.accepted;
        self.emitted += o.emitted;
    }
}

/// One sequence being decoded: its tokens, of which the cache holds all but
/// the last (the pending token the next step feeds).
#[derive(Debug, Clone)]
pub struct Stream {
    seq: SeqId,
    tokens: Vec<u32>,
    acc: Acceptance,
    last_draft: usize,
    rng: Rng,
    remaining: Option<usize>,
    stats: SpecStats,
}

impl Stream {
    pub fn seq(&self) -> SeqId {
        self.seq
    }

    /// Every token so far: the prompt, then what was generated.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn stats(&self) -> SpecStats {
        self.stats
    }

    /// Tokens drafted for it in its last step.
    pub fn draft_len(&self) -> usize {
        self.last_draft
    }

    /// Its estimated chance that a draft token is accepted.
    pub fn acceptance(&self) -> f64 {
        self.acc.p()
    }

    /// Tokens still wanted (`None`: no bound): drafts never run past it.
    pub fn set_remaining(&mut self, n: Option<usize>) {
        self.remaining = n;
    }
}

/// Drives speculative decode steps for any number of sequences.
#[derive(Debug)]
pub struct Speculator {
    source: Source,
    sampling: Sampling,
    k_max: usize,
    step_tokens: Option<usize>,
    cost: StepCost,
    stats: SpecStats,
    rng: Rng,
}

impl Speculator {
    /// Drafts of 1 to `k_max` tokens from `source`, tokens picked as
    /// `sampling` picks. `InvalidArgument` for `k_max` 0 or a temperature
    /// that is not finite and above 0.
    pub fn new(source: Source, sampling: Sampling, k_max: usize) -> Result<Speculator> {
        if k_max == 0 {
            return Err(EngineError::InvalidArgument(
                "speculation: the longest draft must be at least 1 token, got 0".into(),
            ));
        }
        if let Sampling::Temperature(t) = sampling {
            if !(t.is_finite() && t > 0.0) {
                return Err(EngineError::InvalidArgument(format!(
                    "speculation: expected a finite temperature above 0, got {t}"
                )));
            }
        }
        Ok(Speculator {
            source,
            sampling,
            k_max,
            step_tokens: None,
            cost: StepCost::measured(),
            stats: SpecStats::default(),
            rng: Rng::new(0x5EED),
        })
    }

    /// Caps the tokens of one step (pending and drafted, over all sequences)
    /// below the cache's `max_step`: a full batch then drafts less. At least 1.
    pub fn set_step_tokens(&mut self, n: usize) {
        self.step_tokens = Some(n.max(1));
    }

    /// Prices forwards by `cost` instead of timing them (for example
    /// [`StepCost::fixed`] with what `okv-bench` measured).
    pub fn set_step_cost(&mut self, cost: StepCost) {
        self.cost = cost;
    }

    /// What a forward costs by its token count, as measured or fixed.
    pub fn step_cost(&self) -> &StepCost {
        &self.cost
    }

    /// Every step's counts, all sequences.
    pub fn stats(&self) -> SpecStats {
        self.stats
    }

    pub fn source(&self) -> &Source {
        &self.source
    }

    /// A stream for `seq`, whose cache holds `tokens` but the last (`seed`:
    /// its sampling stream). `InvalidArgument` for no tokens or a sequence
    /// holding other than `tokens.len() - 1` positions.
    pub fn stream(
        &self,
        cache: &KvCellCache,
        seq: SeqId,
        tokens: Vec<u32>,
        seed: u64,
    ) -> Result<Stream> {
        let held = cache.cells().next_pos(seq)?;
        if tokens.is_empty() || held + 1 != tokens.len() {
            return Err(EngineError::InvalidArgument(format!(
                "speculation: sequence {seq} holds {held} positions; expected its {} tokens but \
                 the pending last one",
                tokens.len()
            )));
        }
        Ok(Stream {
            seq,
            tokens,
            acc: Acceptance::default(),
            last_draft: 0,
            rng: Rng::new(seed),
            remaining: None,
            stats: SpecStats::default(),
        })
    }

    /// Forgets what the draft source keeps for `seq` (call when it ends).
    pub fn release(&mut self, seq: SeqId) {
        if let Source::Model(d) = &mut self.source {
            d.release(seq);
        }
    }

    /// One step of every stream: drafts, one verifying forward, acceptance,
    /// rejected cells dropped. Returns each stream's new tokens (at least
    /// one each; appended to the stream too).
    ///
    /// Refused with nothing changed (`InvalidArgument`, `Cache`): no
    /// streams, one sequence twice, a sequence that is not live or holds
    /// other positions than its stream says, more streams than `max_step`.
    pub fn step(
        &mut self,
        model: &Model,
        cache: &mut KvCellCache,
        streams: &mut [Stream],
    ) -> Result<Vec<Vec<u32>>> {
        self.check(cache, streams)?;
        let ks = self.share_out(cache, streams);
        let drafts = self.draft(streams, &ks)?;
        for (s, d) in streams.iter_mut().zip(&drafts) {
            s.last_draft = d.tokens.len();
            if !d.tokens.is_empty() {
                s.acc.idle = 0; // one that found no draft probes again next step
            }
        }

        let (mut toks, mut seqs, mut pos) = (Vec::new(), Vec::new(), Vec::new());
        for (s, d) in streams.iter().zip(&drafts) {
            let p0 = s.tokens.len() - 1;
            let last = s.tokens.last().copied().unwrap_or_default();
            for (i, &t) in std::iter::once(&last).chain(&d.tokens).enumerate() {
                toks.push(t);
                seqs.push(s.seq);
                pos.push(p0 + i);
            }
        }
        let rows: Vec<usize> = (0..toks.len()).collect();
        let t0 = std::time::Instant::now();
        let logits = model.forward(cache, &toks, &seqs, &pos, &rows)?;
        self.cost.record(toks.len(), t0.elapsed().as_secs_f64());

        let vocab = model.config().vocab;
        let mut out = Vec::with_capacity(streams.len());
        let mut row0 = 0usize;
        for (s, d) in streams.iter_mut().zip(&drafts) {
            let k = d.tokens.len();
            let rows = logits
                .get(row0 * vocab..(row0 + k + 1) * vocab)
                .unwrap_or_default();
            row0 += k + 1;
            let q = d.q.as_deref().filter(|q| q.len() == k);
            let v = verify(&d.tokens, rows, vocab, self.sampling, q, &mut s.rng)?;
            let keep = s.tokens.len() + v.accepted;
            if v.accepted < k {
                cache.cells_mut().seq_rm(s.seq, keep, None)?;
            }
            let mut new: Vec<u32> = d.tokens.get(..v.accepted).unwrap_or_default().to_vec();
            new.push(v.next);
            s.tokens.extend_from_slice(&new);
            s.acc.record(k, v.accepted);
            s.remaining = s.remaining.map(|r| r.saturating_sub(new.len()));
            let st = SpecStats {
                steps: 1,
                drafted: k as u64,
                accepted: v.accepted as u64,
                emitted: new.len() as u64,
            };
            s.stats.add(&st);
            self.stats.add(&st);
            out.push(new);
        }
        Ok(out)
    }

    fn check(&self, cache: &KvCellCache, streams: &[Stream]) -> Result<()> {
        let max_step = cache.config().max_step;
        if streams.is_empty() || streams.len() > max_step {
            return Err(EngineError::InvalidArgument(format!(
                "speculation step: expected 1 to max_step ({max_step}) streams, got {}",
                streams.len()
            )));
        }
        for (i, s) in streams.iter().enumerate() {
            if streams
                .get(..i)
                .is_some_and(|b| b.iter().any(|o| o.seq == s.seq))
            {
                return Err(EngineError::InvalidArgument(format!(
                    "speculation step: sequence {} is given twice",
                    s.seq
                )));
            }
            let held = cache.cells().next_pos(s.seq)?;
            if held + 1 != s.tokens.len() {
                return Err(EngineError::InvalidArgument(format!(
                    "speculation step: sequence {} holds {held} positions but its stream has {} \
                     tokens (expected one more than held)",
                    s.seq,
                    s.tokens.len()
                )));
            }
        }
        Ok(())
    }

    /// Each stream's draft length this step: the best by its acceptance and
    /// the step cost ([`adapt::choose`]; every [`adapt::PROBE_EVERY`] idle
    /// steps at least one), short of its remaining tokens, within the step's
    /// width and the free cells, streams in order.
    fn share_out(&self, cache: &KvCellCache, streams: &mut [Stream]) -> Vec<usize> {
        let width = cache
            .config()
            .max_step
            .min(self.step_tokens.unwrap_or(usize::MAX));
        let free = cache.cells().free_cells();
        let mut budget = width.min(free).saturating_sub(streams.len());
        let mut in_step = streams.len();
        streams
            .iter_mut()
            .map(|s| {
                let room = s.remaining.map_or(usize::MAX, |r| r.saturating_sub(1));
                let cap = self.k_max.min(room).min(budget);
                if cap == 0 {
                    return 0;
                }
                let p = s.acc.p();
                let mut k = adapt::choose(&self.cost, in_step, cap, p);
                if k == 0 {
                    s.acc.idle += 1;
                    if s.acc.idle < adapt::PROBE_EVERY {
                        return 0;
                    }
                    k = adapt::best_positive(&self.cost, in_step, cap, p);
                }
                budget -= k;
                in_step += k;
                k
            })
            .collect()
    }

    fn draft(&mut self, streams: &[Stream], ks: &[usize]) -> Result<Vec<Proposal>> {
        match &mut self.source {
            Source::Ngram(g) => Ok(streams
                .iter()
                .zip(ks)
                .map(|(s, &k)| Proposal {
                    tokens: g.draft(&s.tokens, k),
                    q: None,
                })
                .collect()),
            Source::Model(d) => {
                let targets: Vec<SeqId> = streams.iter().map(|s| s.seq).collect();
                let hist: Vec<&[u32]> = streams.iter().map(|s| s.tokens.as_slice()).collect();
                d.propose(&targets, &hist, ks, self.sampling, &mut self.rng)
            }
        }
    }
}
