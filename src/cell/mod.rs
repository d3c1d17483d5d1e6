//! Multi-sequence cell cache (issue 3).
