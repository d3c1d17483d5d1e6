//! Speculative decoding on the real models: greedy tokens with and without
//! speculation are the same (prompt lookup on every pool dtype, a batch
//! with a fork, a model drafting for itself at 100% acceptance), a sampled
//! run keeps its cache consistent, and bad input is refused with the cache
//! unchanged.

mod common;

use offgraph_kv::{CellCache, KvCellCache, KvDtype, SeqId};
use offgraph_kv_engine::model::OpenOptions;
use offgraph_kv_engine::spec::adapt::PROBE_EVERY;
use offgraph_kv_engine::spec::{check_same_vocab, DraftModel, Ngram, Sampling, StepCost};
use offgraph_kv_engine::{EngineError, Model, Source, Speculator, Stream};
use std::sync::{Mutex, MutexGuard, OnceLock};

fn open(path: std::path::PathBuf) -> Model {
    Model::open_with(path, OpenOptions::from_env()).unwrap()
}

// Each model loads once per test binary (a Model is Send, not Sync).
fn smollm2() -> MutexGuard<'static, Model> {
    static M: OnceLock<Mutex<Model>> = OnceLock::new();
    let m = M.get_or_init(|| Mutex::new(open(common::smollm2_gguf())));
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn gemma3() -> MutexGuard<'static, Model> {
    static M: OnceLock<Mutex<Model>> = OnceLock::new();
    let m = M.get_or_init(|| Mutex::new(open(common::gemma3_gguf())));
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Tokens generated per run.
const N: usize = 32;
const K_MAX: usize = 8;

/// A passage of real text followed by its own opening, so the model goes on
/// quoting it and prompt lookup has something to find: `n` tokens of the
/// passage and then its first 24 again.
fn quoting_prompt(model: &Model, n: usize) -> Vec<u32> {
    let text = std::fs::read_to_string("/usr/share/common-licenses/GPL-3").unwrap();
    let start = text.find("Preamble").unwrap();
    let ids = model.tokenizer().encode(&text[start..start + 8000], false);
    let mut p = ids[..n].to_vec();
    p.extend_from_slice(&ids[..24]);
    p
}

fn cache(model: &Model, n_cells: usize, dtype: KvDtype) -> KvCellCache {
    model.new_cache(n_cells, 8, 64, dtype, dtype).unwrap()
}

/// A new sequence holding `prompt` but its last token.
fn prefill(model: &Model, kc: &mut KvCellCache, prompt: &[u32]) -> SeqId {
    let seq = kc.cells_mut().seq_new().unwrap();
    let body = &prompt[..prompt.len() - 1];
    for (c, part) in body.chunks(64).enumerate() {
        let pos: Vec<usize> = (c * 64..c * 64 + part.len()).collect();
        model
            .forward(kc, part, &vec![seq; part.len()], &pos, &[part.len() - 1])
            .unwrap();
    }
    seq
}

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

/// `n` greedy tokens after `tokens` (held by `seq` but the last), one per step.
fn plain(model: &Model, kc: &mut KvCellCache, seq: SeqId, tokens: &[u32], n: usize) -> Vec<u32> {
    let mut last = *tokens.last().unwrap();
    let mut out = Vec::new();
    for pos in tokens.len() - 1..tokens.len() - 1 + n {
        let l = model.forward(kc, &[last], &[seq], &[pos], &[0]).unwrap();
        last = argmax(&l);
        out.push(last);
    }
    out
}

/// Steps `streams` until each has `n` new tokens; their first `n`.
fn speculate(
    model: &Model,
    kc: &mut KvCellCache,
    sp: &mut Speculator,
    streams: &mut [Stream],
    n: usize,
) -> Vec<Vec<u32>> {
    let start: Vec<usize> = streams.iter().map(|s| s.tokens().len()).collect();
    loop {
        let mut live: Vec<Stream> = Vec::new();
        let mut at: Vec<usize> = Vec::new();
        for (i, s) in streams.iter().enumerate() {
            let done = s.tokens().len() - start[i];
            if done < n {
                let mut s = s.clone();
                s.set_remaining(Some(n - done));
                live.push(s);
                at.push(i);
            }
        }
        if live.is_empty() {
            break;
        }
        sp.step(model, kc, &mut live).unwrap();
        for (s, i) in live.into_iter().zip(at) {
            assert_eq!(kc.cells().next_pos(s.seq()).unwrap() + 1, s.tokens().len());
            streams[i] = s;
        }
    }
    streams
        .iter()
        .zip(start)
        .map(|(s, a)| s.tokens()[a..a + n].to_vec())
        .collect()
}

/// Prompt lookup with drafts priced as free (no forward costs more than a
/// one-token one): every step drafts all it may, whatever this CPU measures.
fn ngram(k: usize) -> Speculator {
    let mut sp = Speculator::new(Source::Ngram(Ngram::default()), Sampling::Greedy, k).unwrap();
    sp.set_step_cost(StepCost::fixed(&[]).unwrap());
    sp
}

/// On every pool dtype: the prompt prefilled once, then plain greedy decode
/// on one fork and prompt lookup on another give the same tokens. Float32
/// gets a prompt of `first_len` tokens, the others shorter ones.
fn same_tokens_every_dtype(model: &Model, first_len: usize) {
    for dtype in KvDtype::ALL {
        let len = if dtype == KvDtype::Float32 {
            first_len
        } else {
            64
        };
        let prompt = quoting_prompt(model, len);
        let mut kc = cache(model, prompt.len() + 2 * N + 2 * K_MAX, dtype);
        let base = prefill(model, &mut kc, &prompt);
        let a = kc.cells_mut().seq_clone(base, None).unwrap();
        let want = plain(model, &mut kc, a, &prompt, N);
        kc.cells_mut().seq_free(a).unwrap();
        let mut sp = ngram(K_MAX);
        let mut s = [sp.stream(&kc, base, prompt.clone(), 0).unwrap()];
        let got = speculate(model, &mut kc, &mut sp, &mut s, N);
        assert_eq!(got[0], want, "{}", dtype.name());
        let st = sp.stats();
        // The quoted passage makes prompt lookup pay.
        assert!(st.accepted > 0 && st.emitted > st.steps, "{st:?}");
        eprintln!("{}: {st:?} acceptance {:.2}", dtype.name(), st.acceptance());
    }
}

#[test]
fn prompt_lookup_keeps_greedy_tokens_smollm2_every_dtype() {
    let m = smollm2();
    same_tokens_every_dtype(&m, 160);
}

#[test]
fn prompt_lookup_keeps_greedy_tokens_gemma3_every_dtype() {
    let m = gemma3();
    // Float32's prompt runs past the 512-token sliding window, so the ring
    // layers drop positions and rejected drafts rewind over a wrapped ring.
    assert!(m.config().windows.iter().flatten().all(|&w| w < 540));
    same_tokens_every_dtype(&m, 540);
}

/// Three sequences in one step each: a prompt, a fork of it whose pending
/// token differs (sharing all but its last cell), and another prompt. Each
/// gets the tokens it gets decoded alone.
fn batch_with_fork(model: &Model) {
    let p1 = quoting_prompt(model, 120);
    let mut p2 = p1.clone();
    *p2.last_mut().unwrap() = p1[30];
    let p3 = quoting_prompt(model, 60);
    let want: Vec<Vec<u32>> = [&p1, &p2, &p3]
        .iter()
        .map(|p| {
            let mut kc = cache(model, 400, KvDtype::Float32);
            let s = prefill(model, &mut kc, p);
            plain(model, &mut kc, s, p, N)
        })
        .collect();
    let mut kc = cache(model, 600, KvDtype::Float32);
    let a = prefill(model, &mut kc, &p1);
    let b = kc.cells_mut().seq_clone(a, None).unwrap();
    let c = prefill(model, &mut kc, &p3);
    let mut sp = ngram(K_MAX);
    let mut streams = [
        sp.stream(&kc, a, p1.clone(), 0).unwrap(),
        sp.stream(&kc, b, p2.clone(), 0).unwrap(),
        sp.stream(&kc, c, p3.clone(), 0).unwrap(),
    ];
    let got = speculate(model, &mut kc, &mut sp, &mut streams, N);
    assert_eq!(got, want);
    assert!(sp.stats().accepted > 0, "{:?}", sp.stats());
    kc.cells().audit().unwrap();
}

#[test]
fn a_batch_with_a_fork_keeps_greedy_tokens() {
    batch_with_fork(&smollm2());
}

#[test]
fn a_model_drafting_for_itself_is_always_accepted() {
    let m = smollm2();
    let prompt = quoting_prompt(&m, 40);
    let mut kc = cache(&m, 200, KvDtype::Float32);
    let s = prefill(&m, &mut kc, &prompt);
    let a = kc.cells_mut().seq_clone(s, None).unwrap();
    let want = plain(&m, &mut kc, a, &prompt, N);
    kc.cells_mut().seq_free(a).unwrap();

    let draft = open(common::smollm2_gguf());
    let dm = DraftModel::new(draft, &m, 200, 4, 64, KvDtype::Float32).unwrap();
    let mut sp = Speculator::new(Source::Model(Box::new(dm)), Sampling::Greedy, K_MAX).unwrap();
    sp.set_step_cost(StepCost::fixed(&[]).unwrap());
    let mut streams = [sp.stream(&kc, s, prompt.clone(), 0).unwrap()];
    let got = speculate(&m, &mut kc, &mut sp, &mut streams, N);
    assert_eq!(got[0], want);
    let st = sp.stats();
    assert!(st.drafted > 0 && st.accepted == st.drafted, "{st:?}");
    // Every draft kept: the estimate went up, and each step drafted what its
    // remaining tokens allowed (at most K_MAX).
    assert!(streams[0].acceptance() > 0.9, "{}", streams[0].acceptance());
    assert_eq!(st.drafted + st.steps, N as u64);
}

#[test]
fn a_sampled_run_keeps_its_cache_consistent() {
    let m = smollm2();
    let prompt = quoting_prompt(&m, 60);
    let mut kc = cache(&m, 300, KvDtype::Float16);
    let s = prefill(&m, &mut kc, &prompt);
    let src = Source::Ngram(Ngram::default());
    let mut sp = Speculator::new(src, Sampling::Temperature(0.8), K_MAX).unwrap();
    let mut streams = [sp.stream(&kc, s, prompt.clone(), 7).unwrap()];
    let got = speculate(&m, &mut kc, &mut sp, &mut streams, N);
    assert_eq!(got[0].len(), N);
    let st = sp.stats();
    assert_eq!(st.emitted, st.accepted + st.steps);
    kc.cells().audit().unwrap();
}

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    let m = smollm2();
    let g = gemma3();
    // Another vocabulary.
    let e = check_same_vocab(&m, &g).unwrap_err();
    assert!(
        matches!(e, EngineError::InvalidArgument(ref s) if s.contains("vocabulary")),
        "{e}"
    );
    // No draft length.
    let e = Speculator::new(Source::Ngram(Ngram::default()), Sampling::Greedy, 0).unwrap_err();
    assert!(matches!(e, EngineError::InvalidArgument(_)));
    let e = Speculator::new(
        Source::Ngram(Ngram::default()),
        Sampling::Temperature(0.0),
        4,
    );
    assert!(matches!(e, Err(EngineError::InvalidArgument(_))));

    let prompt = quoting_prompt(&m, 30);
    let mut kc = cache(&m, 200, KvDtype::Float32);
    let s = prefill(&m, &mut kc, &prompt);
    let mut sp = ngram(4);
    // A stream whose tokens the sequence does not hold.
    assert!(sp.stream(&kc, s, prompt[..10].to_vec(), 0).is_err());
    let good = sp.stream(&kc, s, prompt.clone(), 0).unwrap();
    let before: CellCache = kc.cells().clone();
    let mut twice = [good.clone(), good.clone()];
    let e = sp.step(&m, &mut kc, &mut twice).unwrap_err();
    assert!(matches!(e, EngineError::InvalidArgument(_)), "{e}");
    assert_eq!(*kc.cells(), before);
    let mut none: [Stream; 0] = [];
    assert!(sp.step(&m, &mut kc, &mut none).is_err());
    assert_eq!(*kc.cells(), before);
    // The sequence was rewound behind the stream's back.
    kc.cells_mut().seq_rm(s, prompt.len() - 2, None).unwrap();
    let before = kc.cells().clone();
    let mut stale = [good];
    let e = sp.step(&m, &mut kc, &mut stale).unwrap_err();
    assert!(matches!(e, EngineError::InvalidArgument(_)), "{e}");
    assert_eq!(*kc.cells(), before);
    assert_eq!(sp.stats().steps, 0);
    assert_eq!(stale[0].tokens(), prompt.as_slice());
}

/// `okv-run` with `--spec ngram` prints what it prints without, plus the
/// speculation line; a draft model of another vocabulary exits 1 naming it.
#[test]
fn okv_run_spec_keeps_the_text_and_refuses_another_vocabulary() {
    let run = |extra: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_okv-run"))
            .arg(common::smollm2_gguf())
            .args([
                "-p",
                "Repeat after me: the cat sat on the mat. The cat sat",
                "-n",
                "24",
            ])
            .args(extra)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        (
            out.status.code(),
            String::from_utf8(out.stdout).unwrap(),
            err,
        )
    };
    let (code, plain, _) = run(&[]);
    assert_eq!(code, Some(0));
    let (code, spec, err) = run(&["--spec", "ngram", "--spec-max", "4"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(spec, plain);
    assert!(
        err.contains("speculation:") && err.contains("accepted"),
        "{err}"
    );
    let gemma = common::gemma3_gguf();
    let (code, out, err) = run(&["--spec", gemma.to_str().unwrap()]);
    assert_eq!(code, Some(1), "{err}");
    assert!(out.is_empty() && err.contains("vocabulary"), "{err}");
}

/// Draft lengths follow the step cost: with forwards priced by 4-token
/// chunks a draft ends at a chunk's end (3 or 7 after the pending token);
/// with every draft priced at 10x, only a probe every `PROBE_EVERY` steps
/// drafts. Greedy tokens are the plain ones either way.
#[test]
fn draft_lengths_follow_the_step_cost() {
    let m = smollm2();
    let prompt = quoting_prompt(&m, 120);
    let chunked: Vec<(usize, f64)> = (1..=16)
        .map(|t: usize| (t, 1.0 + 0.5 * (t.div_ceil(4) - 1) as f64))
        .collect();
    let costly: Vec<(usize, f64)> = (2..=16).map(|t| (t, 10.0)).collect();
    let mut kc = cache(&m, prompt.len() + 4 * N + 4 * K_MAX, KvDtype::Float32);
    let base = prefill(&m, &mut kc, &prompt);
    let a = kc.cells_mut().seq_clone(base, None).unwrap();
    let want = plain(&m, &mut kc, a, &prompt, N);
    kc.cells_mut().seq_free(a).unwrap();
    for (name, cost) in [("chunked", chunked), ("costly", costly)] {
        let seq = kc.cells_mut().seq_clone(base, None).unwrap();
        let mut sp = Speculator::new(Source::Ngram(Ngram::default()), Sampling::Greedy, 8).unwrap();
        sp.set_step_cost(StepCost::fixed(&cost).unwrap());
        let mut s = [sp.stream(&kc, seq, prompt.clone(), 0).unwrap()];
        let (mut got, mut lens) = (Vec::new(), Vec::new());
        while got.len() < N {
            let room = N - got.len();
            s[0].set_remaining(Some(room));
            got.extend(sp.step(&m, &mut kc, &mut s).unwrap().concat());
            lens.push((s[0].draft_len(), room));
        }
        assert_eq!(got[..N], want[..], "{name}");
        let drafted: Vec<usize> = lens.iter().map(|l| l.0).filter(|&k| k > 0).collect();
        assert!(!drafted.is_empty(), "{name}: {lens:?}");
        if name == "chunked" {
            // Ngram may find fewer tokens than asked; never more.
            assert!(
                lens.iter().all(|&(k, room)| k <= 7 && k < room.max(1)),
                "{lens:?}"
            );
            assert!(drafted.iter().any(|&k| k == 3 || k == 7), "{lens:?}");
        } else {
            assert!(drafted.len() <= lens.len() / PROBE_EVERY + 1, "{lens:?}");
        }
        kc.cells_mut().seq_free(seq).unwrap();
    }
}
