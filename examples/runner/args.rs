//! The runner's flags: the demo's workload and model sizes, and their parser.

use offgraph_kv::{Backend, LayerPolicy};

#[derive(Debug, Clone)]
pub(crate) struct Args {
    pub(crate) seqs: usize,
    pub(crate) prefix: usize,
    pub(crate) decode: usize,
    pub(crate) chunk: usize,
    pub(crate) layers: usize,
    pub(crate) window: usize,
    pub(crate) hidden: usize,
    pub(crate) q_heads: usize,
    pub(crate) kv_heads: usize,
    pub(crate) head_dim: usize,
    pub(crate) vocab: usize,
    pub(crate) seed: i64,
    pub(crate) threads: Option<usize>,
    pub(crate) backend: Backend,
    pub(crate) dump: Option<String>,
}

impl Default for Args {
    /// The Python random-weight demo's defaults (`offgraph-kv demo --random --help`).
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
    pub(crate) fn is_flat(&self, layer: usize) -> bool {
        (layer + 1).is_multiple_of(6)
    }

    pub(crate) fn policy(&self, layer: usize) -> LayerPolicy {
        if self.is_flat(layer) {
            LayerPolicy::Flat
        } else {
            LayerPolicy::Ring {
                window: self.window,
            }
        }
    }
}

pub(crate) const USAGE: &str = "\
usage: runner [--seqs N] [--prefix N] [--decode N] [--chunk N] [--layers N]
              [--window N] [--hidden N] [--q-heads N] [--kv-heads N]
              [--head-dim N] [--vocab N] [--seed INT] [--threads N]
              [--backend {auto,native,xnnpack}] [--dump PATH]

The random-weight demo's workload (`offgraph-kv demo --random`: same weights, prompt and tokens)
in plain Rust.

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

pub(crate) fn positive(flag: &str, v: &str) -> Result<usize, String> {
    match v.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!(
            "argument {flag}: expected a positive integer, got {v:?}"
        )),
    }
}

/// `Ok(None)`: `--help` was asked for.
pub(crate) fn parse_args(argv: &[String]) -> Result<Option<Args>, String> {
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
