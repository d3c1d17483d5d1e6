//! The `gguf_header` fuzz target's check on stable: every committed corpus
//! input (`fuzz/corpus/gguf_header/`) and a few thousand seeded mutations of
//! a small valid file (bit flips, interesting values, cuts, splices) run
//! through the same checker (`tests/gguf_fuzz/mod.rs`), so CI covers the
//! parser's no-panic promise without nightly.

mod common;
mod gguf_fuzz;
mod gguf_writer;

use common::Rng;
use gguf_writer::{small_valid, GgufBuilder, TensorSpec};
use offgraph_kv_engine::gguf::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;

fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/gguf_header")
}

/// The seed inputs: the small valid file, a version 2 file with alignment
/// 64, and a file without tensors.
fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let mut v2 = small_valid().kv("general.alignment", Value::U32(64));
    v2.version = 2;
    let bare = GgufBuilder::default()
        .kv("general.architecture", Value::String("llama".into()))
        .kv("llama.block_count", Value::U32(1));
    let one = GgufBuilder::default().tensor(TensorSpec::new(
        "t",
        &[2],
        0,
        vec![0, 0, 128, 63, 0, 0, 0, 64],
    ));
    vec![
        ("seed_small_valid", small_valid().build().bytes),
        ("seed_v2_align64", v2.build().bytes),
        ("seed_no_tensors", bare.build().bytes),
        ("seed_one_tensor", one.build().bytes),
    ]
}

#[test]
fn seeds_are_valid_and_committed() {
    let dir = corpus_dir();
    // OKV_WRITE_GGUF_SEEDS=1 (re)writes the seed files from the writer.
    if std::env::var_os("OKV_WRITE_GGUF_SEEDS").is_some() {
        std::fs::create_dir_all(&dir).expect("corpus dir");
        for (name, bytes) in seeds() {
            std::fs::write(dir.join(name), bytes).expect("write seed");
        }
    }
    for (name, bytes) in seeds() {
        let committed = std::fs::read(dir.join(name))
            .unwrap_or_else(|e| panic!("{name}: {e} (OKV_WRITE_GGUF_SEEDS=1 writes it)"));
        assert!(gguf_fuzz::run(&committed).is_ok(), "{name} does not parse");
        assert_eq!(committed, bytes, "{name} differs from the writer's output");
    }
}

#[test]
fn corpus_replays_clean() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(corpus_dir())
        .expect("corpus dir")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    assert!(files.len() >= 4, "only {} corpus files", files.len());
    let mut ok = 0;
    for f in &files {
        let data = std::fs::read(f).expect("read");
        if gguf_fuzz::run(&data).is_ok() {
            ok += 1;
        }
    }
    println!("gguf corpus: {} inputs, {ok} parse", files.len());
}

const INTERESTING: [u64; 10] = [0, 1, 2, 3, 4, 31, 32, 0x8000_0000, u64::MAX, u64::MAX / 2];

fn mutate(base: &[u8], rng: &mut Rng) -> Vec<u8> {
    let mut d = base.to_vec();
    for _ in 0..1 + rng.below(4) {
        let len = d.len();
        match rng.below(5) {
            0 => {
                let i = rng.below(len);
                d[i] ^= 1 << rng.below(8);
            }
            1 => {
                // An interesting little-endian value over 1, 2, 4 or 8 bytes.
                let w = 1 << rng.below(4);
                let v = INTERESTING[rng.below(INTERESTING.len())].to_le_bytes();
                let i = rng.below(len.saturating_sub(w));
                let end = (i + w).min(len);
                d[i..end].copy_from_slice(&v[..end - i]);
            }
            2 => d.truncate(rng.below(len)),
            3 => {
                let i = rng.below(len);
                let n = 1 + rng.below(16);
                let pad: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                d.splice(i..i, pad);
            }
            _ => {
                let i = rng.below(len);
                let n = rng.below(16).min(len - i);
                d.drain(i..i + n);
            }
        }
        if d.is_empty() {
            break;
        }
    }
    d
}

#[test]
fn seeded_mutations_never_panic() {
    let mut rng = Rng(0x6767_7566);
    let mut outcomes: BTreeMap<&'static str, usize> = BTreeMap::new();
    let bases: Vec<Vec<u8>> = seeds().into_iter().map(|(_, b)| b).collect();
    let n = 6000;
    for i in 0..n {
        let base = &bases[i % bases.len()];
        let input = mutate(base, &mut rng);
        let kind = match gguf_fuzz::run(&input) {
            Ok(_) => "ok",
            Err(e) => e.kind(),
        };
        *outcomes.entry(kind).or_default() += 1;
    }
    println!("gguf mutations: {n} inputs, outcomes {outcomes:?}");
    assert_eq!(outcomes.values().sum::<usize>(), n);
    // The mutations reach both sides of the parser.
    assert!(outcomes.get("ok").copied().unwrap_or(0) > 0, "{outcomes:?}");
    assert!(
        outcomes.get("Format").copied().unwrap_or(0) > n / 4,
        "{outcomes:?}"
    );
}
