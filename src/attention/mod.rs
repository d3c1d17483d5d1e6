//! Pooled attention (issue 5).
