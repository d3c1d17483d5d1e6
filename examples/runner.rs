//! The demo's decode loop in plain Rust: no Python anywhere.
//!
//! Runs the very workload of `offgraph-kv demo` (`python/offgraph_kv/demo.py`,
//! model in `demo_model.py`) through the crate's API: a shared prompt prefix is
//! prefilled once in chunks on one sequence, forked with `seq_clone` (cells
//! shared, no K/V copied), and every fork then decodes one token per step in
//! batched steps through a Gemma-like mix of ring and flat layers, with the
//! K/V written by `KvCellCache::update` and attention read from the pools in
//! place by `attend_into`.
//!
//! Weights and prompt come from the same counter-based splitmix64 stream as
//! the Python demo (computed in f64, then cast to f32), so for the same flags
//! the runner generates the same tokens. `--dump PATH` writes the generated
//! tokens and each sequence's final hidden state at its last decode step as
//! JSON (checked against the float64 reference by `tests/python/test_runner.py`).
//!
//! ```text
//! cargo run --release --example runner -- --seqs 8 --decode 32
//! ```

use offgraph_kv::{
    attend_into, AttendOptions, Backend, CacheConfig, KvCellCache, LayerConfig, LayerPolicy, SeqId,
};
use std::error::Error;
use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::Instant;

type BoxResult<T> = Result<T, Box<dyn Error>>;

// ---------------------------------------------------------------------------
// The counter-based generator (demo_model.py: `_mix`, `stream_key`, `uniform`,
// `integers`).

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;
const TAG_EMB: u64 = 1;
const TAG_WQ: u64 = 2;
const TAG_WK: u64 = 3;
const TAG_WV: u64 = 4;
const TAG_WO: u64 = 5;
const TAG_PROMPT: u64 = 6;
const TAG_OUT: u64 = 7;

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `stream_key(seed, tag, layer)`: Python's `& 0xFFFF_FFFF_FFFF_FFFF` of the
/// exact integer equals wrapping arithmetic modulo 2^64 (negative seeds too).
fn stream_key(seed: i64, tag: u64, layer: usize) -> u64 {
    let raw = (seed as u64)
        .wrapping_mul(0x0100_0000_01B3)
        .wrapping_add(tag.wrapping_mul(0x10001))
        .wrapping_add((layer as u64).wrapping_mul(0x101));
    mix(raw)
}

/// The i-th raw value of a stream (i counts from 0; the stream from 1).
fn bits(key: u64, i: usize) -> u64 {
    mix(key.wrapping_add((i as u64 + 1).wrapping_mul(GOLDEN)))
}

/// `uniform(key, n)`: float64 in [-1, 1).
fn uniform(key: u64, n: usize) -> impl Iterator<Item = f64> {
    (0..n).map(move |i| (bits(key, i) >> 40) as f64 / (1u64 << 24) as f64 * 2.0 - 1.0)
}

fn integers(key: u64, n: usize, bound: usize) -> Vec<usize> {
    (0..n)
        .map(|i| (bits(key, i) % bound as u64) as usize)
        .collect()
}

// ---------------------------------------------------------------------------
// The model (demo_model.py: `DemoConfig`, `make_weights`, `rms_norm`, ...).

#[derive(Debug, Clone)]
struct Args {
    seqs: usize,
    prefix: usize,
    decode: usize,
    chunk: usize,
    layers: usize,
    window: usize,
    hidden: usize,
    q_heads: usize,
    kv_heads: usize,
    head_dim: usize,
    vocab: usize,
    seed: i64,
    threads: Option<usize>,
    backend: Backend,
    dump: Option<String>,
}

impl Default for Args {
    /// The Python demo's defaults (`offgraph-kv demo --help`).
    fn default() -> Self {
        Args {
            seqs: 16,
            prefix: 1024,
            decode: 64,
            chunk: 256,
            layers: 12,
            window: 256,
            hidden: 1024,
            q_heads: 16,
            kv_heads: 4,
            head_dim: 64,
            vocab: 1024,
            seed: 0,
            threads: None,
            backend: Backend::Auto,
            dump: None,
        }
    }
}

impl Args {
    fn is_flat(&self, layer: usize) -> bool {
        (layer + 1).is_multiple_of(6)
    }

    fn policy(&self, layer: usize) -> LayerPolicy {
        if self.is_flat(layer) {
            LayerPolicy::Flat
        } else {
            LayerPolicy::Ring {
                window: self.window,
            }
        }
    }
}

/// f32 weights, row-major: `emb [vocab, hidden]`, `wq [hidden, q_heads *
/// head_dim]`, `wk`/`wv [hidden, kv_heads * head_dim]`, `wo [q_heads *
/// head_dim, hidden]`; `out [hidden, vocab]` the untied output head.
struct Weights {
    emb: Vec<f32>,
    out: Vec<f32>,
    wq: Vec<Vec<f32>>,
    wk: Vec<Vec<f32>>,
    wv: Vec<Vec<f32>>,
    wo: Vec<Vec<f32>>,
}

/// `make_weights(cfg).astype(np.float32)`: each matrix is `uniform / sqrt(rows)`
/// in float64, then cast; the embeddings are unscaled.
fn make_weights(a: &Args) -> Weights {
    let mat = |tag: u64, layer: usize, rows: usize, cols: usize| -> Vec<f32> {
        let s = (rows as f64).sqrt();
        uniform(stream_key(a.seed, tag, layer), rows * cols)
            .map(|u| (u / s) as f32)
            .collect()
    };
    let (qd, kd) = (a.q_heads * a.head_dim, a.kv_heads * a.head_dim);
    let emb: Vec<f32> = uniform(stream_key(a.seed, TAG_EMB, 0), a.vocab * a.hidden)
        .map(|u| u as f32)
        .collect();
    let per_layer = |tag: u64, rows: usize, cols: usize| -> Vec<Vec<f32>> {
        (0..a.layers).map(|i| mat(tag, i, rows, cols)).collect()
    };
    Weights {
        wq: per_layer(TAG_WQ, a.hidden, qd),
        wk: per_layer(TAG_WK, a.hidden, kd),
        wv: per_layer(TAG_WV, a.hidden, kd),
        wo: per_layer(TAG_WO, qd, a.hidden),
        out: mat(TAG_OUT, 0, a.hidden, a.vocab),
        emb,
    }
}

fn prompt_prefix(a: &Args) -> Vec<usize> {
    integers(stream_key(a.seed, TAG_PROMPT, 0), a.prefix, a.vocab)
}

fn fork_token(a: &Args, fork: usize) -> usize {
    (fork * 7 + 1) % a.vocab
}

/// `x / sqrt(mean(x * x) + 1e-6)` per row of `width` (the mean summed in f64).
fn rms_norm(x: &[f32], width: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks_exact(width) {
        let ss: f64 = row.iter().map(|&v| f64::from(v * v)).sum();
        let mean = (ss / width as f64) as f32;
        let d = (mean + 1e-6f32).sqrt();
        out.extend(row.iter().map(|&v| v / d));
    }
    out
}

/// Rows of `out` (`[r, n]`) = rows of `x` (`[r, k]`) · `w` (`[k, n]`), f32
/// accumulated over k in order (no FMA, so every build computes the same
/// bits); `w` is walked in blocks of rows kept in cache.
#[inline(always)]
fn matmul_rows_body(x: &[f32], k: usize, w: &[f32], n: usize, out: &mut [f32]) {
    const KB: usize = 64;
    out.fill(0.0);
    for kb in (0..k).step_by(KB) {
        let ke = (kb + KB).min(k);
        let wb = &w[kb * n..ke * n];
        for (xr, or) in x.chunks_exact(k).zip(out.chunks_exact_mut(n)) {
            for (&xv, wr) in xr[kb..ke].iter().zip(wb.chunks_exact(n)) {
                for (o, &wv) in or.iter_mut().zip(wr) {
                    *o += xv * wv;
                }
            }
        }
    }
}

/// The same loop compiled for AVX2 (wider vectors, same arithmetic).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn matmul_rows_avx2(x: &[f32], k: usize, w: &[f32], n: usize, out: &mut [f32]) {
    matmul_rows_body(x, k, w, n, out)
}

fn matmul_rows(x: &[f32], k: usize, w: &[f32], n: usize, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked just above).
        unsafe { matmul_rows_avx2(x, k, w, n, out) };
        return;
    }
    matmul_rows_body(x, k, w, n, out)
}

/// `x [t, k] · w [k, n]` on up to `threads` threads (split by rows, so the
/// result does not depend on the thread count).
fn matmul(x: &[f32], t: usize, k: usize, w: &[f32], n: usize, threads: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; t * n];
    let threads = threads.min(t).max(1);
    if threads == 1 || t * k * n < (1 << 16) {
        matmul_rows(x, k, w, n, &mut out);
        return out;
    }
    let rows = t.div_ceil(threads);
    std::thread::scope(|s| {
        let mut parts = x.chunks(rows * k).zip(out.chunks_mut(rows * n));
        let first = parts.next();
        for (xp, op) in parts {
            s.spawn(move || matmul_rows(xp, k, w, n, op));
        }
        if let Some((xp, op)) = first {
            matmul_rows(xp, k, w, n, op);
        }
    });
    out
}

/// `[t, n * d]` -> `[n, t, d]`.
fn heads(x: &[f32], t: usize, n: usize, d: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; x.len()];
    for (ti, row) in x.chunks_exact(n * d).enumerate() {
        for (h, src) in row.chunks_exact(d).enumerate() {
            let o = (h * t + ti) * d;
            out[o..o + d].copy_from_slice(src);
        }
    }
    out
}

/// `[n, t, d]` -> `[t, n * d]`.
fn unheads(x: &[f32], t: usize, n: usize, d: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; x.len()];
    for (h, head) in x.chunks_exact(t * d).enumerate() {
        for (ti, src) in head.chunks_exact(d).enumerate() {
            let o = (ti * n + h) * d;
            out[o..o + d].copy_from_slice(src);
        }
    }
    out
}

/// Greedy choice from the final hidden states `[t, hidden]`:
/// `argmax(rms_norm(x) · out)`, the first index on ties (like `np.argmax`).
fn next_tokens(a: &Args, w: &Weights, x: &[f32], t: usize, threads: usize) -> Vec<usize> {
    let logits = matmul(
        &rms_norm(x, a.hidden),
        t,
        a.hidden,
        &w.out,
        a.vocab,
        threads,
    );
    logits
        .chunks_exact(a.vocab)
        .map(|row| {
            let mut best = 0;
            for (i, &v) in row.iter().enumerate() {
                if v > row[best] {
                    best = i;
                }
            }
            best
        })
        .collect()
}

/// The cache the demo builds (`demo.build_cache`), sized for its worst case.
fn build_cache(a: &Args) -> BoxResult<KvCellCache> {
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
    let keep = a.window + max_step - 1;
    let flat_need = a.prefix + a.seqs * a.decode;
    let ring_need = a.prefix.min(keep) + a.seqs * a.decode.min(keep) + a.seqs;
    Ok(KvCellCache::new(
        cfg,
        flat_need.max(ring_need),
        a.seqs.max(1),
    )?)
}

struct Runner<'a> {
    a: &'a Args,
    w: &'a Weights,
    kc: KvCellCache,
    opts: AttendOptions,
    threads: usize,
}

impl Runner<'_> {
    /// One step through every layer: the hidden states `[t, hidden]` after the
    /// last layer (before the final norm).
    fn forward(
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

struct Outcome {
    prefill_s: f64,
    decode_s: f64,
    /// Per sequence, the token chosen after each decode step (`decode` of them).
    generated: Vec<Vec<usize>>,
    /// `[seqs, hidden]`: x after the last layer at each sequence's last step.
    hidden: Vec<f32>,
    kv_bytes: usize,
    live_bytes: usize,
    unshared_bytes: usize,
    shared_cells: usize,
    peak_flat: usize,
    peak_ring: usize,
}

fn run(a: &Args) -> BoxResult<Outcome> {
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

// ---------------------------------------------------------------------------
// Output.

fn per_s(n: usize, s: f64) -> f64 {
    if s > 0.0 {
        n as f64 / s
    } else {
        f64::INFINITY
    }
}

/// `f"{v:,.0f}"`.
fn thousands(v: f64) -> String {
    if !v.is_finite() {
        return "inf".into();
    }
    let digits = format!("{:.0}", v);
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn table(a: &Args, o: &Outcome) -> String {
    let mib = 1.0 / f64::from(1u32 << 20);
    let rows = [
        (
            "sequences x decode tokens",
            format!("{} x {} (shared prefix {})", a.seqs, a.decode, a.prefix),
        ),
        (
            "prefill",
            format!("{} tokens/s", thousands(per_s(a.prefix, o.prefill_s))),
        ),
        (
            "decode",
            format!(
                "{} tokens/s",
                thousands(per_s(a.seqs * a.decode, o.decode_s))
            ),
        ),
        (
            "KV bytes held (pools)",
            format!("{:.2} MiB", o.kv_bytes as f64 * mib),
        ),
        (
            "KV bytes in live cells",
            format!("{:.2} MiB", o.live_bytes as f64 * mib),
        ),
        (
            "N unshared copies would need",
            format!("{:.2} MiB", o.unshared_bytes as f64 * mib),
        ),
        (
            "pools / unshared",
            format!("{:.2}x", o.kv_bytes as f64 / o.unshared_bytes as f64),
        ),
        ("cells shared by forks", o.shared_cells.to_string()),
        (
            "peak pool slots (flat / ring)",
            format!("{} / {}", o.peak_flat, o.peak_ring),
        ),
    ];
    let w = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    let mut s = format!("| {:<w$} | {:<36} |\n", "metric", "value");
    let _ = writeln!(s, "|{}|{}|", "-".repeat(w + 2), "-".repeat(38));
    for (k, v) in &rows {
        let _ = writeln!(s, "| {k:<w$} | {v:<36} |");
    }
    s
}

fn json_f32(v: f32) -> String {
    if v.is_finite() {
        format!("{v:e}")
    } else {
        "null".into()
    }
}

fn dump_json(a: &Args, o: &Outcome) -> String {
    let list =
        |xs: &mut dyn Iterator<Item = String>| format!("[{}]", xs.collect::<Vec<_>>().join(", "));
    let generated = list(
        &mut o
            .generated
            .iter()
            .map(|g| list(&mut g.iter().map(usize::to_string))),
    );
    let hidden = list(
        &mut o
            .hidden
            .chunks_exact(a.hidden)
            .map(|row| list(&mut row.iter().map(|&v| json_f32(v)))),
    );
    let fork = list(&mut (0..a.seqs).map(|i| fork_token(a, i).to_string()));
    format!(
        concat!(
            "{{\"config\": {{\"n_layers\": {}, \"window\": {}, \"hidden\": {}, \"n_q_heads\": {}, ",
            "\"n_kv_heads\": {}, \"head_dim\": {}, \"vocab\": {}, \"seed\": {}}},\n",
            "\"n_seqs\": {}, \"prefix\": {}, \"decode\": {}, \"chunk\": {},\n",
            "\"prefill_tokens_per_s\": {}, \"decode_tokens_per_s\": {},\n",
            "\"kv_bytes\": {}, \"kv_live_bytes\": {}, \"unshared_bytes\": {}, \"shared_cells\": {},\n",
            "\"peak_slots_flat\": {}, \"peak_slots_ring\": {},\n",
            "\"fork_tokens\": {},\n\"generated\": {},\n\"hidden\": {}}}\n"
        ),
        a.layers,
        a.window,
        a.hidden,
        a.q_heads,
        a.kv_heads,
        a.head_dim,
        a.vocab,
        a.seed,
        a.seqs,
        a.prefix,
        a.decode,
        a.chunk,
        json_num(per_s(a.prefix, o.prefill_s)),
        json_num(per_s(a.seqs * a.decode, o.decode_s)),
        o.kv_bytes,
        o.live_bytes,
        o.unshared_bytes,
        o.shared_cells,
        o.peak_flat,
        o.peak_ring,
        fork,
        generated,
        hidden,
    )
}

fn json_num(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.1}")
    } else {
        "null".into()
    }
}

// ---------------------------------------------------------------------------
// Flags.

const USAGE: &str = "\
usage: runner [--seqs N] [--prefix N] [--decode N] [--chunk N] [--layers N]
              [--window N] [--hidden N] [--q-heads N] [--kv-heads N]
              [--head-dim N] [--vocab N] [--seed INT] [--threads N]
              [--backend {auto,native,xnnpack}] [--dump PATH]

The offgraph-kv demo's workload (same weights, prompt and tokens) in plain Rust.

  --seqs N       sequences sharing the prefix (16)
  --prefix N     shared prefix tokens (1024)
  --decode N     tokens each sequence decodes (64)
  --chunk N      prefill chunk (256)
  --layers N     layers; every sixth is flat, the others ring (12)
  --window N     ring window (256)
  --hidden N     hidden size (1024)
  --q-heads N    query heads (16)
  --kv-heads N   KV heads (4)
  --head-dim N   head dim (64)
  --vocab N      vocabulary (1024)
  --seed INT     weights and prompt seed (0)
  --threads N    threads for attention and the projections (all cores)
  --backend B    attention backend (auto)
  --dump PATH    write the generated tokens and final hidden states as JSON";

fn positive(flag: &str, v: &str) -> Result<usize, String> {
    match v.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!(
            "argument {flag}: expected a positive integer, got {v:?}"
        )),
    }
}

/// `Ok(None)`: `--help` was asked for.
fn parse_args(argv: &[String]) -> Result<Option<Args>, String> {
    let mut a = Args::default();
    let mut it = argv.iter();
    while let Some(arg) = it.next() {
        if arg == "-h" || arg == "--help" {
            return Ok(None);
        }
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (arg.as_str(), None),
        };
        if !flag.starts_with("--") {
            return Err(format!("unrecognized argument: {arg}"));
        }
        let known = [
            "--seqs",
            "--prefix",
            "--decode",
            "--chunk",
            "--layers",
            "--window",
            "--hidden",
            "--q-heads",
            "--kv-heads",
            "--head-dim",
            "--vocab",
            "--seed",
            "--threads",
            "--backend",
            "--dump",
        ];
        if !known.contains(&flag) {
            return Err(format!("unrecognized argument: {flag}"));
        }
        let v = match inline {
            Some(v) => v,
            None => it
                .next()
                .cloned()
                .ok_or_else(|| format!("argument {flag}: expected one argument"))?,
        };
        match flag {
            "--seqs" => a.seqs = positive(flag, &v)?,
            "--prefix" => a.prefix = positive(flag, &v)?,
            "--decode" => a.decode = positive(flag, &v)?,
            "--chunk" => a.chunk = positive(flag, &v)?,
            "--layers" => a.layers = positive(flag, &v)?,
            "--window" => a.window = positive(flag, &v)?,
            "--hidden" => a.hidden = positive(flag, &v)?,
            "--q-heads" => a.q_heads = positive(flag, &v)?,
            "--kv-heads" => a.kv_heads = positive(flag, &v)?,
            "--head-dim" => a.head_dim = positive(flag, &v)?,
            "--vocab" => a.vocab = positive(flag, &v)?,
            "--threads" => a.threads = Some(positive(flag, &v)?),
            "--seed" => {
                a.seed = v
                    .parse()
                    .map_err(|_| format!("argument --seed: expected an integer, got {v:?}"))?
            }
            "--backend" => {
                a.backend = Backend::parse(&v).map_err(|e| format!("argument --backend: {e}"))?;
                if !a.backend.available() {
                    return Err(format!(
                        "argument --backend: {v:?} is not available in this build"
                    ));
                }
            }
            _ => a.dump = Some(v),
        }
    }
    if !a.q_heads.is_multiple_of(a.kv_heads) {
        return Err(format!(
            "--q-heads ({}) must be a multiple of --kv-heads ({})",
            a.q_heads, a.kv_heads
        ));
    }
    if a.window > a.prefix + a.decode {
        return Err(format!(
            "--window ({}) must be at most --prefix + --decode ({})",
            a.window,
            a.prefix + a.decode
        ));
    }
    Ok(Some(a))
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let a = match parse_args(&argv) {
        Ok(Some(a)) => a,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(msg) => {
            eprintln!("{USAGE}\nrunner: error: {msg}");
            return ExitCode::from(2);
        }
    };
    match main_inner(&a) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("runner: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn main_inner(a: &Args) -> BoxResult<()> {
    println!(
        "offgraph-kv runner (Rust, no Python): {} sequences share a {}-token prefix, then decode {} tokens each",
        a.seqs, a.prefix, a.decode
    );
    println!(
        "model: {} layers (ring window {} : flat = 5:1), {} query / {} KV heads x {}, hidden {}, random weights (seed {})",
        a.layers, a.window, a.q_heads, a.kv_heads, a.head_dim, a.hidden, a.seed
    );
    let o = run(a)?;
    print!("{}", table(a, &o));
    if let Some(path) = &a.dump {
        std::fs::write(path, dump_json(a, &o))
            .map_err(|e| format!("--dump: cannot write {path}: {e}"))?;
        println!("wrote {path}");
    }
    Ok(())
}
