//! The README's engine example: a real GGUF model, greedy, in plain Rust.
//!
//! `cargo run --release -p offgraph-kv-engine --example generate -- MODEL.gguf "prompt"`

use offgraph_kv::KvDtype;
use offgraph_kv_engine::{Model, Result};

fn generate(path: &str, prompt: &str, n: usize) -> Result<String> {
    let model = Model::open(path)?; // a bad or unsupported file is an error, never a panic
    let mut kc = model.new_cache(4096, 8, 512, KvDtype::Float32, KvDtype::Float32)?;
    let seq = kc.cells_mut().seq_new()?;
    let mut ids = model.tokenizer().encode(prompt, true);
    let (mut step, mut pos0) = (ids.clone(), 0);
    for _ in 0..n {
        let pos: Vec<usize> = (pos0..pos0 + step.len()).collect();
        let last = step.len() - 1;
        let logits = model.forward(&mut kc, &step, &vec![seq; step.len()], &pos, &[last])?;
        let next = (0..logits.len()).max_by(|&a, &b| logits[a].total_cmp(&logits[b]));
        let next = next.unwrap_or(0) as u32;
        if Some(next) == model.tokenizer().eos() {
            break;
        }
        ids.push(next);
        pos0 += step.len();
        step = vec![next];
    }
    model.tokenizer().decode(&ids, true)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(path), Some(prompt)) = (args.first(), args.get(1)) else {
        eprintln!("usage: generate MODEL.gguf PROMPT");
        std::process::exit(2);
    };
    match generate(path, prompt, 24) {
        Ok(text) => println!("{text}"),
        Err(e) => {
            eprintln!("generate: {e}");
            std::process::exit(1);
        }
    }
}
