//! One step of a decoder stack over a `KvCellCache` whose step is open.
//!
//! Activations are token-major `[T, width]` (what the matmuls read and
//! write); attention takes and gives head-major `[heads, T, head_dim]`, so
//! q/k/v are transposed after RoPE and the attention output back before the
//! output projection. Every buffer lives in a [`Scratch`] that only grows.

use super::config::{Activation, ModelConfig};
use super::exact::matmul_exact;
use super::gate::gated;
use super::ops::{
    from_heads, rms_norm_in_place, rms_norm_into, rope_in_place, rope_table, to_heads, RopeFreqs,
};
use super::weights::{LayerWeights, Weights};
use crate::error::{EngineError, Result};
use crate::gguf::GgufFile;
use crate::quant::{dequantize_row, matmul, matmul_many, QMatrix};
use offgraph_kv::{attend_into, AttendOptions, KvCellCache};

/// Buffers of a forward, reused across calls.
#[derive(Debug, Default)]
pub struct Scratch {
    x: Vec<f32>,
    h: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    qh: Vec<f32>,
    kh: Vec<f32>,
    vh: Vec<f32>,
    att: Vec<f32>,
    att_tok: Vec<f32>,
    proj: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    /// RoPE tables of full (`g`) and sliding (`l`) layers for the step.
    cos_g: Vec<f32>,
    sin_g: Vec<f32>,
    cos_l: Vec<f32>,
    sin_l: Vec<f32>,
    last: Vec<f32>,
    /// A decoded weight row (exact matmuls only).
    row: Vec<f32>,
}

/// `v`'s first `n` values, growing it when shorter.
fn sized(v: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if v.len() < n {
        v.resize(n, 0.0);
    }
    match v.get_mut(..n) {
        Some(s) => s,
        None => &mut [],
    }
}

/// What one forward reads besides the cache.
pub struct Ctx<'a> {
    pub file: &'a GgufFile,
    pub cfg: &'a ModelConfig,
    pub w: &'a Weights,
    pub threads: usize,
    /// Matmuls on f32 activations ([`matmul_exact`]) instead of the kernels.
    pub exact: bool,
}

impl Ctx<'_> {
    fn mm(
        &self,
        w: &QMatrix<'_>,
        x: &[f32],
        t: usize,
        out: &mut [f32],
        row: &mut Vec<f32>,
    ) -> Result<()> {
        if self.exact {
            matmul_exact(w, x, t, out, row)
        } else {
            matmul(w, x, t, out, self.threads)
        }
    }

    fn mm_many(
        &self,
        ws: &[&QMatrix<'_>],
        x: &[f32],
        t: usize,
        outs: &mut [&mut [f32]],
        row: &mut Vec<f32>,
    ) -> Result<()> {
        if self.exact {
            for (w, out) in ws.iter().zip(outs.iter_mut()) {
                matmul_exact(w, x, t, out, row)?;
            }
            Ok(())
        } else {
            matmul_many(ws, x, t, outs, self.threads)
        }
    }

    /// Runs the open step of `cache` (already validated against the model:
    /// token ids in range, rows in range, the cache's layers the model's)
    /// and returns the logits of `logit_rows`, `[rows, vocab]`.
    pub fn run(
        &self,
        s: &mut Scratch,
        cache: &mut KvCellCache,
        tokens: &[u32],
        positions: &[usize],
        logit_rows: &[usize],
    ) -> Result<Vec<f32>> {
        let cfg = self.cfg;
        let (t, e) = (tokens.len(), cfg.n_embd);
        self.embed(tokens, sized(&mut s.x, t * e))?;
        let d = cfg.rope_dims;
        // Scaling (linear factor, llama3 divisors) applies to full-attention layers.
        // LongRoPE: short divisors below the original context, long from there on.
        let (divisors, long, mscale) = match (&self.w.rope_factors, &cfg.longrope) {
            (Some([short, long]), Some(lr)) => (
                Some(short.as_slice()),
                Some((lr.original_context, long.as_slice())),
                lr.attn_factor,
            ),
            _ => (self.w.rope_freqs.as_deref(), None, 1.0),
        };
        let full = RopeFreqs {
            base: cfg.rope_base,
            linear: cfg.rope_linear,
            divisors,
            yarn: cfg.rope_yarn,
            long,
            mscale,
        };
        rope_table(positions, d, &full, &mut s.cos_g, &mut s.sin_g);
        if self.uses_local_table() {
            let local = RopeFreqs::plain(cfg.rope_base_local);
            rope_table(positions, d, &local, &mut s.cos_l, &mut s.sin_l);
        }
        for (layer, lw) in self.w.layers.iter().enumerate() {
            self.attention(s, cache, layer, lw, t)?;
            self.feed_forward(s, lw, t)?;
        }
        self.logits(s, logit_rows)
    }

    /// Whether sliding layers rotate by their own table: there are some, and
    /// their base differs or the full layers' table is scaled (scaling never
    /// applies to sliding layers).
    fn uses_local_table(&self) -> bool {
        let cfg = self.cfg;
        !cfg.sliding_rope_is_global
            && cfg.windows.iter().any(Option::is_some)
            && (cfg.rope_base_local != cfg.rope_base
                || cfg.rope_linear != 1.0
                || cfg.rope_yarn.is_some()
                || self.w.rope_freqs.is_some()
                || self.w.rope_factors.is_some())
    }

    fn embed(&self, tokens: &[u32], x: &mut [f32]) -> Result<()> {
        let emb = Weights::matrix(self.file, &self.w.embed)?;
        // Gemma scales embeddings by sqrt(n_embd) (in the activations' f32).
        let scale = self.cfg.embed_scale;
        for (&tok, row) in tokens.iter().zip(x.chunks_exact_mut(emb.cols)) {
            dequantize_row(emb.ty, emb.row(tok as usize)?, row)?;
            if scale != 1.0 {
                row.iter_mut().for_each(|v| *v *= scale);
            }
        }
        Ok(())
    }

    fn attention(
        &self,
        s: &mut Scratch,
        cache: &mut KvCellCache,
        layer: usize,
        lw: &LayerWeights,
        t: usize,
    ) -> Result<()> {
        let cfg = self.cfg;
        let (e, d, qd, kd) = (cfg.n_embd, cfg.head_dim, cfg.q_dim(), cfg.kv_dim());
        let x = sized(&mut s.x, t * e);
        let h = sized(&mut s.h, t * e);
        pre_norm(x, lw.attn_norm.as_deref(), cfg.eps, h);
        let (wq, wk, wv) = (
            Weights::matrix(self.file, &lw.wq)?,
            Weights::matrix(self.file, &lw.wk)?,
            Weights::matrix(self.file, &lw.wv)?,
        );
        let q = sized(&mut s.q, t * qd);
        let k = sized(&mut s.k, t * kd);
        let v = sized(&mut s.v, t * kd);
        let qkv: &mut [&mut [f32]] = &mut [&mut *q, &mut *k, &mut *v];
        self.mm_many(&[&wq, &wk, &wv], h, t, qkv, &mut s.row)?;
        for (out, bias) in [(&mut *q, &lw.bq), (&mut *k, &lw.bk), (&mut *v, &lw.bv)] {
            if let Some(b) = bias {
                add_rows(out, b);
            }
        }
        // Per head or over the whole projection: the weight's length says which.
        if let (Some(qn), Some(kn)) = (&lw.q_norm, &lw.k_norm) {
            rms_norm_in_place(q, qn, cfg.eps);
            rms_norm_in_place(k, kn, cfg.eps);
        }
        let (cos, sin) =
            if cfg.windows.get(layer).copied().flatten().is_some() && self.uses_local_table() {
                (&s.cos_l, &s.sin_l)
            } else {
                (&s.cos_g, &s.sin_g)
            };
        let rot = cfg.rope_dims;
        rope_in_place(q, t, d, rot, cfg.rope_style, cos, sin);
        rope_in_place(k, t, d, rot, cfg.rope_style, cos, sin);
        let qh = sized(&mut s.qh, t * qd);
        let kh = sized(&mut s.kh, t * kd);
        let vh = sized(&mut s.vh, t * kd);
        to_heads(q, t, cfg.n_head, d, qh);
        to_heads(k, t, cfg.n_head_kv, d, kh);
        to_heads(v, t, cfg.n_head_kv, d, vh);
        let att = sized(&mut s.att, t * qd);
        {
            let spec = cache.update(layer, kh, vh)?;
            let opts = AttendOptions {
                scale: Some(cfg.attn_scale),
                softcap: cfg.attn_softcap,
                threads: Some(self.threads),
                ..AttendOptions::default()
            };
            attend_into(qh, [cfg.n_head, t, d], &spec, &opts, att)?;
        }
        let att_tok = sized(&mut s.att_tok, t * qd);
        from_heads(att, t, cfg.n_head, d, att_tok);
        let proj = sized(&mut s.proj, t * e);
        let wo = Weights::matrix(self.file, &lw.wo)?;
        self.mm(&wo, att_tok, t, proj, &mut s.row)?;
        if let Some(w) = &lw.post_attn_norm {
            rms_norm_in_place(proj, w, cfg.eps);
        }
        add_scaled(sized(&mut s.x, t * e), &s.proj, cfg.residual_scale);
        Ok(())
    }

    fn feed_forward(&self, s: &mut Scratch, lw: &LayerWeights, t: usize) -> Result<()> {
        let cfg = self.cfg;
        let (e, ff) = (cfg.n_embd, cfg.n_ff);
        let h = sized(&mut s.h, t * e);
        pre_norm(sized(&mut s.x, t * e), lw.ffn_norm.as_deref(), cfg.eps, h);
        let (wg, wu) = (
            Weights::matrix(self.file, &lw.gate)?,
            Weights::matrix(self.file, &lw.up)?,
        );
        let gate = sized(&mut s.gate, t * ff);
        let up = sized(&mut s.up, t * ff);
        self.mm_many(&[&wg, &wu], h, t, &mut [&mut *gate, &mut *up], &mut s.row)?;
        gated(gate, up, cfg.activation == Activation::GeluTanh);
        let proj = sized(&mut s.proj, t * e);
        let down = Weights::matrix(self.file, &lw.down)?;
        self.mm(&down, gate, t, proj, &mut s.row)?;
        if let Some(w) = &lw.post_ffn_norm {
            rms_norm_in_place(proj, w, cfg.eps);
        }
        add_scaled(sized(&mut s.x, t * e), &s.proj, cfg.residual_scale);
        Ok(())
    }

    /// The final norm and the output projection of the rows asked for.
    fn logits(&self, s: &mut Scratch, rows: &[usize]) -> Result<Vec<f32>> {
        let cfg = self.cfg;
        let e = cfg.n_embd;
        let last = sized(&mut s.last, rows.len() * e);
        for (&r, dst) in rows.iter().zip(last.chunks_exact_mut(e)) {
            let src = s.x.get(r * e..(r + 1) * e).ok_or_else(|| {
                EngineError::InvalidArgument(format!("logit row {r}: beyond the step's tokens"))
            })?;
            dst.copy_from_slice(src);
        }
        rms_norm_in_place(last, &self.w.output_norm, cfg.eps);
        let mut out = vec![0.0f32; rows.len() * cfg.vocab];
        if !rows.is_empty() {
            let w = Weights::matrix(self.file, &self.w.output)?;
            self.mm(&w, last, rows.len(), &mut out, &mut s.row)?;
        }
        if cfg.logit_scale != 1.0 {
            let inv = 1.0 / cfg.logit_scale;
            out.iter_mut().for_each(|v| *v *= inv);
        }
        if let Some(cap) = cfg.final_softcap {
            out.iter_mut().for_each(|v| *v = cap * (*v / cap).tanh());
        }
        Ok(out)
    }
}

/// `h` = `x` normalised by `w`, or `x` itself where the family has no pre-norm.
fn pre_norm(x: &[f32], w: Option<&[f32]>, eps: f32, h: &mut [f32]) {
    match w {
        Some(w) => rms_norm_into(x, w, eps, h),
        None => h.copy_from_slice(x),
    }
}

/// `x += scale · y` (scale 1 adds exactly).
fn add_scaled(x: &mut [f32], y: &[f32], scale: f32) {
    if scale == 1.0 {
        x.iter_mut().zip(y).for_each(|(a, &b)| *a += b);
    } else {
        x.iter_mut().zip(y).for_each(|(a, &b)| *a += scale * b);
    }
}

/// Adds `b` to every row of `x` (rows of `b.len()` values).
fn add_rows(x: &mut [f32], b: &[f32]) {
    for row in x.chunks_exact_mut(b.len().max(1)) {
        row.iter_mut().zip(b).for_each(|(a, &c)| *a += c);
    }
}
