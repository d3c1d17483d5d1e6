//! Model families and the forward over a `KvCellCache`.
//!
//! [`Model::open`] maps a GGUF file, reads its family's config
//! ([`ModelConfig`]), finds and shape-checks every weight and builds the
//! tokenizer from the file's metadata. [`Model::forward`] runs one step of
//! any number of sequences' tokens: the cache places them
//! (`begin_step`), every layer writes its K/V through the cache and attends
//! over what each token sees, and only the rows asked for get logits.
//!
//! Families ([`family`]: Llama with SmolLM2, Gemma 3) set the knobs of
//! [`ModelConfig`] (embedding scale, activation, QK and sandwich norms, RoPE
//! pairing, bases and scaling, attention scale, sliding windows), which also
//! decide the tensor plan; the forward is one code path reading the knobs.

mod config;
mod exact;
pub mod family;
mod forward;
mod gate;
mod ops;
mod weights;

pub use config::{Activation, Arch, ChatDefaults, Family, ModelConfig, RopeStyle};

use crate::error::{EngineError, Result};
use crate::gguf::GgufFile;
use crate::tokenizer::Tokenizer;
use forward::{Ctx, Scratch};
use offgraph_kv::{CacheConfig, KvCellCache, KvDtype, LayerConfig, LayerPolicy, SeqId};
use std::path::Path;
use std::sync::Mutex;
use weights::Weights;

/// How [`Model::open_with`] loads a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenOptions {
    /// Copy the matrices' whole groups of 16 rows at open into the layout
    /// the AVX-512 VNNI kernels load contiguously (Q4_0, Q4_1, Q5_0, Q8_0,
    /// Q4_K, Q6_K; elsewhere nothing is packed), releasing the file's pages
    /// of each packed tensor. Costs the packing time at open; resident memory
    /// stays about the file's size.
    pub repack: bool,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions { repack: true }
    }
}

impl OpenOptions {
    /// The defaults, with `OKV_REPACK=0` in the environment turning
    /// repacking off (what [`Model::open`] reads).
    pub fn from_env() -> Self {
        OpenOptions {
            repack: std::env::var("OKV_REPACK").map_or(true, |v| v.trim() != "0"),
        }
    }
}

/// A GGUF model ready to run: the mapping, its config, weights and tokenizer.
#[derive(Debug)]
pub struct Model {
    file: GgufFile,
    cfg: ModelConfig,
    weights: Weights,
    tokenizer: Tokenizer,
    threads: usize,
    exact: bool,
    /// Bytes of the weights packed at open.
    packed_bytes: usize,
    /// One forward at a time uses the buffers; they only grow.
    scratch: Mutex<Scratch>,
}

impl Model {
    /// Maps and checks `path`: `Unsupported` for an architecture no family
    /// reads, a metadata key that changes the math which the family does not
    /// implement, or a tensor its plan does not consume; `Model` for a missing
    /// or mistyped key or tensor or a tensor of the wrong shape.
    ///
    /// Repacks the weights ([`OpenOptions`]) unless `OKV_REPACK=0`.
    pub fn open(path: impl AsRef<Path>) -> Result<Model> {
        Self::open_with(path, OpenOptions::from_env())
    }

    /// [`Model::open`] with explicit options (the environment is not read).
    pub fn open_with(path: impl AsRef<Path>, opts: OpenOptions) -> Result<Model> {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self::open_with_threads(path, opts, threads)
    }

    /// [`Model::open_with`] on `threads` threads (at least 1): they pack the
    /// weights, and the model runs on them ([`Model::set_threads`]). The
    /// packed bytes are the same for any number.
    pub fn open_with_threads(
        path: impl AsRef<Path>,
        opts: OpenOptions,
        threads: usize,
    ) -> Result<Model> {
        let threads = threads.max(1);
        let mut file = GgufFile::open(path)?;
        let arch = Arch::parse(file.architecture()?)?;
        let vocab = Weights::vocab_of(&file)?;
        // The model reads its metadata once, here; the rest of its life it needs only tensors.
        let meta = file.take_metadata();
        let cfg = ModelConfig::from_metadata(arch, &meta, vocab)?;
        let mut weights = Weights::load(&file, &cfg)?;
        let tokenizer = Tokenizer::from_metadata(&meta)?;
        let packed_bytes = if opts.repack {
            weights.repack(&file, threads)?
        } else {
            0
        };
        drop(meta);
        Ok(Model {
            file,
            cfg,
            weights,
            tokenizer,
            threads,
            exact: false,
            packed_bytes,
            scratch: Mutex::new(Scratch::default()),
        })
    }

    /// Bytes of the weights packed at open (0 without repacking, or on a
    /// CPU whose kernels read the file's layout).
    pub fn packed_bytes(&self) -> usize {
        self.packed_bytes
    }

    /// Each packed matrix's tensor name and packed bytes, in the forward's
    /// order (a fused tensor's parts one after the other).
    pub fn packed_weights(&self) -> Vec<(&str, &[u8])> {
        self.weights.packed_parts()
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The family's chat defaults: its turn-end pieces and the template for
    /// files that carry none.
    pub fn chat_defaults(&self) -> &'static ChatDefaults {
        &self.cfg.arch.family().chat
    }

    /// The chat template: the file's, else the family's default.
    pub fn chat_template(&self) -> Option<&str> {
        self.tokenizer
            .chat_template()
            .or(self.chat_defaults().template)
    }

    /// Threads for the matmuls and attention (at least 1).
    pub fn set_threads(&mut self, n: usize) {
        self.threads = n.max(1);
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Reference mode: every matmul decodes the weight rows to f32 and
    /// multiplies f32 activations (single-threaded, many times slower)
    /// instead of the kernels' quantized activations. Tests use it to tell
    /// the forward's own error from the dot kernels' rounding.
    pub fn set_exact_matmul(&mut self, exact: bool) {
        self.exact = exact;
    }

    /// The cache layout the model needs: Gemma 3's sliding layers are
    /// `Ring { window }`, its full layers and every Llama layer `Flat`; the
    /// capacity is the model's context length.
    pub fn cache_config(
        &self,
        max_step: usize,
        k_dtype: KvDtype,
        v_dtype: KvDtype,
    ) -> Result<CacheConfig> {
        let cfg = &self.cfg;
        let capacity = cfg.context_length;
        let layers = self.layer_configs();
        let cc = CacheConfig {
            initial_capacity: capacity.min(256),
            max_step,
            ..CacheConfig::new(capacity, cfg.n_layers, layers)
        }
        .with_dtypes(k_dtype, v_dtype);
        cc.validate()?;
        Ok(cc)
    }

    /// A cache of `n_cells` cells for up to `n_seq_max` sequences, laid out by
    /// [`Model::cache_config`].
    pub fn new_cache(
        &self,
        n_cells: usize,
        n_seq_max: usize,
        max_step: usize,
        k_dtype: KvDtype,
        v_dtype: KvDtype,
    ) -> Result<KvCellCache> {
        let cc = self.cache_config(max_step, k_dtype, v_dtype)?;
        Ok(KvCellCache::new(cc, n_cells, n_seq_max)?)
    }

    fn layer_configs(&self) -> Vec<LayerConfig> {
        let cfg = &self.cfg;
        cfg.windows
            .iter()
            .map(|w| {
                let policy = match *w {
                    Some(window) => LayerPolicy::Ring { window },
                    None => LayerPolicy::Flat,
                };
                LayerConfig::new(policy, cfg.n_head_kv, cfg.head_dim)
            })
            .collect()
    }

    /// One step: token `i` of sequence `seqs[i]` at `positions[i]`. Opens
    /// the step itself (`begin_step`) and returns the logits of the tokens
    /// `logit_rows` names, `[logit_rows.len(), vocab]` row-major.
    ///
    /// All or nothing: arguments are checked before the cache is touched
    /// (`InvalidArgument`: lengths, a token id at or above the vocabulary, a
    /// logit row beyond the step; `Cache`: what `begin_step` refuses, such as
    /// an unknown sequence or no room), and a failure after placement drops
    /// the step's positions again, so the cache is as before.
    pub fn forward(
        &self,
        cache: &mut KvCellCache,
        tokens: &[u32],
        seqs: &[SeqId],
        positions: &[usize],
        logit_rows: &[usize],
    ) -> Result<Vec<f32>> {
        if seqs.len() != tokens.len() {
            return Err(EngineError::InvalidArgument(format!(
                "forward: {} tokens but {} sequence ids",
                tokens.len(),
                seqs.len()
            )));
        }
        self.check_step(cache, tokens, positions, logit_rows)?;
        cache.begin_step(seqs, positions)?;
        let out = self.run(cache, tokens, positions, logit_rows);
        if out.is_err() {
            roll_back(cache, seqs, positions);
        }
        out
    }

    /// [`Model::forward`] when the caller already opened the step with
    /// `begin_step(seqs, positions)` (as the Python batch generator does):
    /// `tokens` and `positions` must be the open step's. A refused call
    /// (the same checks, plus a step that is not open or whose positions
    /// differ) changes nothing and leaves the step open; a failure after the
    /// first layer wrote drops the step's positions, as `forward` does.
    pub fn forward_open_step(
        &self,
        cache: &mut KvCellCache,
        tokens: &[u32],
        positions: &[usize],
        logit_rows: &[usize],
    ) -> Result<Vec<f32>> {
        self.check_step(cache, tokens, positions, logit_rows)?;
        let seqs = {
            let plan = cache.plan(0)?;
            if plan.positions() != positions {
                return Err(EngineError::InvalidArgument(format!(
                    "forward_open_step: the open step has {} tokens at other positions than the \
                     {} given",
                    plan.n_tokens(),
                    positions.len()
                )));
            }
            plan.seq_ids().to_vec()
        };
        let out = self.run(cache, tokens, positions, logit_rows);
        if out.is_err() {
            roll_back(cache, &seqs, positions);
        }
        out
    }

    fn run(
        &self,
        cache: &mut KvCellCache,
        tokens: &[u32],
        positions: &[usize],
        logit_rows: &[usize],
    ) -> Result<Vec<f32>> {
        let ctx = Ctx {
            file: &self.file,
            cfg: &self.cfg,
            w: &self.weights,
            threads: self.threads,
            exact: self.exact,
        };
        // A panic elsewhere cannot leave the buffers inconsistent: they are
        // rewritten before every read.
        let mut scratch = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        ctx.run(&mut scratch, cache, tokens, positions, logit_rows)
    }

    /// The checks every step passes before the cache is touched.
    fn check_step(
        &self,
        cache: &KvCellCache,
        tokens: &[u32],
        positions: &[usize],
        logit_rows: &[usize],
    ) -> Result<()> {
        let t = tokens.len();
        if t == 0 || positions.len() != t {
            return Err(EngineError::InvalidArgument(format!(
                "forward: expected one position per token and at least one token, got {t} \
                 tokens and {} positions",
                positions.len()
            )));
        }
        if let Some(&bad) = tokens.iter().find(|&&id| id as usize >= self.cfg.vocab) {
            return Err(EngineError::InvalidArgument(format!(
                "token id {bad}: expected below the vocabulary size {}",
                self.cfg.vocab
            )));
        }
        if let Some(&bad) = logit_rows.iter().find(|&&r| r >= t) {
            return Err(EngineError::InvalidArgument(format!(
                "logit row {bad}: expected below the step's {t} tokens"
            )));
        }
        let cc = cache.config();
        let want = self.layer_configs();
        let fits = cc.n_layers == self.cfg.n_layers
            && want
                .iter()
                .enumerate()
                .all(|(i, w)| cc.layer(i).is_ok_and(|l| l == w));
        if !fits {
            return Err(EngineError::InvalidArgument(format!(
                "cache: expected the layout of Model::cache_config ({} layers of {} KV heads x {}), \
                 got {} layers {:?}",
                self.cfg.n_layers,
                self.cfg.n_head_kv,
                self.cfg.head_dim,
                cc.n_layers,
                cc.layers.first()
            )));
        }
        Ok(())
    }
}

/// Drops a failed step's positions (each sequence's from its first in the
/// step; nothing it held before the step is at or beyond it).
fn roll_back(cache: &mut KvCellCache, seqs: &[SeqId], positions: &[usize]) {
    let mut first: Vec<(SeqId, usize)> = Vec::new();
    for (&s, &p) in seqs.iter().zip(positions) {
        match first.iter_mut().find(|(q, _)| *q == s) {
            Some(e) => e.1 = e.1.min(p),
            None => first.push((s, p)),
        }
    }
    for (s, p) in first {
        // The sequence was live at begin_step; nothing between could free it.
        let _ = cache.cells_mut().seq_rm(s, p, None);
    }
}
