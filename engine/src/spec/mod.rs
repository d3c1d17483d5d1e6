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
//! plain decode would pick. Draft lengths adapt to acceptance ([`adapt`]),
//! and a step's width is shared out so a full batch drafts little.

pub mod adapt;
pub mod draft_model;
pub mod ngram;
pub mod sample;
pub mod verify;

pub use adapt::DraftLen;
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
    len: DraftLen,
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

    /// The current draft length.
    pub fn draft_len(&self) -> usize {
        self.len.get()
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
    k_min: usize,
    k_max: usize,
    step_tokens: Option<usize>,
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
            k_min: 1,
            k_max,
            step_tokens: None,
            stats: SpecStats::default(),
            rng: Rng::new(0x5EED),
        })
    }

    /// Caps the tokens of one step (pending and drafted, over all sequences)
    /// below the cache's `max_step`: a full batch then drafts less. At least 1.
    pub fn set_step_tokens(&mut self, n: usize) {
        self.step_tokens = Some(n.max(1));
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
            len: DraftLen::new(self.k_min, self.k_max),
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
        let logits = model.forward(cache, &toks, &seqs, &pos, &rows)?;

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
            s.len.record(k, v.accepted);
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

    /// Each stream's draft length this step: what it asks for (its adaptive
    /// length, short of its remaining tokens), within the step's width and
    /// the free cells, dealt one token at a time round the streams.
    fn share_out(&self, cache: &KvCellCache, streams: &[Stream]) -> Vec<usize> {
        let width = cache
            .config()
            .max_step
            .min(self.step_tokens.unwrap_or(usize::MAX));
        let free = cache.cells().free_cells();
        let mut budget = width.min(free).saturating_sub(streams.len());
        let want: Vec<usize> = streams
            .iter()
            .map(|s| {
                let k = s.len.get();
                s.remaining.map_or(k, |r| k.min(r.saturating_sub(1)))
            })
            .collect();
        let mut ks = vec![0usize; streams.len()];
        while budget > 0 {
            let mut gave = false;
            for (k, w) in ks.iter_mut().zip(&want) {
                if budget > 0 && *k < *w {
                    *k += 1;
                    budget -= 1;
                    gave = true;
                }
            }
            if !gave {
                break;
            }
        }
        ks
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
