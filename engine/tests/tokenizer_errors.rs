//! Tokenizers built from small hand-made metadata: the merge rules on a toy
//! vocabulary, and bad metadata refused with typed errors naming the key.

use offgraph_kv_engine::gguf::{Metadata, Value};
use offgraph_kv_engine::tokenizer::Tokenizer;

fn strs(v: &[&str]) -> Value {
    Value::Array(v.iter().map(|s| Value::String(s.to_string())).collect())
}

fn set(m: &mut Metadata, key: &str, v: Value) {
    m.entries.insert(key.to_string(), v);
}

/// A byte-level vocabulary: the 256 alphabet characters, "he", "ll", "hell",
/// " w", and a control token.
fn gpt2_meta() -> Metadata {
    let mut tokens: Vec<String> = Vec::new();
    let mut next = 256u32;
    for b in 0u32..256 {
        let printable = matches!(b, 33..=126 | 161..=172 | 174..=255);
        let c = if printable {
            b
        } else {
            next += 1;
            next - 1
        };
        tokens.push(char::from_u32(c).map(String::from).unwrap_or_default());
    }
    for t in ["he", "ll", "hell", "Ġw", "<|end|>"] {
        tokens.push(t.to_string());
    }
    let mut types = vec![Value::I32(1); tokens.len()];
    if let Some(last) = types.last_mut() {
        *last = Value::I32(3);
    }
    let mut m = Metadata::default();
    set(
        &mut m,
        "general.architecture",
        Value::String("llama".into()),
    );
    set(&mut m, "tokenizer.ggml.model", Value::String("gpt2".into()));
    set(&mut m, "tokenizer.ggml.pre", Value::String("smollm".into()));
    let refs: Vec<&str> = tokens.iter().map(String::as_str).collect();
    set(&mut m, "tokenizer.ggml.tokens", strs(&refs));
    set(&mut m, "tokenizer.ggml.token_type", Value::Array(types));
    set(
        &mut m,
        "tokenizer.ggml.merges",
        strs(&["l l", "h e", "he ll", "Ġ w"]),
    );
    set(
        &mut m,
        "tokenizer.ggml.eos_token_id",
        Value::U32(tokens.len() as u32 - 1),
    );
    m
}

/// A Gemma-style vocabulary: specials, byte tokens, then pieces in merge order.
fn spm_meta() -> Metadata {
    let mut tokens: Vec<String> = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    tokens.extend((0..256).map(|b| format!("<0x{b:02X}>")));
    for t in ["▁", "a", "b", "c", "bc", "ab", "▁a", "  "] {
        tokens.push(t.to_string());
    }
    let n = tokens.len();
    let mut types = vec![Value::I32(1); n];
    for (i, t) in types.iter_mut().enumerate() {
        if i < 5 {
            *t = Value::I32(3);
        } else if i < 261 {
            *t = Value::I32(6);
        }
    }
    let mut m = Metadata::default();
    set(
        &mut m,
        "general.architecture",
        Value::String("gemma3".into()),
    );
    set(
        &mut m,
        "tokenizer.ggml.model",
        Value::String("llama".into()),
    );
    let refs: Vec<&str> = tokens.iter().map(String::as_str).collect();
    set(&mut m, "tokenizer.ggml.tokens", strs(&refs));
    set(
        &mut m,
        "tokenizer.ggml.scores",
        Value::Array(vec![Value::F32(0.0); n]),
    );
    set(&mut m, "tokenizer.ggml.token_type", Value::Array(types));
    set(&mut m, "tokenizer.ggml.bos_token_id", Value::U32(2));
    set(&mut m, "tokenizer.ggml.eos_token_id", Value::U32(1));
    set(&mut m, "tokenizer.ggml.unknown_token_id", Value::U32(3));
    m
}

fn refused(m: &Metadata) -> (String, String) {
    match Tokenizer::from_metadata(m) {
        Ok(_) => ("Ok".into(), String::new()),
        Err(e) => (e.kind().to_string(), e.to_string()),
    }
}

#[test]
fn byte_level_toy_vocabulary() {
    let tok = Tokenizer::from_metadata(&gpt2_meta()).expect("tokenizer");
    let id = |p: &str| tok.token_id(p).expect(p);
    assert_eq!(
        tok.encode("hello world", false),
        [
            id("hell"),
            id("o"),
            id("Ġw"),
            id("o"),
            id("r"),
            id("l"),
            id("d")
        ]
    );
    assert_eq!(
        tok.encode("hi<|end|>he", true),
        [id("h"), id("i"), id("<|end|>"), id("he")]
    );
    assert!(tok.is_special(id("<|end|>")) && !tok.is_special(id("he")));
    assert_eq!(
        tok.decode(&tok.encode("héllo ☃", false), false)
            .expect("decode"),
        "héllo ☃"
    );
    assert_eq!(
        tok.decode(&[id("he"), id("<|end|>")], true)
            .expect("decode"),
        "he"
    );
    assert_eq!(
        (tok.add_bos(), tok.model_kind(), tok.chat_template()),
        (false, "gpt2", None)
    );
    assert!(tok.encode("", true).is_empty());
}

#[test]
fn sentencepiece_toy_vocabulary() {
    let tok = Tokenizer::from_metadata(&spm_meta()).expect("tokenizer");
    let id = |p: &str| tok.token_id(p).expect(p);
    // "bc" sits before "ab" in the file, so it merges first.
    assert_eq!(tok.encode("abc", false), [id("a"), id("bc")]);
    assert_eq!(tok.encode("ab", true), [2, id("ab")]);
    assert_eq!(tok.encode(" a  c", false), [id("▁a"), id("  "), id("c")]);
    // Characters outside the vocabulary fall back to their UTF-8 bytes.
    assert_eq!(tok.encode("é", false), [5 + 0xC3, 5 + 0xA9]);
    assert_eq!(
        tok.decode(&[2, 5 + 0xC3, 5 + 0xA9, id("▁a")], true)
            .expect("decode"),
        "é a"
    );
    assert_eq!(
        tok.decode(&[5 + 0xC3, id("a")], false).expect("decode"),
        "\u{fffd}a"
    );
    assert_eq!(tok.encode("<start_of_turn>a", false), [4, id("a")]);
    assert_eq!(
        tok.decode(&[2, 4, id("a")], false).expect("decode"),
        "<bos><start_of_turn>a"
    );
    assert_eq!(tok.token_bytes(id("▁a")).expect("bytes"), b" a");
    assert_eq!(
        tok.decode(&[tok.vocab_size() as u32], false)
            .map_err(|e| e.kind()),
        Err("InvalidArgument")
    );
}

#[test]
fn bad_metadata_is_refused_with_the_key() {
    let cases: Vec<(&str, Metadata, &str, &str)> = vec![
        (
            "missing tokens",
            {
                let mut m = spm_meta();
                m.entries.remove("tokenizer.ggml.tokens");
                m
            },
            "Model",
            "tokenizer.ggml.tokens",
        ),
        (
            "tokens not strings",
            {
                let mut m = spm_meta();
                set(
                    &mut m,
                    "tokenizer.ggml.tokens",
                    Value::Array(vec![Value::U32(1)]),
                );
                m
            },
            "Model",
            "tokenizer.ggml.tokens",
        ),
        (
            "empty tokens",
            {
                let mut m = gpt2_meta();
                set(&mut m, "tokenizer.ggml.tokens", Value::Array(vec![]));
                m
            },
            "Model",
            "tokenizer.ggml.tokens",
        ),
        (
            "scores too short",
            {
                let mut m = spm_meta();
                set(
                    &mut m,
                    "tokenizer.ggml.scores",
                    Value::Array(vec![Value::F32(0.0); 3]),
                );
                m
            },
            "Model",
            "tokenizer.ggml.scores",
        ),
        (
            "scores mistyped",
            {
                let mut m = spm_meta();
                set(&mut m, "tokenizer.ggml.scores", Value::String("x".into()));
                m
            },
            "Model",
            "tokenizer.ggml.scores",
        ),
        (
            "token types too long",
            {
                let mut m = gpt2_meta();
                set(
                    &mut m,
                    "tokenizer.ggml.token_type",
                    Value::Array(vec![Value::I32(1); 999]),
                );
                m
            },
            "Model",
            "tokenizer.ggml.token_type",
        ),
        (
            "bos out of range",
            {
                let mut m = spm_meta();
                set(&mut m, "tokenizer.ggml.bos_token_id", Value::U32(100_000));
                m
            },
            "Model",
            "bos_token_id",
        ),
        (
            "missing model",
            {
                let mut m = spm_meta();
                m.entries.remove("tokenizer.ggml.model");
                m
            },
            "Model",
            "tokenizer.ggml.model",
        ),
        (
            "unknown model",
            {
                let mut m = spm_meta();
                set(&mut m, "tokenizer.ggml.model", Value::String("bert".into()));
                m
            },
            "Unsupported",
            "bert",
        ),
        (
            "sentencepiece outside gemma without scores",
            {
                let mut m = spm_meta();
                set(
                    &mut m,
                    "general.architecture",
                    Value::String("llama".into()),
                );
                m.entries.remove("tokenizer.ggml.scores");
                m
            },
            "Model",
            "tokenizer.ggml.scores",
        ),
        (
            "add_space_prefix mistyped",
            {
                let mut m = spm_meta();
                set(
                    &mut m,
                    "tokenizer.ggml.add_space_prefix",
                    Value::String("yes".into()),
                );
                m
            },
            "Model",
            "add_space_prefix",
        ),
        (
            "missing merges",
            {
                let mut m = gpt2_meta();
                m.entries.remove("tokenizer.ggml.merges");
                m
            },
            "Model",
            "tokenizer.ggml.merges",
        ),
        (
            "merge of an unknown piece",
            {
                let mut m = gpt2_meta();
                set(&mut m, "tokenizer.ggml.merges", strs(&["h zz"]));
                m
            },
            "Model",
            "zz",
        ),
        (
            "merge without its result",
            {
                let mut m = gpt2_meta();
                set(&mut m, "tokenizer.ggml.merges", strs(&["x y"]));
                m
            },
            "Model",
            "xy",
        ),
        (
            "malformed merge",
            {
                let mut m = gpt2_meta();
                set(&mut m, "tokenizer.ggml.merges", strs(&["he"]));
                m
            },
            "Model",
            "merges[0]",
        ),
        (
            "add_bos mistyped",
            {
                let mut m = spm_meta();
                set(&mut m, "tokenizer.ggml.add_bos_token", Value::U32(1));
                m
            },
            "Model",
            "add_bos_token",
        ),
    ];
    let n = cases.len();
    for (what, meta, kind, names) in cases {
        let before = meta.clone();
        let (got, msg) = refused(&meta);
        assert_eq!(got, kind, "{what}: {msg}");
        assert!(
            msg.contains(names),
            "{what}: {msg:?} does not name {names:?}"
        );
        assert_eq!(meta, before, "{what}: the metadata changed");
    }
    println!("{n} bad-metadata cases refused with their typed errors");
}

#[test]
fn tokenizer_is_send_and_sync() {
    fn shared<T: Send + Sync>() {}
    shared::<Tokenizer>();
}
