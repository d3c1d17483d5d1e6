//! The decode loop: prefill the shared prefix in chunks, fork it, then decode
//! every fork one token per batched step through the cell cache.

use offgraph_kv::{attend_into, AttendOptions, CacheConfig, KvCellCache, LayerConfig, SeqId};
use std::time::Instant;

use crate::args::Args;
use crate::matmul::matmul;
use crate::model::*;
use crate::BoxResult;

/// The cache the demo builds (`demo.build_cache`), sized for its worst case.
pub(crate) fn build_cache(a: &Args) -> BoxResult<KvCellCache> {
    let capacity = a.prefix + a.decode;
    let max_step = a.chunk.max(a.seqs).min(capacity);
    let layers = (0..a.layers)
        .map(|i| LayerConfig::new(a.policy(i), a.kv_heads, a.head_dim))
        .collect();
    let cfg = CacheConfig {
        capacity,
        n_layers: a.layers,
        layers,
        initial_capacity: capacity.min(64),
        max_step,
        ..CacheConfig::new(capacity, a.layers, Vec::new())
    };
    let n_cells = cfg.cells_for_forks(a.prefix, a.seqs, a.decode);
    Ok(KvCellCache::new(cfg, n_cells, a.seqs.max(1))?)
}

pub(crate) struct Runner<'a> {
    pub(crate) a: &'a Args,
    pub(crate) w: &'a Weights,
    pub(crate) kc: KvCellCache,
    pub(crate) opts: AttendOptions,
    pub(crate) threads: usize,
}

impl Runner<'_> {
    /// One step through every layer: the hidden states `[t, hidden]` after the
    /// last layer (before the final norm).
    pub(crate) fn forward(
        &mut self,
        tokens: &[usize],
        ids: &[SeqId],
        positions: &[usize],
    ) -> BoxResult<Vec<f32>> {
        let (a, w) = (self.a, self.w);
        let (hd, t) = (a.hidden, tokens.len());
        let (qd, kd) = (a.q_heads * a.head_dim, a.kv_heads * a.head_dim);
        self.kc.begin_step(ids, positions)?;
        let mut x = Vec::with_capacity(t * hd);
        for &tok in tokens {
            x.extend_from_slice(&w.emb[tok * hd..(tok + 1) * hd]);
        }
        let mut o = vec![0.0f32; a.q_heads * t * a.head_dim];
        for layer in 0..a.layers {
            let h = rms_norm(&x, hd);
            let k = heads(
                &matmul(&h, t, hd, &w.wk[layer], kd, self.threads),
                t,
                a.kv_heads,
                a.head_dim,
            );
            let v = heads(
                &matmul(&h, t, hd, &w.wv[layer], kd, self.threads),
                t,
                a.kv_heads,
                a.head_dim,
            );
            let q = heads(
                &matmul(&h, t, hd, &w.wq[layer], qd, self.threads),
                t,
                a.q_heads,
                a.head_dim,
            );
            let spec = self.kc.update(layer, &k, &v)?;
            attend_into(&q, [a.q_heads, t, a.head_dim], &spec, &self.opts, &mut o)?;
            let proj = matmul(
                &unheads(&o, t, a.q_heads, a.head_dim),
                t,
                qd,
                &w.wo[layer],
                hd,
                self.threads,
            );
            for (xv, pv) in x.iter_mut().zip(&proj) {
                *xv += pv;
            }
        }
        Ok(x)
    }
}

pub(crate) struct Outcome {
    pub(crate) prefill_s: f64,
    pub(crate) decode_s: f64,
    /// Per sequence, the token chosen after each decode step (`decode` of them).
    pub(crate) generated: Vec<Vec<usize>>,
    /// `[seqs, hidden]`: x after the last layer at each sequence's last step.
    pub(crate) hidden: Vec<f32>,
    pub(crate) kv_bytes: usize,
    pub(crate) live_bytes: usize,
    pub(crate) unshared_bytes: usize,
    pub(crate) shared_cells: usize,
    pub(crate) peak_flat: usize,
    pub(crate) peak_ring: usize,
}

pub(crate) fn run(a: &Args) -> BoxResult<Outcome> {
    let w = make_weights(a);
    let threads = a
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let mut r = Runner {
        a,
        w: &w,
        kc: build_cache(a)?,
        opts: AttendOptions {
            threads: a.threads,
            backend: a.backend,
            ..AttendOptions::default()
        },
        threads,
    };

    // Prefill the shared prefix once, in chunks, on one sequence.
    let root = r.kc.cells_mut().seq_new()?;
    let prompt = prompt_prefix(a);
    let t0 = Instant::now();
    for start in (0..a.prefix).step_by(a.chunk) {
        let stop = (start + a.chunk).min(a.prefix);
        let ids = vec![root; stop - start];
        let positions: Vec<usize> = (start..stop).collect();
        r.forward(&prompt[start..stop], &ids, &positions)?;
    }
    let prefill_s = t0.elapsed().as_secs_f64();

    // Fork: every other sequence shares the prefix's cells.
    let mut ids = vec![root];
    for _ in 1..a.seqs {
        ids.push(r.kc.cells_mut().seq_clone(root, None)?);
    }
    let mut step: Vec<usize> = (0..a.seqs).map(|i| fork_token(a, i)).collect();
    let mut generated = vec![Vec::with_capacity(a.decode); a.seqs];
    let mut hidden = Vec::new();
    let t0 = Instant::now();
    for m in 0..a.decode {
        let x = r.forward(&step, &ids, &vec![a.prefix + m; a.seqs])?;
        step = next_tokens(a, &w, &x, a.seqs, threads);
        for (g, &tok) in generated.iter_mut().zip(&step) {
            g.push(tok);
        }
        hidden = x;
    }
    let decode_s = t0.elapsed().as_secs_f64();

    let kc = &r.kc;
    let cfg = kc.config();
    let row_bytes = 2 * a.kv_heads * a.head_dim * 4;
    let length = a.prefix + a.decode;
    let (mut unshared, mut live) = (0, 0);
    let (mut peak_flat, mut peak_ring) = (0, 0);
    for layer in 0..a.layers {
        let policy = a.policy(layer);
        let rows = if a.is_flat(layer) {
            length
        } else {
            length.min(cfg.depth(policy))
        };
        unshared += a.seqs * rows * row_bytes;
        let free = kc.cells().free_cells_in(kc.cells().table_of(layer)?)?;
        live += row_bytes * (kc.cells().capacity() - free);
        let slots = kc.pool(layer)?.slots();
        if a.is_flat(layer) {
            peak_flat = peak_flat.max(slots);
        } else {
            peak_ring = peak_ring.max(slots);
        }
    }
    let shared_table = match (0..a.layers).find(|&i| a.is_flat(i)) {
        Some(l) => kc.cells().table_of(l)?,
        None => 0,
    };
    Ok(Outcome {
        prefill_s,
        decode_s,
        generated,
        hidden,
        kv_bytes: kc.nbytes_total(),
        live_bytes: live,
        unshared_bytes: unshared,
        shared_cells: kc.cells().shared_cells(shared_table)?,
        peak_flat,
        peak_ring,
    })
}
