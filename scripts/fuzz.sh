#!/usr/bin/env bash
# Runs the cargo-fuzz targets (fuzz/) for fixed budgets and prints each
# one's execution count:
#   cell_ops     operation sequences on the caches   (FUZZ_SECONDS, default 60)
#   gguf_header  the engine's GGUF loader on bytes   (GGUF_FUZZ_SECONDS, default 20)
# Needs the nightly toolchain; installs cargo-fuzz if missing. New corpus
# entries go to scratch directories, so the committed corpora
# (fuzz/corpus/<target>, replayed on stable by tests/fuzz_replay.rs and
# engine/tests/gguf_fuzz_replay.rs) only change by hand (cargo fuzz cmin).
#   FUZZ_SECONDS=60 GGUF_FUZZ_SECONDS=20 scripts/fuzz.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
CELL_SECONDS="${FUZZ_SECONDS:-60}"
GGUF_SECONDS="${GGUF_FUZZ_SECONDS:-20}"
if ! cargo +nightly --version >/dev/null 2>&1; then
    # libFuzzer instrumentation needs nightly, and this machine kind cannot
    # fetch toolchains. The same checkers still ran on stable in cargo test
    # (tests/fuzz_replay.rs: the committed corpus plus 1,500 seeded inputs;
    # engine/tests/gguf_fuzz_replay.rs: the gguf corpus plus 6,000 mutations).
    echo "fuzz: no nightly toolchain on this machine: the libFuzzer run is not possible here" >&2
    echo "fuzz executions: 0 (nightly missing; corpus replay ran in cargo test)"
    exit 0
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "==> installing cargo-fuzz"
    cargo install --locked cargo-fuzz
fi
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT

# run_target NAME SECONDS MAX_LEN
run_target() {
    local name="$1" budget="$2" max_len="$3"
    local work="$scratch/$name" log="$scratch/$name.log"
    mkdir -p "$work"
    cp "fuzz/corpus/$name"/* "$work/"
    echo "==> cargo +nightly fuzz run $name (${budget}s)"
    # --dev (opt-level 0, still with AddressSanitizer and coverage): optimising the
    # instrumented crate takes over 13 minutes since the generic SIMD kernels landed,
    # against about a minute and a half unoptimised.
    local status=0
    (cd fuzz && cargo +nightly fuzz run --dev "$name" "$work" -- \
        -max_total_time="$budget" -max_len="$max_len" -print_final_stats=1) >"$log" 2>&1 || status=$?
    grep -E "^(INFO|==|SUMMARY|Done|stat::number_of_executed_units)|panicked|ERROR" "$log" || true
    local execs
    execs="$(grep -Eo 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -Eo '[0-9]+$' || true)"
    echo "fuzz executions ($name): ${execs:-unknown} in ${budget}s"
    if [ "$status" -ne 0 ]; then
        tail -40 "$log" >&2
        echo "fuzz target $name failed (crash input saved under fuzz/artifacts/$name/)" >&2
        exit "$status"
    fi
}

run_target cell_ops "$CELL_SECONDS" 512
# The seeds are under 2 KiB; 4 KiB leaves room for grown tables.
run_target gguf_header "$GGUF_SECONDS" 4096
