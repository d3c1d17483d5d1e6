#!/usr/bin/env bash
# Command 2: set everything up and run every test: format, lints, the Rust
# workspace tests and the Python tests.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# torch (CPU use; PyPI wheel), transformers and matplotlib: the hf adapter tests and bench --quick.
PIP_EXTRA_PKGS="pytest>=8 hypothesis>=6.100 ruff>=0.5 torch>=2.4 transformers>=5.0 matplotlib>=3.7" . scripts/setup.sh

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
echo "==> valgrind memcheck over the Rust tests"
./scripts/valgrind-rust.sh
echo "==> fuzz (cargo fuzz, fixed budget)"
./scripts/fuzz.sh
