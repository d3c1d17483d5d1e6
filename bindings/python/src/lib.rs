//! Python bindings (filled in).
