#!/usr/bin/env bash
# Command 2: set everything up and run every test: format, lints, the Rust
# workspace tests and the Python tests.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PIP_EXTRA_PKGS="pytest>=8 hypothesis>=6.100 ruff>=0.5" . scripts/setup.sh

echo "==> cargo fmt --check"
cargo fmt --all -- --check
echo "==> cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
echo "==> ruff"
ruff check python tests benches
ruff format --check python tests benches
echo "==> cargo test --workspace"
cargo test --workspace --release
echo "==> pytest"
python -m pytest -q tests/python
