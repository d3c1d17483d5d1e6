//! What an open model holds besides the mapped file: the anonymous memory
//! `Model::open` leaves resident. Gemma 3's 262,144-token vocabulary is the
//! large part; held as metadata values plus a tokenizer of owned strings and a
//! hash map of copies it was about 72 MiB here; with the metadata let go
//! after open and the vocabulary in flat buffers it is about 15 MiB (9 MiB of
//! it live, the rest the allocator's retention of what open freed). The bound
//! sits between. One test in this binary, so no other test allocates while it
//! measures.

mod common;

use offgraph_kv_engine::Model;

/// `RssAnon` of this process, in KiB (Linux).
fn rss_anon_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let line = status.lines().find(|l| l.starts_with("RssAnon:"));
    let kib = line.and_then(|l| l.split_whitespace().nth(1)?.parse().ok());
    assert!(kib.is_some(), "no RssAnon line in /proc/self/status");
    kib.unwrap_or(0)
}

#[test]
fn an_open_gemma3_holds_little_beyond_its_mapped_file() {
    let path = common::gemma3_gguf();
    let before = rss_anon_kib();
    let model = Model::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let held = rss_anon_kib().saturating_sub(before);
    // The tokenizer still answers from its flat buffers.
    let tok = model.tokenizer();
    assert_eq!(tok.vocab_size(), 262_144);
    let ids = tok.encode("The capital of France is Paris.", false);
    assert_eq!(
        tok.decode(&ids, false).ok().as_deref(),
        Some("The capital of France is Paris.")
    );
    assert!(
        held < 24 * 1024,
        "Model::open left {:.1} MiB of anonymous memory resident (bound 24 MiB)",
        held as f64 / 1024.0
    );
    eprintln!(
        "Model::open (Gemma 3): {:.1} MiB anonymous",
        held as f64 / 1024.0
    );
}
