//! The fuzz harness on stable: replays every committed
//! corpus input of the `cell_ops` fuzz target (`fuzz/corpus/cell_ops/`) and a
//! few thousand seeded random inputs through the same decoder and invariant
//! checker (`tests/fuzz_cell/mod.rs`), so CI catches regressions without
//! nightly or cargo-fuzz.

mod common;
mod fuzz_cell;

use std::fs;
use std::path::PathBuf;

#[test]
fn corpus_replays_clean() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/cell_ops");
    let mut files: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    assert!(files.len() >= 10, "only {} corpus files", files.len());
    let (mut ops, mut refused) = (0, 0);
    for f in &files {
        let data = fs::read(f).unwrap();
        let r = std::panic::catch_unwind(|| fuzz_cell::run(&data));
        match r {
            Ok((o, x)) => {
                ops += o;
                refused += x;
            }
            Err(_) => panic!("corpus input {} fails", f.display()),
        }
    }
    eprintln!(
        "{} corpus inputs, {ops} ops, {refused} refused",
        files.len()
    );
}

#[test]
fn seeded_random_inputs_hold_the_invariants() {
    let mut rng = common::Rng::new(0x0ff9_7a9f);
    let (mut ops, mut refused) = (0, 0);
    for _ in 0..1500 {
        let len = rng.range(4, 400);
        let data: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        let (o, x) = fuzz_cell::run(&data);
        ops += o;
        refused += x;
    }
    assert!(ops > 50_000, "{ops} ops");
    assert!(
        refused > 1_000 && ops - refused > 20_000,
        "{refused} of {ops} refused"
    );
    eprintln!("seeded: {ops} ops, {refused} refused");
}
