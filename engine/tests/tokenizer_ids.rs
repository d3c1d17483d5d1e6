//! The tokenizer built from each real GGUF's metadata against the reference
//! tokenizer's output on the same file (engine/tests/fixtures/tokenizer/*.json,
//! written by engine/tests/fixtures/make_tokenizer_fixture.py): every text's
//! ids with and without special tokens, both decodings, extra id sequences,
//! and digests over the decoding and re-encoding of every single id.

mod common;

use offgraph_kv_engine::gguf::GgufFile;
use offgraph_kv_engine::tokenizer::Tokenizer;
use serde_json::Value as Json;
use std::path::{Path, PathBuf};
use std::time::Instant;

fn fixture(name: &str) -> Json {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tokenizer")
        .join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn tokenizer(path: &Path) -> Tokenizer {
    let file = GgufFile::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Tokenizer::from_metadata(file.metadata()).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn ids(v: &Json) -> Vec<u32> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an id list: {v}"))
        .iter()
        .map(|x| {
            x.as_u64()
                .and_then(|x| u32::try_from(x).ok())
                .unwrap_or_else(|| panic!("bad id {x}"))
        })
        .collect()
}

fn fnv(h: &mut u64, bytes: &[u8]) {
    for &b in bytes {
        *h = (*h ^ u64::from(b)).wrapping_mul(0x100000001B3);
    }
}

const FNV_START: u64 = 0xCBF29CE484222325;

/// Where two id lists first differ, for the failure report.
fn first_diff(a: &[u32], b: &[u32]) -> String {
    let i = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let show = |v: &[u32]| format!("{:?}", &v[i.min(v.len())..(i + 6).min(v.len())]);
    format!(
        "at {i} of {}/{}: got {} want {}",
        a.len(),
        b.len(),
        show(a),
        show(b)
    )
}

fn check_model(name: &str, gguf: PathBuf) {
    let fx = fixture(name);
    let t0 = Instant::now();
    let tok = tokenizer(&gguf);
    println!(
        "{name}: file opened and tokenizer built in {:.0} ms",
        t0.elapsed().as_secs_f64() * 1e3
    );
    let cases = fx["cases"].as_array().expect("cases");
    let mut fails: Vec<String> = Vec::new();
    let (mut checks, mut ok) = (0usize, 0usize);
    let mut tally = |good: bool, what: String, fails: &mut Vec<String>| {
        checks += 1;
        if good {
            ok += 1;
        } else {
            fails.push(what);
        }
    };
    for c in cases {
        let label = c["name"].as_str().unwrap_or("?");
        let text = c["text"].as_str().expect("text");
        for (key, special) in [("ids", false), ("ids_special", true)] {
            let want = ids(&c[key]);
            let got = tok.encode(text, special);
            let what = format!(
                "{label} encode(special={special}) {}",
                first_diff(&got, &want)
            );
            tally(got == want, what, &mut fails);
        }
        let with_special = ids(&c["ids_special"]);
        for (key, skip) in [("decoded", false), ("decoded_skip", true)] {
            let want = c[key].as_str().unwrap_or(text);
            let got = tok.decode(&with_special, skip).expect("decode");
            let what = format!("{label} decode(skip={skip}): got {got:?} want {want:?}");
            tally(got == want, what, &mut fails);
        }
    }
    for (i, c) in fx["decode_cases"]
        .as_array()
        .expect("decode_cases")
        .iter()
        .enumerate()
    {
        let seq = ids(&c["ids"]);
        for (key, skip) in [("decoded", false), ("decoded_skip", true)] {
            let want = c[key].as_str().expect("decoded");
            let got = tok.decode(&seq, skip).expect("decode");
            let what = format!("decode case {i} {seq:?} (skip={skip}): got {got:?} want {want:?}");
            tally(got == want, what, &mut fails);
        }
    }
    let vocab = &fx["vocab"];
    assert_eq!(
        Some(tok.vocab_size() as u64),
        vocab["size"].as_u64(),
        "{name} vocab size"
    );
    let (mut plain, mut skip, mut again) = (FNV_START, FNV_START, FNV_START);
    for id in 0..tok.vocab_size() as u32 {
        let one = tok.decode(&[id], false).expect("decode");
        fnv(&mut plain, one.as_bytes());
        fnv(&mut plain, &[0xFF]);
        fnv(
            &mut skip,
            tok.decode(&[id], true).expect("decode").as_bytes(),
        );
        fnv(&mut skip, &[0xFF]);
        for t in tok.encode(&one, false) {
            fnv(&mut again, &t.to_le_bytes());
        }
        fnv(&mut again, &[0xFF]);
    }
    for (key, h) in [
        ("decode", plain),
        ("decode_skip", skip),
        ("reencode", again),
    ] {
        let what = format!("vocab digest {key}: got {h:016x} want {}", vocab[key]);
        tally(
            vocab[key].as_str() == Some(format!("{h:016x}").as_str()),
            what,
            &mut fails,
        );
    }
    println!(
        "{name}: {ok}/{checks} checks agree ({} texts x 4, {} decode cases x 2, 3 vocabulary digests over {} ids)",
        cases.len(),
        fx["decode_cases"].as_array().map_or(0, Vec::len),
        tok.vocab_size()
    );
    for f in fails.iter().take(20) {
        println!("  MISMATCH {f}");
    }
    assert!(
        fails.is_empty(),
        "{name}: {} of {checks} checks differ",
        fails.len()
    );

    // The whole GPL-3 text is one case; its encode must be fast in release.
    let gpl = cases
        .iter()
        .find(|c| c["name"] == "gpl3")
        .expect("gpl3 case");
    let text = gpl["text"].as_str().expect("text");
    let t0 = Instant::now();
    let n = tok.encode(text, true).len();
    let took = t0.elapsed();
    println!(
        "{name}: GPL-3 ({} bytes) -> {n} ids in {:.1} ms",
        text.len(),
        took.as_secs_f64() * 1e3
    );
    if !cfg!(debug_assertions) {
        assert!(
            took.as_secs_f64() < 1.0,
            "{name}: GPL-3 encode took {took:?}"
        );
    }
}

#[test]
fn smollm2_matches_reference() {
    check_model("smollm2", common::smollm2_gguf());
}

#[test]
fn gemma3_matches_reference() {
    check_model("gemma3", common::gemma3_gguf());
}

#[test]
fn smollm2_accessors() {
    let tok = tokenizer(&common::smollm2_gguf());
    assert_eq!(tok.model_kind(), "gpt2");
    assert_eq!(tok.vocab_size(), 49152);
    assert_eq!(
        (tok.bos(), tok.eos(), tok.add_bos()),
        (Some(1), Some(2), false)
    );
    assert_eq!(tok.token_id("<|im_end|>"), Some(2));
    assert_eq!(tok.token_id("<|im_start|>"), Some(1));
    assert!(tok.is_special(0) && tok.is_special(16) && !tok.is_special(17));
    assert!(tok
        .chat_template()
        .is_some_and(|t| t.contains("<|im_start|>")));
    // A byte-level token's bytes: " the" is spelled "Ġthe" in the vocabulary.
    let the = tok.token_id("Ġthe").expect("Ġthe");
    assert_eq!(tok.token_bytes(the).expect("bytes"), b" the");
    // Streaming: the bytes of the ids of a multi-byte text join back to it.
    let text = "snow ☃ and 😀 family 👨\u{200d}👩";
    let joined: Vec<u8> = tok
        .encode(text, false)
        .iter()
        .flat_map(|&id| tok.token_bytes(id).expect("bytes"))
        .collect();
    assert_eq!(joined, text.as_bytes());
}

#[test]
fn gemma3_accessors() {
    let tok = tokenizer(&common::gemma3_gguf());
    assert_eq!(tok.model_kind(), "llama");
    assert_eq!(tok.vocab_size(), 262144);
    assert_eq!(
        (tok.bos(), tok.eos(), tok.add_bos()),
        (Some(2), Some(1), true)
    );
    assert_eq!(tok.chat_template(), None);
    let (start, end) = (
        tok.token_id("<start_of_turn>"),
        tok.token_id("<end_of_turn>"),
    );
    assert_eq!((start, end), (Some(105), Some(106)));
    assert!(tok.is_special(105) && tok.is_special(106) && tok.is_special(2));
    // User-defined tokens are matched whole but are not special.
    assert_eq!(tok.token_id("\n\n"), Some(108));
    assert!(!tok.is_special(108));
    // The space runs are stored with real spaces and looked up either way.
    assert_eq!(tok.token_id("   "), Some(139));
    assert_eq!(tok.token_bytes(139).expect("bytes"), b"   ");
    assert_eq!(tok.token_bytes(238 + 0xE2).expect("bytes"), [0xE2]);
    let text = "snow ☃ and \u{1d54f} 𐍈";
    let joined: Vec<u8> = tok
        .encode(text, false)
        .iter()
        .flat_map(|&id| tok.token_bytes(id).expect("bytes"))
        .collect();
    assert_eq!(joined, text.as_bytes());
    let err = tok.decode(&[5, 262144], false).expect_err("out of range");
    assert_eq!(err.kind(), "InvalidArgument");
    assert!(err.to_string().contains("262144"), "{err}");
    assert_eq!(
        tok.token_bytes(u32::MAX).map_err(|e| e.kind()),
        Err("InvalidArgument")
    );
}
