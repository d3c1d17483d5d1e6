//! The family registry on crafted files: a tiny valid Llama and Gemma 3 open
//! and run; every metadata key or tensor that would change the math and that
//! the family does not implement is refused at open, naming it and its value;
//! Llama's RoPE scaling (linear factor, llama3 `rope_freqs.weight`) is read.
//! The two real models keep their chat defaults.

mod common;
mod gguf_writer;

use gguf_writer::{f32_bytes, ty, GgufBuilder, TensorSpec};
use offgraph_kv::KvDtype;
use offgraph_kv_engine::gguf::Value;
use offgraph_kv_engine::{EngineError, Model};

const E: u64 = 8;
const HEADS: u64 = 2;
const D: u64 = 4;
const FF: u64 = 16;

fn s(x: &str) -> Value {
    Value::String(x.to_owned())
}

fn strs(v: &[&str]) -> Value {
    Value::Array(v.iter().map(|x| s(x)).collect())
}

/// The byte-level alphabet plus "he" and an end token: a GPT-2 vocabulary.
fn vocab() -> Vec<String> {
    let mut tokens = common::byte_alphabet();
    tokens.push("he".into());
    tokens.push("<|im_end|>".into());
    tokens
}

/// Deterministic small values.
fn values(n: u64, seed: u64) -> Vec<u8> {
    let v: Vec<f32> = (0..n)
        .map(|i| (((i * 37 + seed * 11) % 23) as f32 - 11.0) * 0.05)
        .collect();
    f32_bytes(&v)
}

fn f32_tensor(name: &str, dims: &[u64], seed: u64) -> TensorSpec {
    TensorSpec::new(name, dims, ty::F32, values(dims.iter().product(), seed))
}

/// A one-layer model of family `arch` with F32 weights and a GPT-2 tokenizer.
fn tiny(arch: &str) -> GgufBuilder {
    let tokens = vocab();
    let n_vocab = tokens.len() as u64;
    let refs: Vec<&str> = tokens.iter().map(String::as_str).collect();
    let k = |x: &str| format!("{arch}.{x}");
    let mut b = GgufBuilder::default()
        .kv("general.architecture", s(arch))
        .kv(&k("block_count"), Value::U32(1))
        .kv(&k("embedding_length"), Value::U32(E as u32))
        .kv(&k("attention.head_count"), Value::U32(HEADS as u32))
        .kv(&k("attention.head_count_kv"), Value::U32(1))
        .kv(&k("feed_forward_length"), Value::U32(FF as u32))
        .kv(&k("context_length"), Value::U32(64))
        .kv(&k("attention.layer_norm_rms_epsilon"), Value::F32(1e-5))
        .kv("tokenizer.ggml.model", s("gpt2"))
        .kv("tokenizer.ggml.tokens", strs(&refs))
        .kv(
            "tokenizer.ggml.token_type",
            Value::Array(vec![Value::I32(1); tokens.len()]),
        )
        .kv("tokenizer.ggml.merges", strs(&["h e"]))
        .kv(
            "tokenizer.ggml.eos_token_id",
            Value::U32(n_vocab as u32 - 1),
        );
    let q = HEADS * D;
    let mut t = vec![
        f32_tensor("token_embd.weight", &[E, n_vocab], 1),
        f32_tensor("output_norm.weight", &[E], 2),
        f32_tensor("blk.0.attn_output.weight", &[q, E], 7),
        f32_tensor("blk.0.ffn_down.weight", &[FF, E], 11),
    ];
    // Each family's layout, as its converter writes it.
    if arch == "phi3" {
        t.push(f32_tensor("blk.0.attn_qkv.weight", &[E, q + 2 * D], 4));
        t.push(f32_tensor("blk.0.ffn_up.weight", &[E, 2 * FF], 9));
        b = b.kv(&k("rope.dimension_count"), Value::U32(D as u32 / 2));
    } else {
        t.push(f32_tensor("blk.0.attn_q.weight", &[E, q], 4));
        t.push(f32_tensor("blk.0.attn_k.weight", &[E, D], 5));
        t.push(f32_tensor("blk.0.attn_v.weight", &[E, D], 6));
        t.push(f32_tensor("blk.0.ffn_gate.weight", &[E, FF], 9));
        t.push(f32_tensor("blk.0.ffn_up.weight", &[E, FF], 10));
    }
    if arch != "olmo2" {
        t.push(f32_tensor("blk.0.attn_norm.weight", &[E], 3));
        t.push(f32_tensor("blk.0.ffn_norm.weight", &[E], 8));
    }
    if matches!(arch, "gemma3" | "gemma2" | "olmo2") {
        t.push(f32_tensor("blk.0.post_attention_norm.weight", &[E], 14));
        t.push(f32_tensor("blk.0.post_ffw_norm.weight", &[E], 15));
    }
    match arch {
        "gemma3" | "qwen3" => {
            t.push(f32_tensor("blk.0.attn_q_norm.weight", &[D], 12));
            t.push(f32_tensor("blk.0.attn_k_norm.weight", &[D], 13));
        }
        "olmo2" => {
            t.push(f32_tensor("blk.0.attn_q_norm.weight", &[q], 12));
            t.push(f32_tensor("blk.0.attn_k_norm.weight", &[D], 13));
        }
        "qwen2" => {
            t.push(f32_tensor("blk.0.attn_q.bias", &[q], 16));
            t.push(f32_tensor("blk.0.attn_k.bias", &[D], 17));
            t.push(f32_tensor("blk.0.attn_v.bias", &[D], 18));
        }
        _ => {}
    }
    match arch {
        "gemma3" => b = b.kv(&k("attention.sliding_window"), Value::U32(16)),
        "gemma2" => {
            b = b
                .kv(&k("attention.sliding_window"), Value::U32(2))
                .kv(&k("attn_logit_softcapping"), Value::F32(50.0))
                .kv(&k("final_logit_softcapping"), Value::F32(30.0))
        }
        "granite" => {
            b = b
                .kv(&k("embedding_scale"), Value::F32(12.0))
                .kv(&k("residual_scale"), Value::F32(0.22))
                .kv(&k("attention.scale"), Value::F32(0.0078125))
                .kv(&k("logit_scale"), Value::F32(8.0))
        }
        _ => {}
    }
    for x in t {
        b = b.tensor(x);
    }
    b
}

/// Every family the registry holds, by architecture name.
const FAMILIES: [&str; 8] = [
    "llama", "gemma3", "gemma2", "qwen2", "qwen3", "phi3", "granite", "olmo2",
];

fn open(tag: &str, b: &GgufBuilder) -> Result<Model, EngineError> {
    let dir = std::env::temp_dir().join(format!("okv-model-families-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{tag}.gguf"));
    std::fs::write(&path, b.build().bytes).unwrap();
    let r = Model::open(&path);
    let _ = std::fs::remove_file(&path);
    r
}

/// Logits of the last of three tokens at positions 0, 1, 2.
fn last_logits(m: &Model) -> Vec<f32> {
    let mut kc = m
        .new_cache(16, 1, 8, KvDtype::Float32, KvDtype::Float32)
        .unwrap();
    let seq = kc.cells_mut().seq_new().unwrap();
    m.forward(&mut kc, &[5, 77, 200], &[seq; 3], &[0, 1, 2], &[2])
        .unwrap()
}

#[test]
fn tiny_files_of_each_family_open_and_run() {
    for arch in FAMILIES {
        let m = open(arch, &tiny(arch)).unwrap_or_else(|e| panic!("{arch}: {e}"));
        assert_eq!(m.config().arch.name(), arch);
        let l = last_logits(&m);
        assert_eq!(l.len(), m.config().vocab);
        assert!(l.iter().all(|v| v.is_finite()), "{arch}: {l:?}");
    }
    let gemma = open("g", &tiny("gemma3")).unwrap();
    let d = gemma.chat_defaults();
    assert_eq!(d.turn_ends, ["<end_of_turn>"]);
    assert!(d.template.is_some_and(|t| t.contains("<start_of_turn>")));
    assert_eq!(gemma.chat_template(), d.template, "no template in the file");
    let llama = open("l", &tiny("llama")).unwrap();
    assert!(llama.chat_defaults().turn_ends.contains(&"<|im_end|>"));
    assert_eq!(llama.chat_template(), None);
}

/// A `(key, value)` or tensor added to a valid file.
enum Extra {
    Key(&'static str, Value),
    Tensor(&'static str, &'static [u64]),
}

#[test]
fn what_a_family_does_not_implement_is_refused_by_name() {
    use Extra::{Key, Tensor};
    let cases: Vec<(&str, Extra, &str)> = vec![
        (
            "llama",
            Key("llama.rope.scaling.yarn_ext_factor", Value::F32(0.5)),
            "0.5",
        ),
        (
            "llama",
            Key("llama.rope.scaling.type", s("longrope")),
            "\"longrope\"",
        ),
        (
            "llama",
            Key("llama.rope.scaling.attn_factor", Value::F32(0.5)),
            "0.5",
        ),
        (
            "llama",
            Key("llama.rope.scaling.yarn_log_multiplier", Value::F32(0.1)),
            "0.1",
        ),
        (
            "llama",
            Key("llama.rope.scaling.yarn_attn_factor", Value::F32(32.0)),
            "32",
        ),
        (
            "llama",
            Key("llama.attn_logit_softcapping", Value::F32(50.0)),
            "50",
        ),
        (
            "llama",
            Key("llama.final_logit_softcapping", Value::F32(30.0)),
            "30",
        ),
        ("llama", Key("llama.expert_count", Value::U32(8)), "8"),
        ("llama", Key("llama.expert_used_count", Value::U32(2)), "2"),
        (
            "llama",
            Key("llama.embedding_scale", Value::F32(12.0)),
            "12",
        ),
        (
            "llama",
            Key("llama.residual_scale", Value::F32(0.22)),
            "0.22",
        ),
        ("llama", Key("llama.logit_scale", Value::F32(8.0)), "8"),
        (
            "llama",
            Key("llama.attention.scale", Value::F32(0.0078125)),
            "0.0078125",
        ),
        (
            "llama",
            Key("llama.attention.sliding_window", Value::U32(4096)),
            "4096",
        ),
        (
            "gemma3",
            Key("gemma3.rope.scaling.type", s("yarn")),
            "\"yarn\"",
        ),
        (
            "gemma3",
            Key("gemma3.rope.scaling.attn_factor", Value::F32(0.5)),
            "0.5",
        ),
        (
            "gemma3",
            Key("gemma3.attn_logit_softcapping", Value::F32(50.0)),
            "50",
        ),
        (
            "gemma3",
            Key("gemma3.final_logit_softcapping", Value::F32(30.0)),
            "30",
        ),
        ("gemma3", Key("gemma3.expert_count", Value::U32(4)), "4"),
        (
            "gemma3",
            Key("gemma3.attention.sliding_window_pattern", Value::U32(4)),
            "4",
        ),
        ("llama", Tensor("blk.0.attn_q.bias", &[HEADS * D]), "[8]"),
        (
            "llama",
            Tensor("blk.0.ffn_gate_inp.weight", &[E, 4]),
            "[8, 4]",
        ),
        (
            "llama",
            Tensor("blk.0.ffn_gate_exps.weight", &[E, FF, 4]),
            "[8, 16, 4]",
        ),
        ("llama", Tensor("blk.0.attn_q_norm.weight", &[D]), "[4]"),
        ("llama", Tensor("blk.0.post_ffw_norm.weight", &[E]), "[8]"),
        ("llama", Tensor("blk.1.attn_norm.weight", &[E]), "[8]"),
        ("gemma3", Tensor("rope_freqs.weight", &[D / 2]), "[2]"),
        (
            "gemma3",
            Tensor("blk.0.ffn_down_exps.weight", &[FF, E, 4]),
            "[16, 8, 4]",
        ),
        ("gemma3", Tensor("blk.0.attn_output.bias", &[E]), "[8]"),
        (
            "qwen2",
            Key("qwen2.rope.scaling.type", s("longrope")),
            "\"longrope\"",
        ),
        (
            "qwen2",
            Key("qwen2.attention.sliding_window", Value::U32(4096)),
            "4096",
        ),
        ("qwen3", Tensor("blk.0.attn_q.bias", &[HEADS * D]), "[8]"),
        ("qwen3", Key("qwen3.expert_count", Value::U32(8)), "8"),
        ("phi3", Tensor("rope_factors_long.weight", &[D / 4]), "[1]"),
        (
            "phi3",
            Tensor("blk.0.attn_q.weight", &[E, HEADS * D]),
            "[8, 8]",
        ),
        ("gemma2", Tensor("blk.0.attn_q_norm.weight", &[D]), "[4]"),
        (
            "granite",
            Key("granite.attn_logit_softcapping", Value::F32(50.0)),
            "50",
        ),
        ("olmo2", Tensor("blk.0.attn_norm.weight", &[E]), "[8]"),
        (
            "olmo2",
            Key("olmo2.rope.scaling.type", s("yarn")),
            "\"yarn\"",
        ),
    ];
    for (i, (arch, extra, value)) in cases.into_iter().enumerate() {
        let (b, name) = match extra {
            Key(k, v) => (tiny(arch).kv(k, v), k),
            Tensor(t, dims) => (tiny(arch).tensor(f32_tensor(t, dims, 99)), t),
        };
        match open(&format!("case{i}"), &b) {
            Err(EngineError::Unsupported(m)) => {
                println!("{m}");
                assert!(m.contains(name), "{name}: {m}");
                assert!(m.contains(value), "{name}: value {value} not in {m}");
            }
            other => panic!("{arch} + {name}: expected Unsupported, got {other:?}"),
        }
    }
}

#[test]
fn malformed_family_values_are_refused() {
    let pattern = |n: usize| Value::Array(vec![Value::Bool(true); n]);
    let cases: Vec<(&str, &str, Value)> = vec![
        ("phi3", "phi3.rope.dimension_count", Value::U32(3)),
        (
            "phi3",
            "phi3.rope.dimension_count",
            Value::U32(D as u32 + 2),
        ),
        ("gemma2", "gemma2.attn_logit_softcapping", Value::F32(-1.0)),
        ("gemma2", "gemma2.attention.sliding_window", Value::U32(0)),
        ("granite", "granite.logit_scale", Value::F32(0.0)),
        ("granite", "granite.attention.scale", Value::F32(f32::NAN)),
        (
            "olmo2",
            "olmo2.attention.sliding_window_pattern",
            pattern(2),
        ),
        (
            "olmo2",
            "olmo2.attention.sliding_window_pattern",
            pattern(1),
        ),
        ("qwen3", "qwen3.rope.scaling.type", s("yarn")),
        ("llama", "llama.rope.scaling.factor", Value::F32(0.0)),
    ];
    for (arch, k, v) in cases {
        let shown = format!("{v:?}");
        let mut b = tiny(arch);
        b.kvs.retain(|(key, _)| key != k);
        match open("malformed", &b.kv(k, v)) {
            Err(EngineError::Model(m)) => assert!(m.contains(k), "{k}: {m}"),
            other => panic!("{arch} + {k} = {shown}: expected a Model error, got {other:?}"),
        }
    }
}

#[test]
fn neutral_values_of_math_keys_open() {
    let cases: Vec<(&str, Value)> = vec![
        ("llama.expert_count", Value::U32(0)),
        ("llama.embedding_scale", Value::F32(1.0)),
        ("llama.rope.scaling.type", s("none")),
        (
            "llama.rope.scaling.original_context_length",
            Value::U32(8192),
        ),
    ];
    for (k, v) in cases {
        if let Err(e) = open("neutral", &tiny("llama").kv(k, v)) {
            panic!("{k}: {e}");
        }
    }
    let none_with_factor = tiny("llama")
        .kv("llama.rope.scaling.type", s("none"))
        .kv("llama.rope.scaling.factor", Value::F32(4.0));
    match open("none-factor", &none_with_factor) {
        Err(EngineError::Unsupported(m)) => assert!(m.contains("rope.scaling.factor"), "{m}"),
        other => panic!("expected Unsupported, got {other:?}"),
    }
    let bad_factor = tiny("llama").kv("llama.rope.scaling.factor", Value::F32(0.0));
    assert!(matches!(
        open("f0", &bad_factor),
        Err(EngineError::Model(_))
    ));
    let bad_divisor = tiny("llama").tensor(TensorSpec::new(
        "rope_freqs.weight",
        &[D / 2],
        ty::F32,
        f32_bytes(&[1.0, -2.0]),
    ));
    match open("div", &bad_divisor) {
        Err(EngineError::Model(m)) => assert!(m.contains("rope_freqs.weight"), "{m}"),
        other => panic!("expected Model, got {other:?}"),
    }
}

#[test]
fn llama_rope_scaling_is_read() {
    let base = last_logits(&open("plain", &tiny("llama")).unwrap());
    let with = |tag: &str, b: GgufBuilder| last_logits(&open(tag, &b).unwrap());
    let divisors =
        |d: &[f32]| TensorSpec::new("rope_freqs.weight", &[D / 2], ty::F32, f32_bytes(d));
    // Neutral scaling is the same model, bit for bit.
    let ones = with("ones", tiny("llama").tensor(divisors(&[1.0, 1.0])));
    assert_eq!(ones, base);
    let unit = with(
        "unit",
        tiny("llama")
            .kv("llama.rope.scaling.type", s("linear"))
            .kv("llama.rope.scaling.factor", Value::F32(1.0)),
    );
    assert_eq!(unit, base);
    // Real scaling changes the logits of a token that attends at a distance.
    let linear = with(
        "linear",
        tiny("llama")
            .kv("llama.rope.scaling.type", s("linear"))
            .kv("llama.rope.scaling.factor", Value::F32(4.0)),
    );
    let llama3 = with("llama3", tiny("llama").tensor(divisors(&[1.0, 8.0])));
    for (name, l) in [("linear", &linear), ("llama3", &llama3)] {
        let diff = l
            .iter()
            .zip(&base)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(diff > 1e-6, "{name}: logits unchanged");
    }
    // A factor alone is linear scaling (as llama.cpp reads it).
    let bare = with(
        "bare",
        tiny("llama").kv("llama.rope.scaling.factor", Value::F32(4.0)),
    );
    assert_eq!(bare, linear);
    // YaRN (Qwen 2.5 / 3 long context): read with its defaults, and it turns the logits.
    let yarn = |f: f32| {
        tiny("llama")
            .kv("llama.rope.scaling.type", s("yarn"))
            .kv("llama.rope.scaling.factor", Value::F32(f))
            .kv("llama.rope.scaling.original_context_length", Value::U32(64))
    };
    let m = open("yarn", &yarn(4.0)).unwrap();
    let y = m.config().rope_yarn.unwrap();
    assert_eq!((y.factor, y.original_context), (4.0, 64));
    assert_eq!((y.beta_fast, y.beta_slow), (32.0, 1.0));
    assert_ne!(last_logits(&m), base);
    assert_eq!(
        with("yarn1", yarn(1.0)),
        base,
        "factor 1 is the plain model"
    );
}

#[test]
fn gemma3_scales_its_full_layers_linearly() {
    // Gemma 3 4B and larger: `linear` with factor 8 on the full-attention layers.
    let scaled = tiny("gemma3")
        .kv("gemma3.rope.scaling.type", s("linear"))
        .kv("gemma3.rope.scaling.factor", Value::F32(8.0));
    let m = open("gemma3-linear", &scaled).unwrap();
    assert_eq!(m.config().rope_linear, 8.0);
    // The tiny file's one layer slides, and sliding layers are never scaled.
    let plain = open("gemma3-plain", &tiny("gemma3")).unwrap();
    assert_eq!(last_logits(&m), last_logits(&plain));
}

#[test]
fn the_real_models_keep_their_chat_defaults() {
    let gemma = Model::open(common::gemma3_gguf()).unwrap();
    assert_eq!(gemma.chat_defaults().turn_ends, ["<end_of_turn>"]);
    assert!(gemma.tokenizer().chat_template().is_none());
    assert!(gemma
        .chat_template()
        .is_some_and(|t| t.contains("<start_of_turn>")));
    let smol = Model::open(common::smollm2_gguf()).unwrap();
    assert!(smol.chat_defaults().turn_ends.contains(&"<|im_end|>"));
    assert_eq!(smol.chat_template(), smol.tokenizer().chat_template());
    assert!(smol
        .chat_template()
        .is_some_and(|t| t.contains("<|im_start|>")));
}

#[test]
fn gemma2_caps_attention_scores_and_logits() {
    let with = |attn: f32, fin: f32| {
        let mut b = tiny("gemma2");
        b.kvs.retain(|(k, _)| !k.ends_with("_logit_softcapping"));
        let b = b
            .kv("gemma2.attn_logit_softcapping", Value::F32(attn))
            .kv("gemma2.final_logit_softcapping", Value::F32(fin));
        last_logits(&open("gemma2-caps", &b).unwrap())
    };
    let wide = with(1e6, 1e6);
    let attn = with(0.01, 1e6);
    let fin = with(1e6, 0.5);
    let diff = |a: &[f32], b: &[f32]| {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max)
    };
    assert!(
        diff(&wide, &attn) > 1e-4,
        "the attention cap changes nothing"
    );
    assert!(
        fin.iter().all(|v| v.abs() <= 0.5),
        "logits beyond the final cap"
    );
    assert!(diff(&wide, &fin) > 1e-4);
}

#[test]
fn phi3_reads_longrope_where_the_file_has_its_factors() {
    let factors = |name: &str, v: &[f32]| TensorSpec::new(name, &[D / 4], ty::F32, f32_bytes(v));
    let ctx = |b: GgufBuilder| b.kv("phi3.rope.scaling.original_context_length", Value::U32(16));
    let plain = last_logits(&open("phi3-plain", &ctx(tiny("phi3"))).unwrap());
    let m = open(
        "phi3-longrope",
        &ctx(tiny("phi3"))
            .kv("phi3.rope.scaling.attn_factor", Value::F32(1.19))
            .tensor(factors("rope_factors_short.weight", &[3.0]))
            .tensor(factors("rope_factors_long.weight", &[9.0])),
    )
    .unwrap();
    let lr = m.config().longrope.unwrap();
    assert_eq!((lr.original_context, lr.attn_factor), (16, 1.19));
    assert_ne!(last_logits(&m), plain);
    // One factor tensor alone is a broken file.
    let one = ctx(tiny("phi3")).tensor(factors("rope_factors_long.weight", &[9.0]));
    match open("phi3-one", &one) {
        Err(EngineError::Model(msg)) => assert!(msg.contains("rope_factors_short"), "{msg}"),
        other => panic!("expected a Model error, got {other:?}"),
    }
}
