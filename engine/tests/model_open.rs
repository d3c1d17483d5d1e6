//! Model::open refusals on crafted files: an unsupported architecture, a
//! missing key, a missing tensor, a tensor of the wrong shape. Each is a
//! typed error naming the offending value.

use offgraph_kv_engine::{EngineError, Model};

enum V<'a> {
    Str(&'a str),
    U32(u32),
    F32(f32),
}

/// A GGUF v3 file: metadata, then F32 tensors `(name, dims)` (zeros).
fn gguf(kv: &[(&str, V<'_>)], tensors: &[(&str, &[u64])]) -> Vec<u8> {
    let mut b = Vec::new();
    let s = |b: &mut Vec<u8>, t: &str| {
        b.extend((t.len() as u64).to_le_bytes());
        b.extend(t.as_bytes());
    };
    b.extend(b"GGUF");
    b.extend(3u32.to_le_bytes());
    b.extend((tensors.len() as u64).to_le_bytes());
    b.extend((kv.len() as u64).to_le_bytes());
    for (k, v) in kv {
        s(&mut b, k);
        match v {
            V::Str(x) => {
                b.extend(8u32.to_le_bytes());
                s(&mut b, x);
            }
            V::U32(x) => {
                b.extend(4u32.to_le_bytes());
                b.extend(x.to_le_bytes());
            }
            V::F32(x) => {
                b.extend(6u32.to_le_bytes());
                b.extend(x.to_le_bytes());
            }
        }
    }
    let mut offset = 0u64;
    let mut sizes = Vec::new();
    for (name, dims) in tensors {
        s(&mut b, name);
        b.extend((dims.len() as u32).to_le_bytes());
        for d in *dims {
            b.extend(d.to_le_bytes());
        }
        b.extend(0u32.to_le_bytes()); // F32
        b.extend(offset.to_le_bytes());
        let n: u64 = dims.iter().product::<u64>() * 4;
        sizes.push(n);
        offset += n.div_ceil(32) * 32;
    }
    while b.len() % 32 != 0 {
        b.push(0);
    }
    for n in sizes {
        b.extend(std::iter::repeat_n(0u8, (n.div_ceil(32) * 32) as usize));
    }
    b
}

fn open(name: &str, bytes: &[u8]) -> Result<Model, EngineError> {
    let dir = std::env::temp_dir().join(format!("okv-model-open-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    let r = Model::open(&path);
    let _ = std::fs::remove_file(&path);
    r
}

fn llama_keys() -> Vec<(&'static str, V<'static>)> {
    vec![
        ("general.architecture", V::Str("llama")),
        ("llama.block_count", V::U32(1)),
        ("llama.embedding_length", V::U32(64)),
        ("llama.attention.head_count", V::U32(2)),
        ("llama.attention.head_count_kv", V::U32(1)),
        ("llama.feed_forward_length", V::U32(128)),
        ("llama.context_length", V::U32(256)),
        ("llama.attention.layer_norm_rms_epsilon", V::F32(1e-5)),
    ]
}

#[test]
fn open_refuses_what_it_cannot_run() {
    let r = open(
        "mamba.gguf",
        &gguf(&[("general.architecture", V::Str("mamba"))], &[]),
    );
    match r {
        Err(EngineError::Unsupported(m)) => {
            println!("{m}");
            assert!(m.contains("mamba"));
        }
        other => panic!("expected Unsupported, got {other:?}"),
    }

    let mut keys = llama_keys();
    keys.retain(|(k, _)| *k != "llama.feed_forward_length");
    let embd: &[(&str, &[u64])] = &[("token_embd.weight", &[64, 32])];
    match open("nokey.gguf", &gguf(&keys, embd)) {
        Err(EngineError::Model(m)) => {
            println!("{m}");
            assert!(m.contains("llama.feed_forward_length"));
        }
        other => panic!("expected Model, got {other:?}"),
    }

    match open("notensor.gguf", &gguf(&llama_keys(), embd)) {
        Err(EngineError::Model(m)) => {
            println!("{m}");
            assert!(m.contains("blk.0.attn_norm.weight"));
        }
        other => panic!("expected Model, got {other:?}"),
    }

    let shapes: &[(&str, &[u64])] = &[
        ("token_embd.weight", &[64, 32]),
        ("blk.0.attn_norm.weight", &[64]),
        ("blk.0.attn_q.weight", &[64, 32]),
    ];
    match open("shape.gguf", &gguf(&llama_keys(), shapes)) {
        Err(EngineError::Model(m)) => {
            println!("{m}");
            assert!(m.contains("blk.0.attn_q.weight") && m.contains("[64, 64]"));
        }
        other => panic!("expected Model, got {other:?}"),
    }

    let flat_embd: &[(&str, &[u64])] = &[("token_embd.weight", &[64])];
    match open("embd.gguf", &gguf(&llama_keys(), flat_embd)) {
        Err(EngineError::Model(m)) => println!("{m}"),
        other => panic!("expected Model, got {other:?}"),
    }
}
