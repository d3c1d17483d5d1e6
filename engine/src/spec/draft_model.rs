//! A draft model: a smaller model of the same vocabulary proposes the next
//! tokens from its own cache.
//!
//! Each target sequence gets a draft sequence mirroring the tokens the
//! target holds. Before drafting, the draft sequence keeps the longest
//! prefix it shares with the target's tokens (a rewind drops the rest:
//! rejected drafts, a correction) and feeds the remainder, so a verification
//! that kept `n` drafts costs the draft model no recomputation. Then it
//! extends every sequence one token per step, the sequences batched in one
//! forward per round.

use super::sample::{argmax, draw, probs, Rng, Sampling};
use crate::error::{EngineError, Result};
use crate::model::Model;
use offgraph_kv::{KvCellCache, KvDtype, SeqId};

/// One target sequence's mirror in the draft cache.
#[derive(Debug)]
struct Mirror {
    target: SeqId,
    seq: SeqId,
    /// The tokens the draft cache holds at positions `0..held.len()`.
    held: Vec<u32>,
}

/// What the draft model proposed for one sequence.
#[derive(Debug, Clone, Default)]
pub struct Proposal {
    pub tokens: Vec<u32>,
    /// Sampled drafting: the distribution each token was drawn from.
    pub q: Option<Vec<Vec<f64>>>,
}

/// A draft model on its own cache.
#[derive(Debug)]
pub struct DraftModel {
    model: Model,
    cache: KvCellCache,
    mirrors: Vec<Mirror>,
}

/// `InvalidArgument` unless `draft` and `target` have the same vocabulary:
/// the same size and the same bytes for every id, so a drafted id means the
/// same text to the target.
pub fn check_same_vocab(target: &Model, draft: &Model) -> Result<()> {
    let (a, b) = (target.config().vocab, draft.config().vocab);
    let (ta, tb) = (target.tokenizer(), draft.tokenizer());
    if a != b || ta.vocab_size() != tb.vocab_size() {
        return Err(EngineError::InvalidArgument(format!(
            "draft model: its vocabulary of {b} ids ({} tokens) differs from the target's {a} \
             ({} tokens); a draft model must share the target's vocabulary",
            tb.vocab_size(),
            ta.vocab_size()
        )));
    }
    let n = u32::try_from(ta.vocab_size()).unwrap_or(u32::MAX);
    if let Some(id) = (0..n).find(|&id| {
        ta.token_bytes(id).ok() != tb.token_bytes(id).ok() || ta.is_special(id) != tb.is_special(id)
    }) {
        return Err(EngineError::InvalidArgument(format!(
            "draft model: token {id} differs from the target's ({:?} vs {:?}); a draft model must \
             share the target's vocabulary",
            tb.token_bytes(id).unwrap_or_default(),
            ta.token_bytes(id).unwrap_or_default()
        )));
    }
    Ok(())
}

impl DraftModel {
    /// `draft` drafting for `target` (refused by [`check_same_vocab`]), on a
    /// cache of `n_cells` cells for up to `n_seq_max` sequences, steps of at
    /// most `max_step` tokens, K/V in `kv_dtype`.
    pub fn new(
        draft: Model,
        target: &Model,
        n_cells: usize,
        n_seq_max: usize,
        max_step: usize,
        kv_dtype: KvDtype,
    ) -> Result<DraftModel> {
        check_same_vocab(target, &draft)?;
        let cache = draft.new_cache(n_cells, n_seq_max, max_step, kv_dtype, kv_dtype)?;
        Ok(DraftModel {
            model: draft,
            cache,
            mirrors: Vec::new(),
        })
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    /// Drops the mirror of `target` (a finished or freed sequence).
    pub fn release(&mut self, target: SeqId) {
        if let Some(at) = self.mirrors.iter().position(|m| m.target == target) {
            let m = self.mirrors.swap_remove(at);
            // A mirror's id is live until released here.
            let _ = self.cache.cells_mut().seq_free(m.seq);
        }
    }

    /// Up to `ks[i]` tokens after `histories[i]` for target sequence
    /// `targets[i]`, picked as `sampling` picks (sampled: each token's
    /// distribution comes back in `q`).
    pub fn propose(
        &mut self,
        targets: &[SeqId],
        histories: &[&[u32]],
        ks: &[usize],
        sampling: Sampling,
        rng: &mut Rng,
    ) -> Result<Vec<Proposal>> {
        let vocab = self.model.config().vocab;
        let mut out: Vec<Proposal> = Vec::with_capacity(targets.len());
        // Per sequence: its mirror's index and the logits of its last token.
        let mut live: Vec<(usize, usize, Vec<f32>)> = Vec::new();
        for (i, ((&t, &h), &k)) in targets.iter().zip(histories).zip(ks).enumerate() {
            let sampled = matches!(sampling, Sampling::Temperature(_));
            out.push(Proposal {
                tokens: Vec::new(),
                q: sampled.then(Vec::new),
            });
            if k == 0 || h.is_empty() {
                continue;
            }
            let m = self.catch_up(t, h)?;
            let last = self.feed_rest(m, h)?;
            live.push((i, m, last));
        }
        let max_step = self.cache.config().max_step;
        let mut round = 0usize;
        while !live.is_empty() {
            let mut next: Vec<(usize, usize, u32)> = Vec::with_capacity(live.len());
            for (i, m, row) in &live {
                let Some(p) = out.get_mut(*i) else { continue };
                let tok = match sampling {
                    Sampling::Greedy => argmax(row),
                    Sampling::Temperature(temp) => {
                        let q = probs(row, temp);
                        let tok = draw(&q, rng);
                        p.q.get_or_insert_with(Vec::new).push(q);
                        tok
                    }
                };
                p.tokens.push(tok);
                if ks.get(*i).is_some_and(|&k| round + 1 < k) {
                    next.push((*i, *m, tok));
                }
            }
            round += 1;
            live.clear();
            for group in next.chunks(max_step.max(1)) {
                let toks: Vec<u32> = group.iter().map(|g| g.2).collect();
                let seqs: Vec<SeqId> = group
                    .iter()
                    .filter_map(|g| self.mirrors.get(g.1).map(|m| m.seq))
                    .collect();
                let pos: Vec<usize> = group
                    .iter()
                    .filter_map(|g| self.mirrors.get(g.1).map(|m| m.held.len()))
                    .collect();
                let rows: Vec<usize> = (0..group.len()).collect();
                let logits = self
                    .model
                    .forward(&mut self.cache, &toks, &seqs, &pos, &rows)?;
                for (r, g) in group.iter().enumerate() {
                    if let Some(m) = self.mirrors.get_mut(g.1) {
                        m.held.push(g.2);
                    }
                    let row = logits.get(r * vocab..(r + 1) * vocab).unwrap_or_default();
                    live.push((g.0, g.1, row.to_vec()));
                }
            }
        }
        Ok(out)
    }

    /// The mirror of `target`, rewound to the longest prefix it shares with
    /// `history` short of its last token (which is fed again for its logits).
    fn catch_up(&mut self, target: SeqId, history: &[u32]) -> Result<usize> {
        let at = match self.mirrors.iter().position(|m| m.target == target) {
            Some(at) => at,
            None => {
                let seq = self.cache.cells_mut().seq_new()?;
                self.mirrors.push(Mirror {
                    target,
                    seq,
                    held: Vec::new(),
                });
                self.mirrors.len() - 1
            }
        };
        let Some(m) = self.mirrors.get_mut(at) else {
            return Err(EngineError::InvalidArgument("draft mirror lost".into()));
        };
        let common = m
            .held
            .iter()
            .zip(history)
            .take_while(|(a, b)| a == b)
            .count()
            .min(history.len().saturating_sub(1));
        if common < m.held.len() {
            let cells = self.cache.cells_mut();
            if cells.seq_rm(m.seq, common, None).is_err() {
                // A rewind past what a sliding layer keeps: start the mirror over.
                cells.seq_free(m.seq)?;
                m.seq = cells.seq_new()?;
                m.held.clear();
            } else {
                m.held.truncate(common);
            }
        }
        Ok(at)
    }

    /// Feeds `history` past what mirror `m` holds, in steps of at most
    /// `max_step`; the last token's logits.
    fn feed_rest(&mut self, m: usize, history: &[u32]) -> Result<Vec<f32>> {
        let max_step = self.cache.config().max_step.max(1);
        let (seq, from) = match self.mirrors.get(m) {
            Some(x) => (x.seq, x.held.len()),
            None => return Err(EngineError::InvalidArgument("draft mirror lost".into())),
        };
        let rest = history.get(from..).unwrap_or_default();
        let mut last = Vec::new();
        for (c, part) in rest.chunks(max_step).enumerate() {
            let p0 = from + c * max_step;
            let pos: Vec<usize> = (p0..p0 + part.len()).collect();
            last = self.model.forward(
                &mut self.cache,
                part,
                &vec![seq; part.len()],
                &pos,
                &[part.len() - 1],
            )?;
            if let Some(x) = self.mirrors.get_mut(m) {
                x.held.extend_from_slice(part);
            }
        }
        Ok(last)
    }
}
