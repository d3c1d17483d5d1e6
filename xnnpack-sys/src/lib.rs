//! FFI declarations for XNNPACK (placeholder, filled by the attention work).
