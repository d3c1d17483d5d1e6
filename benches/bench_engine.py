"""The native engine against llama.cpp's `llama-bench` on the same GGUF, the same machine and the
same threads, in one run: prompt processing (pp512) and generation (tg128) at depths 0, 4096 and
8192 (`-d`), 1 and 2 threads, both test models. Each cell runs the two programs in turn, A B A B,
for `--rounds` rounds; the table quotes the medians of every repetition of every round and the
ratio engine / llama.cpp. Peak resident memory of each process (wait4's ru_maxrss) is reported
against the file size and the engine's pool bytes.

llama.cpp is not vendored. Build `llama-bench` outside the repository from the llama.cpp in the
llama-cpp-python 0.3.36 sdist (about 15 minutes on 2 cores; cmake from Debian):

    pip download --no-deps --no-binary llama-cpp-python llama-cpp-python==0.3.36
    tar xzf llama_cpp_python-0.3.36.tar.gz && cd llama_cpp_python-0.3.36/vendor/llama.cpp
    cmake -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF
    cmake --build build -j 2 --target llama-bench llama-server

and pass `--llama-bench .../build/bin/llama-bench`. Without it only the engine's side runs. On a
VM that reports AMX but faults on its tiles (seen on an Intel Xeon: SIGILL in
`tinygemm_kernel_amx`), configure with `-DGGML_NATIVE=OFF` and the AVX2/AVX-512/VNNI options on
instead.

    python benches/bench_engine.py --llama-bench PATH [--rounds 2] [--kv-dtype float16] [--quick]

Both programs keep K and V in the same type (`--kv-dtype`, passed to llama-bench as `-ctk`/`-ctv`;
llama-bench has no float32 cache, so with `--kv-dtype float32` it keeps its f16).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def model_paths() -> dict[str, str]:
    from offgraph_kv.serve.loading import resolve

    out = {}
    for name in ("smollm2-135m", "gemma-3-270m"):
        where, gguf, _ = resolve(name)
        out[name] = os.path.join(where, gguf)
    return out


def okv_bench_exe() -> str:
    subprocess.run(
        ["cargo", "build", "--release", "-q", "-p", "offgraph-kv-engine", "--bin", "okv-bench"],
        cwd=ROOT,
        check=True,
    )
    target = os.environ.get("CARGO_TARGET_DIR", str(ROOT / "target"))
    return str(Path(target) / "release" / "okv-bench")


def run_rss(cmd: list[str]) -> tuple[str, int]:
    """stdout and peak resident KiB (ru_maxrss of exactly this child, from wait4)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # Read everything first, then reap the child with wait4 to get its own rusage.
    out = p.stdout.read() if p.stdout else b""
    err = p.stderr.read() if p.stderr else b""
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed ({p.returncode}): {err.decode()[-2000:]}")
    return out.decode(), usage.ru_maxrss


# llama-bench's name for each KV type; it has no f32 cache, so float32 leaves it at its f16 default.
LLAMA_KV = {"float32": "f16", "float16": "f16", "bfloat16": "bf16", "q8_0": "q8_0"}


def llama_rates(exe, model, threads, depth, pp, tg, reps, kv) -> tuple[dict[str, list[float]], int]:
    cmd = [exe, "-m", model, "-t", str(threads), "-p", str(pp), "-n", str(tg)]
    cmd += ["-d", str(depth), "-r", str(reps), "-o", "json"]
    cmd += ["-ctk", LLAMA_KV[kv], "-ctv", LLAMA_KV[kv]]
    out, rss = run_rss(cmd)
    rates: dict[str, list[float]] = {}
    for row in json.loads(out):
        test = f"pp{row['n_prompt']}" if row["n_gen"] == 0 else f"tg{row['n_gen']}"
        rates[test] = [float(x) for x in row["samples_ts"]]
    return rates, rss


def okv_rates(
    exe, model, threads, depth, pp, tg, reps, kv
) -> tuple[dict[str, list[float]], int, dict]:
    cmd = [exe, model, "--threads", str(threads), "--depth", str(depth)]
    cmd += ["--pp", str(pp), "--tg", str(tg), "--reps", str(reps), "--kv-dtype", kv]
    out, rss = run_rss(cmd)
    rates: dict[str, list[float]] = {}
    extra: dict = {}
    for line in out.splitlines():
        row = json.loads(line)
        if "test" in row:
            rates[row["test"]] = row["tokens_per_s"]
        else:
            extra = row
    return rates, rss, extra


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-bench", help="llama.cpp's llama-bench executable")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--depths", default="0,4096,8192")
    ap.add_argument("--models", default="smollm2-135m,gemma-3-270m")
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument(
        "--kv-dtype",
        default="float16",
        choices=sorted(LLAMA_KV),
        help="KV type of both programs (default float16, llama-bench's own; it has no float32)",
    )
    ap.add_argument("--quick", action="store_true", help="depth 0 only, 1 round, 2 reps")
    ap.add_argument("--json", help="write every figure here")
    a = ap.parse_args(argv)
    if a.quick:
        a.depths, a.rounds, a.reps = "0", 1, 2
    paths = model_paths()
    exe = okv_bench_exe()
    threads = [int(t) for t in a.threads.split(",")]
    depths = [int(d) for d in a.depths.split(",")]
    rows = []
    mem: dict[tuple[str, str, int], tuple[int, int]] = {}  # -> (peak KiB, pool bytes)
    for name in a.models.split(","):
        model = paths[name]
        for t in threads:
            for d in depths:
                ours: dict[str, list[float]] = {}
                theirs: dict[str, list[float]] = {}
                for _ in range(a.rounds):
                    if a.llama_bench:
                        r, rss = llama_rates(
                            a.llama_bench, model, t, d, a.pp, a.tg, a.reps, a.kv_dtype
                        )
                        for k, v in r.items():
                            theirs.setdefault(k, []).extend(v)
                        key = (name, "llama.cpp", d)
                        mem[key] = (max(rss, mem.get(key, (0, 0))[0]), 0)
                    r, rss, extra = okv_rates(exe, model, t, d, a.pp, a.tg, a.reps, a.kv_dtype)
                    for k, v in r.items():
                        ours.setdefault(k, []).extend(v)
                    key = (name, "offgraph-kv", d)
                    mem[key] = (max(rss, mem.get(key, (0, 0))[0]), extra.get("pool_bytes", 0))
                for test in sorted(ours):
                    o = statistics.median(ours[test])
                    th = statistics.median(theirs[test]) if test in theirs else None
                    rows.append((name, test, d, t, o, th))
                    ratio = f"{o / th:.2f}" if th else "-"
                    print(
                        f"{name} {test} d={d} t={t}: engine {o:.1f} tok/s, llama.cpp "
                        f"{th if th is None else round(th, 1)} tok/s, ratio {ratio}",
                        flush=True,
                    )
    print()
    print("| model | test | depth | threads | offgraph-kv tok/s | llama.cpp tok/s | ratio |")
    print("|---|---|---|---|---|---|---|")
    for name, test, d, t, o, th in rows:
        ratio = f"{o / th:.2f}x" if th else "-"
        tht = f"{th:.1f}" if th else "-"
        print(f"| {name} | {test} | {d} | {t} | {o:.1f} | {tht} | {ratio} |")
    print()
    print("| model | program | depth | peak resident MiB | file MiB | pools MiB | rest MiB |")
    print("|---|---|---|---|---|---|---|")
    for (name, prog, d), (rss, pools) in sorted(mem.items()):
        size = os.path.getsize(paths[name]) / 2**20
        rest = f"{rss / 1024 - size - pools / 2**20:.1f}" if prog == "offgraph-kv" else "-"
        pools_s = f"{pools / 2**20:.1f}" if prog == "offgraph-kv" else "-"
        print(f"| {name} | {prog} | {d} | {rss / 1024:.1f} | {size:.1f} | {pools_s} | {rest} |")
    if a.json:
        with open(a.json, "w") as f:
            memory = [[*k, *v] for k, v in mem.items()]
            json.dump({"kv_dtype": a.kv_dtype, "rows": rows, "memory": memory}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
