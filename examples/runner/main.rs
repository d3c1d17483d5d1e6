//! The demo's decode loop in plain Rust: no Python anywhere.
//!
//! Runs the very workload of `offgraph-kv demo` (`python/offgraph_kv/demo.py`,
//! model in `demo_model.py`) through the crate's API: a shared prompt prefix is
//! prefilled once in chunks on one sequence, forked with `seq_clone` (cells
//! shared, no K/V copied), and every fork then decodes one token per step in
//! batched steps through a Gemma-like mix of ring and flat layers, with the
//! K/V written by `KvCellCache::update` and attention read from the pools in
//! place by `attend_into`.
//!
//! Weights and prompt come from the same counter-based splitmix64 stream as
//! the Python demo (computed in f64, then cast to f32), so for the same flags
//! the runner generates the same tokens. `--dump PATH` writes the generated
//! tokens and each sequence's final hidden state at its last decode step as
//! JSON (checked against the float64 reference by `tests/python/test_runner.py`).
//!
//! ```text
//! cargo run --release --example runner -- --seqs 8 --decode 32
//! ```

mod args;
mod decode;
mod matmul;
mod model;
mod report;
mod rng;

use std::error::Error;
use std::process::ExitCode;

use args::{parse_args, Args, USAGE};
use decode::run;
use report::{dump_json, table};

type BoxResult<T> = Result<T, Box<dyn Error>>;

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let a = match parse_args(&argv) {
        Ok(Some(a)) => a,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(msg) => {
            eprintln!("{USAGE}\nrunner: error: {msg}");
            return ExitCode::from(2);
        }
    };
    match main_inner(&a) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("runner: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn main_inner(a: &Args) -> BoxResult<()> {
    println!(
        "offgraph-kv runner (Rust, no Python): {} sequences share a {}-token prefix, then decode {} tokens each",
        a.seqs, a.prefix, a.decode
    );
    println!(
        "model: {} layers (ring window {} : flat = 5:1), {} query / {} KV heads x {}, hidden {}, random weights (seed {})",
        a.layers, a.window, a.q_heads, a.kv_heads, a.head_dim, a.hidden, a.seed
    );
    let o = run(a)?;
    print!("{}", table(a, &o));
    if let Some(path) = &a.dump {
        std::fs::write(path, dump_json(a, &o))
            .map_err(|e| format!("--dump: cannot write {path}: {e}"))?;
        println!("wrote {path}");
    }
    Ok(())
}
