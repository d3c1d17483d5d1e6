#!/usr/bin/env bash
# The C ABI's checks: builds liboffgraph_kv_c, checks the committed header is
# what cbindgen generates, compiles the examples and C/C++ tests with
# -Wall -Wextra -Werror (C11, C++17), runs them plain, under valgrind and with
# AddressSanitizer, compares the example runners' tokens with the Rust
# runner's, checks that C and Python write the same snapshot bytes and load
# each other's, checks each header compiles alone and that the shared library
# exports only okv_ symbols. Needs gcc, g++, valgrind, binutils (nm) and the
# Python package built (PYTHON, else ./.venv/bin/python, else python3).
#
#   scripts/test-c.sh            # run everything
#   scripts/test-c.sh --regen    # rewrite bindings/c/include/offgraph_kv.h
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$PWD"
CBINDGEN_VERSION=0.29.2
INC="bindings/c/include"
HEADER="$INC/offgraph_kv.h"
LIBDIR="$ROOT/target/release"
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
passed=0
failed=0

ok() { passed=$((passed + 1)); echo "ok   $1"; }
bad() { failed=$((failed + 1)); echo "FAIL $1"; }
# run NAME CMD...: one counted check; its output is shown when it fails.
run() {
    local name="$1"
    shift
    if "$@" >"$OUT/log" 2>&1; then ok "$name"; else bad "$name"; sed 's/^/     /' "$OUT/log" | tail -40; fi
}

cbindgen_bin() {
    local bin
    bin="$(command -v cbindgen || echo "$HOME/.cargo/bin/cbindgen")"
    if ! "$bin" --version 2>/dev/null | grep -q " $CBINDGEN_VERSION\$"; then
        echo "==> cargo install cbindgen $CBINDGEN_VERSION" >&2
        cargo install cbindgen --locked --version "$CBINDGEN_VERSION" >&2 || return 1
        bin="$HOME/.cargo/bin/cbindgen"
    fi
    echo "$bin"
}

generate() {
    "$(cbindgen_bin)" --quiet --config bindings/c/cbindgen.toml --crate offgraph-kv-c --output "$1"
}

if [ "${1:-}" = "--regen" ]; then
    generate "$HEADER" && echo "wrote $HEADER"
    exit $?
fi

echo "==> cargo build --release -p offgraph-kv-c"
cargo build --release -p offgraph-kv-c || { echo "c-tests: 0 passed, 1 failed"; exit 1; }
echo "==> cargo build --release --example runner (the tokens to compare with)"
cargo build --release --example runner || { echo "c-tests: 0 passed, 1 failed"; exit 1; }

run "header is fresh (cbindgen $CBINDGEN_VERSION)" \
    bash -c "$(declare -f cbindgen_bin generate); CBINDGEN_VERSION=$CBINDGEN_VERSION; generate '$OUT/fresh.h' && diff -u '$HEADER' '$OUT/fresh.h'"

run "exports only okv_ symbols" bash -c "
    syms=\$(nm -D --defined-only '$LIBDIR/liboffgraph_kv_c.so' | awk '{print \$3}')
    [ -n \"\$syms\" ] || { echo 'no exported symbols'; exit 1; }
    others=\$(echo \"\$syms\" | grep -v '^okv_' || true)
    [ -z \"\$others\" ] || { echo \"non-okv exports:\"; echo \"\$others\"; exit 1; }
    echo \"\$(echo \"\$syms\" | wc -l) okv_ exports\""

CFLAGS=(-std=c11 -Wall -Wextra -Wpedantic -Werror -O2 -g -ffp-contract=off -I "$INC" -I examples/c)
CXXFLAGS=(-std=c++17 -Wall -Wextra -Wpedantic -Werror -O2 -g -ffp-contract=off -I "$INC" -I examples/c)
LINK=(-pthread -L "$LIBDIR" -loffgraph_kv_c -Wl,-rpath,"$LIBDIR" -lm)
# The static library needs the core's native dependencies on the link line.
STATIC=(-pthread "$LIBDIR/liboffgraph_kv_c.a" -lXNNPACK -lgcc_s -ldl -lm)

run "offgraph_kv.h compiles alone as C11" bash -c "echo '#include \"offgraph_kv.h\"' | gcc ${CFLAGS[*]} -fsyntax-only -x c -"
run "offgraph_kv.h compiles alone as C++17" bash -c "echo '#include \"offgraph_kv.h\"' | g++ ${CXXFLAGS[*]} -fsyntax-only -x c++ -"
run "offgraph_kv.hpp compiles alone as C++17" bash -c "echo '#include \"offgraph_kv.hpp\"' | g++ ${CXXFLAGS[*]} -fsyntax-only -x c++ -"

# Definite leaks are errors. The live-handle set (a process-global hash map) shows as
# "possibly lost" only because hashbrown points into the middle of its block: not shown.
# --fair-sched=yes: valgrind runs one thread at a time, and its default lock lets a
# spinning thread starve the others (the thread tests wait on each other).
VG=(valgrind -q --fair-sched=yes --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite --show-leak-kinds=definite)

# Build every program twice: plain (also run under valgrind) and with ASan + UBSan.
SAN=(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all)
build() { # build NAME SRC
    local name="$1" src="$2"
    case "$src" in
    *.c)
        run "compile $name (C11)" gcc "${CFLAGS[@]}" "$src" -o "$OUT/$name" "${LINK[@]}"
        run "compile $name (C11, ASan)" gcc "${CFLAGS[@]}" "${SAN[@]}" "$src" -o "$OUT/$name-asan" "${LINK[@]}"
        ;;
    *)
        run "compile $name (C++17)" g++ "${CXXFLAGS[@]}" "$src" -o "$OUT/$name" "${LINK[@]}"
        run "compile $name (C++17, ASan)" g++ "${CXXFLAGS[@]}" "${SAN[@]}" "$src" -o "$OUT/$name-asan" "${LINK[@]}"
        ;;
    esac
}
sed -n '/^```c$/,/^```$/p' README.md | sed '1d;$d' >"$OUT/readme.c"
run "the README's C quick start is a program" test -s "$OUT/readme.c"
build readme "$OUT/readme.c"
build bad_input bindings/c/tests/bad_input.c
build dtypes bindings/c/tests/dtypes.c
build statuses bindings/c/tests/statuses.c
build exchange bindings/c/tests/exchange.c
build threads bindings/c/tests/threads.c
build step_and_ids bindings/c/tests/step_and_ids.c
build wrapper bindings/c/tests/wrapper.cpp
build pool_memory bindings/c/tests/pool_memory.c
build fork bindings/c/tests/fork.c
build runner-c examples/c/runner.c
build runner-cpp examples/cpp/runner.cpp
# The allocation counter wraps the C allocator at link time: static library only.
WRAP=-Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=posix_memalign,--wrap=aligned_alloc
run "compile no_alloc (C11, static library)" gcc "${CFLAGS[@]}" bindings/c/tests/no_alloc.c -o "$OUT/no_alloc" "$WRAP" "${STATIC[@]}"
run "no_alloc: a warm decode step allocates nothing" "$OUT/no_alloc"
run "no_alloc under valgrind (0 errors)" "${VG[@]}" "$OUT/no_alloc"
run "compile runner-c against the static library" gcc "${CFLAGS[@]}" examples/c/runner.c -o "$OUT/runner-c-static" "${STATIC[@]}"

# Small flags: a ring window that wraps, a flat layer (every sixth), chunked prefill, forks.
FLAGS=(--prefix 37 --decode 10 --chunk 16 --layers 7 --window 12 --hidden 64 --q-heads 4 --kv-heads 2
    --head-dim 16 --vocab 101 --seed 5 --threads 1)
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0
export UBSAN_OPTIONS=print_stacktrace=1

for prog in readme bad_input dtypes statuses threads step_and_ids wrapper pool_memory; do
    run "$prog" "$OUT/$prog"
    run "$prog under valgrind (0 errors)" "${VG[@]}" "$OUT/$prog"
    run "$prog with AddressSanitizer" "$OUT/$prog-asan"
done
# fork after a threaded attend. No leak check under valgrind: a forked child holds
# the memory of its parent's worker threads with no thread left to free it.
run "fork" "$OUT/fork"
run "fork under valgrind (0 errors)" valgrind -q --fair-sched=yes --error-exitcode=99 --leak-check=no "$OUT/fork"
run "fork with AddressSanitizer" "$OUT/fork-asan"
# The copy-growth fallback, forced: the same checks where they hold.
run "pool_memory, pools grown by copying" "$OUT/pool_memory" grow
run "pool_memory grow under valgrind (0 errors)" "${VG[@]}" "$OUT/pool_memory" grow
run "pool_memory grow with AddressSanitizer" "$OUT/pool_memory-asan" grow

# Snapshots cross languages: C writes, Python compares the bytes with its own
# and loads them, then C loads Python's (plain and under valgrind).
PY="${PYTHON:-}"
[ -n "$PY" ] || { [ -x .venv/bin/python ] && PY=.venv/bin/python; } || PY=python3
SNAPS="$OUT/snapshots"
mkdir -p "$SNAPS"
run "exchange: C writes its snapshots" "$OUT/exchange" "$SNAPS"
run "exchange: Python's snapshots of the same state are the same bytes" "$PY" bindings/c/tests/exchange.py "$SNAPS"
run "exchange: C loads Python's snapshots" "$OUT/exchange" --load "$SNAPS"
run "exchange --load under valgrind (0 errors)" "${VG[@]}" "$OUT/exchange" --load "$SNAPS"
run "exchange --load with AddressSanitizer" "$OUT/exchange-asan" --load "$SNAPS"

rust_tokens() { # rust_tokens SEQS -> the generated list of the Rust runner
    "$LIBDIR/examples/runner" --seqs "$1" "${FLAGS[@]}" --dump "$OUT/rust-$1.json" >/dev/null &&
        sed -n 's/^"generated": \(.*\),$/\1/p' "$OUT/rust-$1.json"
}
tokens_of() { sed -n 's/^generated: //p'; }
same_tokens() { # same_tokens NAME EXPECTED CMD...
    local name="$1" want="$2"
    shift 2
    local got
    got="$("$@" | tokens_of)"
    if [ -n "$want" ] && [ "$got" = "$want" ]; then ok "$name"; else bad "$name"; echo "     expected: $want"; echo "     got:      $got"; fi
}

want3="$(rust_tokens 3)"
want1="$(rust_tokens 1)"
echo "     Rust runner, 3 sequences: $want3"
same_tokens "C runner prints the Rust runner's tokens" "$want3" "$OUT/runner-c" --seqs 3 "${FLAGS[@]}"
same_tokens "C runner, valgrind: the same tokens" "$want3" "${VG[@]}" "$OUT/runner-c" --seqs 3 "${FLAGS[@]}"
same_tokens "C runner, ASan: the same tokens" "$want3" "$OUT/runner-c-asan" --seqs 3 "${FLAGS[@]}"
same_tokens "C runner, static library: the same tokens" "$want3" "$OUT/runner-c-static" --seqs 3 "${FLAGS[@]}"
F32=(--dtype float32)
same_tokens "C++ runner prints the Rust runner's tokens (1 sequence)" "$want1" "$OUT/runner-cpp" "${FLAGS[@]}" "${F32[@]}"
same_tokens "C++ runner: a failed forward, rewound and retried, changes no token" "$want1" \
    "$OUT/runner-cpp" "${FLAGS[@]}" "${F32[@]}" --fail-at 4
run "C++ runner: the failure really happened (1 rewind)" bash -c "'$OUT/runner-cpp' ${FLAGS[*]} ${F32[*]} --fail-at 4 | grep -q ', 1 rewinds,'"
same_tokens "C++ runner, valgrind: the same tokens" "$want1" "${VG[@]}" "$OUT/runner-cpp" "${FLAGS[@]}" "${F32[@]}" --fail-at 4
same_tokens "C++ runner, ASan: the same tokens" "$want1" "$OUT/runner-cpp-asan" "${FLAGS[@]}" "${F32[@]}" --fail-at 4
# Float16 pools (the runner's default): saving the conversation mid-run and
# continuing from a new cache loaded from the snapshot changes no token.
want16="$("$OUT/runner-cpp" "${FLAGS[@]}" | tokens_of)"
echo "     C++ runner, float16 pools: $want16"
same_tokens "C++ runner, float16: save + restore at decode step 5 gives the uninterrupted tokens" "$want16" \
    "$OUT/runner-cpp" "${FLAGS[@]}" --restore-at 5
run "C++ runner, float16: the restore really happened" bash -c "'$OUT/runner-cpp' ${FLAGS[*]} --restore-at 5 | grep -q 'float16 pools.*snapshot: yes'"
same_tokens "C++ runner, float16, valgrind: save + restore, the same tokens" "$want16" \
    "${VG[@]}" "$OUT/runner-cpp" "${FLAGS[@]}" --restore-at 5 --fail-at 6
same_tokens "C++ runner, float16, ASan: save + restore, the same tokens" "$want16" \
    "$OUT/runner-cpp-asan" "${FLAGS[@]}" --restore-at 5

echo "c-tests: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
