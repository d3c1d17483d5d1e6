//! okv-run: prompt in, text out, over a GGUF model on the native engine.
fn main() {
    eprintln!("okv-run: the runner is being built");
    std::process::exit(2);
}
