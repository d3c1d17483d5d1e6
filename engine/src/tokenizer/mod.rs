//! The tokenizer, built from the GGUF's own metadata (no `tokenizer.json`).
