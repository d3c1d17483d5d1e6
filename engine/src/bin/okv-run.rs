//! okv-run: prompt in, text out, over a GGUF model on the native engine.
//!
//! `okv-run MODEL.gguf -p PROMPT [-n N] [--threads N] [--kv-dtype D] [--chat]
//! [--temp T] [--seed S] [--no-repack] [--spec ngram|DRAFT.gguf] [--spec-max K]`.
//! Greedy unless `--temp` is above 0. The text streams to stdout as whole
//! UTF-8 characters; the prefill and decode rates (and with `--spec` the
//! drafted and accepted tokens) go to stderr. Bad arguments print the usage
//! and exit 2; a model or cache error (a draft model of another vocabulary)
//! exits 1.

use offgraph_kv::KvDtype;
use offgraph_kv_engine::model::OpenOptions;
use offgraph_kv_engine::spec::{DraftModel, Ngram, Sampling};
use offgraph_kv_engine::{Model, Result, Source, SpecStats, Speculator};
use std::io::Write;
use std::time::Instant;

const USAGE: &str = "usage: okv-run MODEL.gguf -p PROMPT [-n N] [--threads N] \
[--kv-dtype float32|float16|bfloat16|q8_0] [--chat] [--temp T] [--seed S] [--no-repack] \
[--spec ngram|DRAFT.gguf] [--spec-max K]

  -p, --prompt TEXT   the prompt (required)
  -n N                tokens to generate (default 64)
  --threads N         worker threads (default: all cores)
  --kv-dtype D        K/V pool type (default float32)
  --chat              wrap the prompt in the model's chat format
  --temp T            sample at temperature T (default 0: greedy)
  --seed S            sampling seed (default 0)
  --no-repack         read the weights in the file's layout (no copy at open)
  --spec SRC          speculative decoding: drafts from prompt lookup (ngram)
                      or a draft model of the same vocabulary (a GGUF path)
  --spec-max K        longest draft (default 8)";

/// What `parse_args` returns for `--help` (usage on stdout, exit 0).
const HELP: &str = "help";

/// Tokens one prefill step carries at most.
const PREFILL_CHUNK: usize = 256;

#[derive(Debug)]
struct Args {
    model: String,
    prompt: String,
    n: usize,
    threads: Option<usize>,
    kv_dtype: KvDtype,
    chat: bool,
    temp: f32,
    seed: u64,
    repack: bool,
    spec: Option<String>,
    spec_max: usize,
}

fn parse_args(argv: &[String]) -> std::result::Result<Args, String> {
    let mut model = None;
    let mut prompt = None;
    let mut a = Args {
        model: String::new(),
        prompt: String::new(),
        n: 64,
        threads: None,
        kv_dtype: KvDtype::Float32,
        chat: false,
        temp: 0.0,
        seed: 0,
        repack: true,
        spec: None,
        spec_max: 8,
    };
    let mut it = argv.iter();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{name}: expected a value"))
        };
        match arg.as_str() {
            "-p" | "--prompt" => prompt = Some(value(arg)?),
            "-n" => a.n = number(arg, &value(arg)?)?,
            "--threads" => {
                let t: usize = number(arg, &value(arg)?)?;
                if t == 0 {
                    return Err("--threads: expected at least 1, got 0".into());
                }
                a.threads = Some(t);
            }
            "--kv-dtype" => {
                let v = value(arg)?;
                a.kv_dtype = KvDtype::parse(&v).map_err(|e| format!("--kv-dtype: {e}"))?;
            }
            "--chat" => a.chat = true,
            "--temp" => {
                let t: f32 = number(arg, &value(arg)?)?;
                if !(t.is_finite() && t >= 0.0) {
                    return Err(format!("--temp: expected a finite T >= 0, got {t}"));
                }
                a.temp = t;
            }
            "--seed" => a.seed = number(arg, &value(arg)?)?,
            "--no-repack" => a.repack = false,
            "--spec" => a.spec = Some(value(arg)?),
            "--spec-max" => {
                let k: usize = number(arg, &value(arg)?)?;
                if k == 0 {
                    return Err("--spec-max: expected at least 1, got 0".into());
                }
                a.spec_max = k;
            }
            "-h" | "--help" => return Err(HELP.into()),
            s if s.starts_with('-') => return Err(format!("unknown option {s:?}")),
            s => {
                if model.replace(s.to_string()).is_some() {
                    return Err(format!("one model path expected, got a second: {s:?}"));
                }
            }
        }
    }
    a.model = model.ok_or("the model path is missing")?;
    a.prompt = prompt.ok_or("-p PROMPT is missing")?;
    Ok(a)
}

fn number<T: std::str::FromStr>(name: &str, v: &str) -> std::result::Result<T, String> {
    v.parse()
        .map_err(|_| format!("{name}: expected a number, got {v:?}"))
}

/// The prompt in the model's chat format, as its template (the file's, else
/// the family's default) shows it: Gemma's turns, ChatML (with the
/// template's default system message, as SmolLM2's has one), else as is.
fn chat_text(model: &Model, prompt: &str) -> String {
    let template = model.chat_template().unwrap_or("");
    if template.contains("<start_of_turn>") {
        return format!("<start_of_turn>user\n{prompt}<end_of_turn>\n<start_of_turn>model\n");
    }
    if template.contains("<|im_start|>") {
        let open = "<|im_start|>system\n";
        let system = template
            .find(open)
            .map(|at| &template[at + open.len()..])
            .and_then(|rest| rest.find("<|im_end|>").map(|end| &rest[..end]))
            .filter(|s| !s.contains("{{") && !s.contains("{%"));
        let mut text = String::new();
        if let Some(s) = system {
            text.push_str(&format!("<|im_start|>system\n{s}<|im_end|>\n"));
        }
        text.push_str(&format!(
            "<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
        ));
        return text;
    }
    prompt.to_string()
}

/// A small seeded generator (SplitMix64) for sampling.
struct Rng(u64);

impl Rng {
    fn next_f32(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 40) as f32 / (1u64 << 24) as f32
    }
}

fn pick(logits: &[f32], temp: f32, rng: &mut Rng) -> u32 {
    let (best, max) =
        logits.iter().enumerate().fold(
            (0, f32::NEG_INFINITY),
            |b, (i, &v)| if v > b.1 { (i, v) } else { b },
        );
    if temp <= 0.0 {
        return best as u32;
    }
    let total: f32 = logits.iter().map(|&v| ((v - max) / temp).exp()).sum();
    let mut u = rng.next_f32() * total;
    for (i, &v) in logits.iter().enumerate() {
        u -= ((v - max) / temp).exp();
        if u <= 0.0 {
            return i as u32;
        }
    }
    best as u32
}

/// Writes the whole UTF-8 characters of `pending` and keeps an incomplete tail.
fn flush_utf8(pending: &mut Vec<u8>, out: &mut impl Write) -> std::io::Result<()> {
    loop {
        match std::str::from_utf8(pending) {
            Ok(s) => {
                out.write_all(s.as_bytes())?;
                pending.clear();
                break;
            }
            Err(e) => {
                let good = e.valid_up_to();
                out.write_all(pending.get(..good).unwrap_or_default())?;
                match e.error_len() {
                    // An incomplete character: wait for the next token's bytes.
                    None => {
                        pending.drain(..good);
                        break;
                    }
                    Some(bad) => {
                        out.write_all("\u{FFFD}".as_bytes())?;
                        pending.drain(..good + bad);
                    }
                }
            }
        }
    }
    out.flush()
}

fn run(a: &Args) -> Result<()> {
    let opts = OpenOptions {
        repack: a.repack && OpenOptions::from_env().repack,
    };
    let mut model = Model::open_with(&a.model, opts)?;
    if let Some(t) = a.threads {
        model.set_threads(t);
    }
    let tok = model.tokenizer();
    let text = if a.chat {
        chat_text(&model, &a.prompt)
    } else {
        a.prompt.clone()
    };
    let ids = tok.encode(&text, true);
    if ids.is_empty() {
        return Err(offgraph_kv_engine::EngineError::InvalidArgument(
            "the prompt encodes to no tokens".into(),
        ));
    }
    let turn_ends = model.chat_defaults().turn_ends.iter();
    let stops: Vec<u32> = std::iter::once(tok.eos())
        .chain(turn_ends.map(|p| tok.token_id(p)))
        .flatten()
        .collect();
    // A verification step scores the pending token and up to K drafts.
    let spec_step = if a.spec.is_some() { a.spec_max + 1 } else { 1 };
    let max_step = ids.len().clamp(1, PREFILL_CHUNK).max(spec_step);
    let n_cells = ids.len() + a.n.max(1) + spec_step;
    let mut kc = model.new_cache(n_cells, 1, max_step, a.kv_dtype, a.kv_dtype)?;
    let seq = kc.cells_mut().seq_new()?;
    let mut spec = match &a.spec {
        Some(src) => Some(speculator(a, &model, src, n_cells, max_step)?),
        None => None,
    };

    let t0 = Instant::now();
    let mut logits = Vec::new();
    for (c, part) in ids.chunks(max_step).enumerate() {
        let pos: Vec<usize> = (c * max_step..c * max_step + part.len()).collect();
        logits = model.forward(
            &mut kc,
            part,
            &vec![seq; part.len()],
            &pos,
            &[part.len() - 1],
        )?;
    }
    let prefill_s = t0.elapsed().as_secs_f64();

    let mut rng = Rng(a.seed);
    let (mut pending, mut stdout) = (Vec::new(), std::io::stdout().lock());
    let mut emit = |id: u32| -> Result<()> {
        if !tok.is_special(id) {
            pending.extend_from_slice(&tok.token_bytes(id)?);
            flush_utf8(&mut pending, &mut stdout)
                .map_err(|e| offgraph_kv_engine::EngineError::Io(e.to_string()))?;
        }
        Ok(())
    };
    let mut decoded = 0usize;
    let t1 = Instant::now();
    if a.n > 0 {
        let first = pick(&logits, a.temp, &mut rng);
        if !stops.contains(&first) {
            emit(first)?;
            decoded = match spec.as_mut() {
                Some(sp) => {
                    let mut toks = ids.clone();
                    toks.push(first);
                    let stream = sp.stream(&kc, seq, toks, a.seed)?;
                    decode_spec(&model, &mut kc, sp, stream, a.n - 1, &stops, &mut emit)?
                }
                None => {
                    let mut next = first;
                    let mut n = 0;
                    for i in 1..a.n {
                        logits =
                            model.forward(&mut kc, &[next], &[seq], &[ids.len() + i - 1], &[0])?;
                        n += 1;
                        next = pick(&logits, a.temp, &mut rng);
                        if stops.contains(&next) {
                            break;
                        }
                        emit(next)?;
                    }
                    n
                }
            };
        }
    }
    let decode_s = t1.elapsed().as_secs_f64();
    if !pending.is_empty() {
        let _ = stdout.write_all(String::from_utf8_lossy(&pending).as_bytes());
    }
    let _ = writeln!(stdout);
    let _ = stdout.flush();
    let rate = |n: usize, s: f64| if s > 0.0 { n as f64 / s } else { 0.0 };
    eprintln!(
        "prefill: {} tokens, {:.1} tok/s; decode: {} tokens, {:.1} tok/s",
        ids.len(),
        rate(ids.len(), prefill_s),
        decoded,
        rate(decoded, decode_s)
    );
    if let Some(sp) = &spec {
        print_spec_stats(&sp.stats());
        let cost: Vec<String> = sp
            .step_cost()
            .ratios()
            .iter()
            .map(|(n, r)| format!("{n}: {r:.2}x"))
            .collect();
        eprintln!(
            "speculation: a forward by its tokens over a one-token one, as measured: {}",
            cost.join(", ")
        );
    }
    Ok(())
}

/// The speculator `--spec` names: prompt lookup, or a draft model (refused
/// when its vocabulary is not the target's).
fn speculator(
    a: &Args,
    model: &Model,
    src: &str,
    n_cells: usize,
    max_step: usize,
) -> Result<Speculator> {
    let source = if src == "ngram" {
        Source::Ngram(Ngram::default())
    } else {
        let opts = OpenOptions {
            repack: a.repack && OpenOptions::from_env().repack,
        };
        let mut draft = Model::open_with(src, opts)?;
        draft.set_threads(model.threads());
        let dm = DraftModel::new(draft, model, n_cells, 1, max_step, a.kv_dtype)?;
        Source::Model(Box::new(dm))
    };
    let sampling = if a.temp > 0.0 {
        Sampling::Temperature(a.temp)
    } else {
        Sampling::Greedy
    };
    Speculator::new(source, sampling, a.spec_max)
}

/// Up to `n` more tokens by speculative steps, each passed to `emit` until a
/// stop token; the tokens produced.
fn decode_spec(
    model: &Model,
    kc: &mut offgraph_kv::KvCellCache,
    sp: &mut Speculator,
    stream: offgraph_kv_engine::Stream,
    n: usize,
    stops: &[u32],
    emit: &mut impl FnMut(u32) -> Result<()>,
) -> Result<usize> {
    let mut streams = [stream];
    let mut done = 0usize;
    while done < n {
        streams[0].set_remaining(Some(n - done));
        let new = sp.step(model, kc, &mut streams)?;
        for &id in new.iter().flatten().take(n - done) {
            done += 1;
            if stops.contains(&id) {
                return Ok(done);
            }
            emit(id)?;
        }
    }
    Ok(done)
}

fn print_spec_stats(st: &SpecStats) {
    eprintln!(
        "speculation: {} steps, drafted {} tokens, accepted {} ({:.1}%), {:.2} tokens per step",
        st.steps,
        st.drafted,
        st.accepted,
        100.0 * st.acceptance(),
        if st.steps > 0 {
            st.emitted as f64 / st.steps as f64
        } else {
            0.0
        }
    );
}

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let args = match parse_args(&argv) {
        Ok(a) => a,
        Err(msg) if msg == HELP => {
            println!("{USAGE}");
            return;
        }
        Err(msg) => {
            {
                eprintln!("okv-run: {msg}");
            }
            eprintln!("{USAGE}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(&args) {
        eprintln!("okv-run: {e}");
        std::process::exit(1);
    }
}
