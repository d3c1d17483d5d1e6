//! okv-run end to end: its greedy text is the library's greedy tokens'
//! decode, stderr carries both rates, and bad arguments exit 2.

mod common;

use offgraph_kv::KvDtype;
use offgraph_kv_engine::Model;
use std::process::Command;

const PROMPT: &str = "The capital of France is";

/// The library's greedy continuation of `PROMPT` (the runner's encoding).
fn greedy(n: usize) -> String {
    let model = Model::open(common::smollm2_gguf()).unwrap();
    let tok = model.tokenizer();
    let ids = tok.encode(PROMPT, true);
    let mut kc = model
        .new_cache(
            ids.len() + n,
            1,
            ids.len(),
            KvDtype::Float32,
            KvDtype::Float32,
        )
        .unwrap();
    let s = kc.cells_mut().seq_new().unwrap();
    let pos: Vec<usize> = (0..ids.len()).collect();
    let mut logits = model
        .forward(&mut kc, &ids, &vec![s; ids.len()], &pos, &[ids.len() - 1])
        .unwrap();
    let mut out = Vec::new();
    for i in 0..n {
        let next = logits
            .iter()
            .enumerate()
            .fold(
                (0, f32::NEG_INFINITY),
                |b, (i, &v)| if v > b.1 { (i, v) } else { b },
            )
            .0 as u32;
        if Some(next) == tok.eos() {
            break;
        }
        out.push(next);
        logits = model
            .forward(&mut kc, &[next], &[s], &[ids.len() + i], &[0])
            .unwrap();
    }
    tok.decode(&out, true).unwrap()
}

#[test]
fn okv_run_prints_the_greedy_text_and_both_rates() {
    let path = common::smollm2_gguf();
    let out = Command::new(env!("CARGO_BIN_EXE_okv-run"))
        .arg(&path)
        .args(["-p", PROMPT, "-n", "8", "--threads", "1"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    let text = stdout.strip_suffix('\n').unwrap_or(&stdout);
    let want = greedy(8);
    println!("okv-run: {text:?}\n{stderr}");
    assert_eq!(text, want);
    let rates = stderr.lines().last().unwrap_or("");
    assert!(
        rates.starts_with("prefill: ")
            && rates.contains(" tok/s; decode: ")
            && rates.ends_with(" tok/s"),
        "{stderr}"
    );
}

/// `okv-run MODEL -p PROMPT -n 48 --chat --kv-dtype q8_0` plus `extra`:
/// (stdout, stderr), after checking it exited 0.
fn chat(extra: &[&str]) -> (String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_okv-run"))
        .arg(common::smollm2_gguf())
        .args(["-p", "What is the capital of France? Answer in one word."])
        .args(["-n", "48", "--chat", "--kv-dtype", "q8_0"])
        .args(extra)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    (String::from_utf8(out.stdout).unwrap(), stderr)
}

#[test]
fn okv_run_chat_with_a_q8_0_cache_stops_at_the_turn_end() {
    // Greedy, so the stop is tested on one known path (a sampled answer may
    // ramble past the budget on a given seed, which says nothing about it).
    let (text, stderr) = chat(&["--temp", "0"]);
    println!("okv-run --chat: {text:?}\n{stderr}");
    // The chat markers are special tokens: never printed.
    assert!(
        !text.contains("<|im_start|>") && !text.contains("<|im_end|>"),
        "{text}"
    );
    let decoded: usize = stderr
        .split("decode: ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    // It stopped at <|im_end|> before the 48-token budget.
    assert!(decoded < 47, "{stderr}");
    assert!(text.contains("Paris"), "{text}");
}

#[test]
fn okv_run_sampling_is_seeded() {
    // At temperature 0.5 a seed fixes the text; the markers stay unprinted.
    let (a, _) = chat(&["--temp", "0.5", "--seed", "3"]);
    let (b, _) = chat(&["--temp", "0.5", "--seed", "3"]);
    assert_eq!(a, b);
    assert!(
        !a.contains("<|im_start|>") && !a.contains("<|im_end|>"),
        "{a}"
    );
    let others: Vec<String> = (4..8)
        .map(|s| chat(&["--temp", "0.5", "--seed", &s.to_string()]).0)
        .collect();
    assert!(
        others.iter().any(|o| *o != a),
        "five seeds, one text: {a:?}"
    );
}

#[test]
fn okv_run_refuses_bad_arguments_with_exit_2() {
    let path = common::smollm2_gguf();
    let p = path.to_str().unwrap();
    for args in [
        vec![],
        vec![p],
        vec![p, "-p"],
        vec![p, "-p", "x", "-n", "many"],
        vec![p, "-p", "x", "--kv-dtype", "int3"],
        vec![p, "-p", "x", "--threads", "0"],
        vec![p, "-p", "x", "--bogus"],
        vec![p, p, "-p", "x"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_okv-run"))
            .args(&args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("usage: okv-run"), "{args:?}: {stderr}");
    }
}
