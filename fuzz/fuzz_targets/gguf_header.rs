//! Arbitrary bytes -> the GGUF loader: `parse_header` never panics, and a
//! header it accepts describes tensors that all lie inside the bytes and
//! read back (float ones as f32). The check lives in
//! `engine/tests/gguf_fuzz/mod.rs`, shared with the stable replay test
//! `engine/tests/gguf_fuzz_replay.rs`.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../engine/tests/gguf_fuzz/mod.rs"]
mod gguf_fuzz;

fuzz_target!(|data: &[u8]| {
    let _ = gguf_fuzz::run(data);
});
