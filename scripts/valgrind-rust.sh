#!/usr/bin/env bash
# A reduced but meaningful set of the Rust
# integration tests under valgrind memcheck. Every memcheck error counts
# (invalid reads/writes, uninitialised values, bad frees); leaks are not
# checked (--leak-check=no: thread-locals and process statics by design).
# No suppressions are needed today. Prints the error total; exits 1 on any.
#   VALGRIND_TESTS="kv_cell registry" scripts/valgrind-rust.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
TESTS="${VALGRIND_TESTS:-kv_sequence kv_cell cell_regress sequence_refusals registry registry_concurrency attention_refusals attention_reference fuzz_replay}"
command -v valgrind >/dev/null || { echo "valgrind not installed" >&2; exit 2; }

echo "==> cargo test --release --no-run (test binaries)"
args=()
for t in $TESTS; do args+=(--test "$t"); done
json="$(cargo test -p offgraph-kv --release --no-run --message-format=json "${args[@]}" 2>/dev/null)"

total=0
failed=0
for t in $TESTS; do
    bin="$(printf '%s\n' "$json" | python3 -c '
import json, sys
want = sys.argv[1]
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") \
            and m["target"]["name"] == want and "test" in m["target"]["kind"]:
        print(m["executable"])
' "$t")"
    if [ -z "$bin" ]; then
        echo "no test binary for $t" >&2
        exit 2
    fi
    log="$(mktemp)"
    start=$(date +%s)
    # --test-threads=1: memcheck serialises threads anyway; one at a time keeps
    # the log readable. Tests that spawn threads still do.
    set +e
    valgrind --tool=memcheck --error-exitcode=1 --leak-check=no \
        --log-file="$log" "$bin" --test-threads=1 -q >/dev/null 2>&1
    rc=$?
    set -e
    n="$(grep -Eo 'ERROR SUMMARY: [0-9]+' "$log" | tail -1 | grep -Eo '[0-9]+$' || echo '?')"
    echo "$t: $n memcheck errors, exit $rc, $(( $(date +%s) - start ))s"
    if [ "$n" != "0" ] || [ "$rc" -ne 0 ]; then
        failed=1
        grep -E '^==[0-9]+== (Invalid|Conditional|Use of|Mismatched|Source|Syscall| +at | +by )' "$log" | head -40 >&2 || true
    fi
    if [ "$n" != "?" ]; then
        total=$(( total + n ))
    fi
    rm -f "$log"
done
echo "valgrind memcheck: $total errors in total"
exit "$failed"
