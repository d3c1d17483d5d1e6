//! Toy vocabularies through the families' tokenizer paths: the split
//! `tokenizer.ggml.pre` names decides where byte-level merges may reach, and a
//! non-Gemma SentencePiece vocabulary merges by score with a dummy prefix.

mod common;

use offgraph_kv_engine::gguf::{Metadata, Value};
use offgraph_kv_engine::tokenizer::Tokenizer;

fn strs<S: AsRef<str>>(v: &[S]) -> Value {
    Value::Array(v.iter().map(|s| Value::String(s.as_ref().into())).collect())
}

fn set(m: &mut Metadata, key: &str, v: Value) {
    m.entries.insert(key.to_string(), v);
}

/// Byte-level: the printable ASCII alphabet's bytes, with "12" and "123" merged.
fn digits_meta(pre: &str) -> Metadata {
    let mut tokens = common::byte_alphabet();
    tokens.extend(["12".to_string(), "123".to_string()]);
    let mut m = Metadata::default();
    set(&mut m, "tokenizer.ggml.model", Value::String("gpt2".into()));
    set(&mut m, "tokenizer.ggml.pre", Value::String(pre.into()));
    set(&mut m, "tokenizer.ggml.tokens", strs(&tokens));
    set(&mut m, "tokenizer.ggml.merges", strs(&["1 2", "12 3"]));
    m
}

#[test]
fn the_named_split_bounds_the_merges() {
    let ids = |pre: &str| {
        let tok = Tokenizer::from_metadata(&digits_meta(pre)).expect(pre);
        let id = |p: &str| tok.token_id(p).expect(p);
        let got = tok.encode("1234123", false);
        let pieces: Vec<u32> = ["123", "12", "1", "2", "3", "4"]
            .iter()
            .map(|p| id(p))
            .collect();
        (got, pieces)
    };
    let (gpt2, p) = ids("smollm");
    let [t123, t12, t1, t2, t3, t4] = p[..] else {
        unreachable!()
    };
    // One digit run for GPT-2; runs of at most three for Llama 3 and GPT-4o; single digits for Qwen.
    assert_eq!(gpt2, [t123, t4, t123]);
    assert_eq!(ids("some-other-name").0, gpt2);
    for pre in [
        "llama-bpe",
        "llama3",
        "llama-v3",
        "dbrx",
        "gpt-4o",
        "llama4",
    ] {
        assert_eq!(ids(pre).0, [t123, t4, t12, t3], "{pre}");
    }
    for pre in ["qwen2", "deepseek-r1-qwen", "qwen35", "tekken"] {
        assert_eq!(ids(pre).0, [t1, t2, t3, t4, t1, t2, t3], "{pre}");
    }
}

/// SentencePiece, Llama-style: control and byte tokens, then pieces whose
/// scores do not follow their positions.
fn llama_spm_meta(space_prefix: Option<bool>) -> Metadata {
    let mut tokens: Vec<String> = ["<unk>", "<s>", "</s>"].map(String::from).to_vec();
    tokens.extend((0..256).map(|b| format!("<0x{b:02X}>")));
    let pieces = [
        ("▁", -10.0),
        ("a", -11.0),
        ("b", -12.0),
        ("c", -13.0),
        ("ab", -2.0),
        ("bc", -1.0),
        ("▁a", -3.0),
    ];
    tokens.extend(pieces.iter().map(|(p, _)| p.to_string()));
    let mut scores = vec![Value::F32(0.0); 259];
    scores.extend(pieces.iter().map(|&(_, s)| Value::F32(s)));
    let mut types = vec![Value::I32(2), Value::I32(3), Value::I32(3)];
    types.extend((0..256).map(|_| Value::I32(6)));
    types.extend(pieces.iter().map(|_| Value::I32(1)));
    let mut m = Metadata::default();
    set(
        &mut m,
        "general.architecture",
        Value::String("llama".into()),
    );
    set(
        &mut m,
        "tokenizer.ggml.model",
        Value::String("llama".into()),
    );
    set(&mut m, "tokenizer.ggml.tokens", strs(&tokens));
    set(&mut m, "tokenizer.ggml.scores", Value::Array(scores));
    set(&mut m, "tokenizer.ggml.token_type", Value::Array(types));
    set(&mut m, "tokenizer.ggml.unknown_token_id", Value::U32(0));
    set(&mut m, "tokenizer.ggml.bos_token_id", Value::U32(1));
    set(&mut m, "tokenizer.ggml.eos_token_id", Value::U32(2));
    if let Some(p) = space_prefix {
        set(&mut m, "tokenizer.ggml.add_space_prefix", Value::Bool(p));
    }
    m
}

#[test]
fn llama_sentencepiece_merges_by_score_after_a_dummy_prefix() {
    let tok = Tokenizer::from_metadata(&llama_spm_meta(None)).expect("tokenizer");
    let id = |p: &str| tok.token_id(p).expect(p);
    // "bc" scores best though "ab" comes first in the file.
    assert_eq!(tok.encode("abc", false), [id("▁a"), id("bc")]);
    assert_eq!(tok.encode("abc", true), [1, id("▁a"), id("bc")]);
    // Each stretch between added tokens takes its own prefix; a leading space adds to it.
    assert_eq!(tok.encode("a<s>a", false), [id("▁a"), 1, id("▁a")]);
    assert_eq!(tok.encode(" a", false), [id("▁"), id("▁a")]);
    assert_eq!(tok.encode("é", false), [id("▁"), 3 + 0xC3, 3 + 0xA9]);
    // Decoding takes the prefix off again.
    assert_eq!(
        tok.decode(&[id("▁a"), id("bc")], false).expect("decode"),
        "abc"
    );
    assert_eq!(tok.decode(&[1, id("▁a")], false).expect("decode"), "<s> a");
    assert_eq!(tok.decode(&[1, id("▁a")], true).expect("decode"), "a");

    let bare = Tokenizer::from_metadata(&llama_spm_meta(Some(false))).expect("tokenizer");
    assert_eq!(bare.encode("abc", false), [id("a"), id("bc")]);
    assert_eq!(bare.decode(&[id("▁a")], false).expect("decode"), " a");
}
