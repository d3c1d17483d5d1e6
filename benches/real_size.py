"""The engine against llama.cpp at real sizes, with the machine's read floor measured in the same
run: random-weight GGUFs of a SmolLM2-1.7B shape and a Llama-3-8B shape (`real_shapes.py`),
quantized by llama.cpp's `llama-quantize` to Q4_K_M and Q4_0 (the Q8_0 file is the written
source, all matrices Q8_0 as `llama-quantize` makes them), then `okv-bench` and `llama-bench` on
the same file, the same threads and the same KV type (f16), prefill (`--pp`) and decode (`--tg`).

Each repetition runs every program once on the file, the order alternating between repetitions
(A B, B A, ...), each run preceded by a floor measurement (`okv-bench --floor`: a streaming read
of a 2 GiB buffer on the same threads, through the engine's worker pool; the median of 5 passes).
The table quotes the median of each program's repetitions, the best floor seen for the row, and
decode's share of that floor:

    share = weight bytes read per decoded token x decode tok/s / floor bytes/s

where the bytes per token are every tensor's bytes except the token embedding's (a decoded
token reads one row of it), unless the embedding is tied as the output matrix (no
`output.weight`: the 1.7B shape), when it is read whole and counts. The rule is the same for
both programs; KV reads (a few MB at these depths) are left out. Peak resident memory of
`okv-bench` (its own VmHWM) is given against the file size.

Files are cached in `--work` (about 22 GB for all six; peak while writing the 8B shape is the
same, the source doubling as the Q8_0 file). `llama-quantize` and `llama-bench` come from a
llama.cpp built outside the repository (see bench_engine.py), passed by `--llama-bin DIR`:

    python benches/real_size.py --llama-bin DIR --work DIR [--models 1.7b,8b]
        [--types Q4_K_M,Q4_0,Q8_0] [--threads 2] [--pp 512] [--tg 64] [--reps 2]
        [--okv-bench PATH] [--okv-bench-b PATH] [--floor-mib 2048]

`--okv-bench-b` adds a second engine build run on the same files in the same alternation (an A/B
of two builds: its own columns and its ratio to the first). `--prepare` only writes the files.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import real_shapes

ROOT = Path(__file__).resolve().parent.parent
TYPES = ("Q4_K_M", "Q4_0", "Q8_0")


def okv_bench_exe() -> str:
    subprocess.run(
        ["cargo", "build", "--release", "-q", "-p", "offgraph-kv-engine", "--bin", "okv-bench"],
        cwd=ROOT,
        check=True,
    )
    target = os.environ.get("CARGO_TARGET_DIR", str(ROOT / "target"))
    return str(Path(target) / "release" / "okv-bench")


def run(cmd: list[str]) -> str:
    p = subprocess.run(cmd, capture_output=True)
    if p.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed ({p.returncode}): {p.stderr.decode()[-2000:]}")
    return p.stdout.decode()


def model_file(work: Path, model: str, qtype: str, llama_bin: Path) -> Path:
    """The cached file of `model` in `qtype`, written (and quantized) when missing."""
    shape = real_shapes.SHAPES[model]
    src = work / f"{model}-Q8_0.gguf"
    if not src.exists():
        t0 = time.time()
        real_shapes.write_q8_0(shape, src)
        print(f"# wrote {src} in {time.time() - t0:.0f} s", file=sys.stderr)
    if qtype == "Q8_0":
        return src
    dst = work / f"{model}-{qtype}.gguf"
    if not dst.exists():
        t0 = time.time()
        tmp = dst.with_suffix(".part")
        cmd = [str(llama_bin / "llama-quantize"), "--allow-requantize", str(src), str(tmp), qtype]
        subprocess.run(cmd + [str(os.cpu_count() or 1)], check=True, capture_output=True)
        os.replace(tmp, dst)
        print(f"# quantized {dst} in {time.time() - t0:.0f} s", file=sys.stderr)
    return dst


def okv_run(exe: str, path: Path, a) -> tuple[dict[str, float], int]:
    """Rates and the process's own peak resident KiB (its VmHWM)."""
    cmd = [exe, str(path), "--threads", str(a.threads), "--pp", str(a.pp), "--tg", str(a.tg)]
    cmd += ["--reps", "1", "--kv-dtype", "float16"]
    rates, rss = {}, 0
    for line in run(cmd).splitlines():
        row = json.loads(line)
        if "test" in row:
            rates[row["test"]] = row["median"]
        else:
            rss = row["peak_rss_kib"]
    return rates, rss


def llama_run(llama_bin: Path, path: Path, a) -> tuple[dict[str, float], int]:
    cmd = [str(llama_bin / "llama-bench"), "-m", str(path), "-t", str(a.threads)]
    cmd += ["-p", str(a.pp), "-n", str(a.tg), "-r", "1", "-ctk", "f16", "-ctv", "f16"]
    rates = {}
    for row in json.loads(run(cmd + ["-o", "json"])):
        test = f"pp{row['n_prompt']}" if row["n_gen"] == 0 else f"tg{row['n_gen']}"
        rates[test] = statistics.median(float(x) for x in row["samples_ts"])
    return rates, 0


def floor_run(exe: str, a, threads: int) -> float:
    """GB/s of the streaming read on `threads` threads (the median of 5 passes)."""
    cmd = [exe, "--floor", str(a.floor_mib), "--threads", str(threads), "--reps", "1"]
    return float(json.loads(run(cmd).splitlines()[-1])["best"])


def bench_row(path: Path, a, progs: dict) -> dict:
    """Every program's rates on one file, alternating, with the floor before each run."""
    rates: dict[str, dict[str, list[float]]] = {p: {} for p in progs}
    rss: dict[str, int] = {}
    floors = []
    order = list(progs)
    for rep in range(a.reps):
        for name in order if rep % 2 == 0 else order[::-1]:
            floors.append(floor_run(a.floor_exe, a, a.threads))
            got, r = progs[name](path)
            rss[name] = max(rss.get(name, 0), r)
            for test, v in got.items():
                rates[name].setdefault(test, []).append(v)
            print(f"#   {path.name} rep {rep} {name}: {got}", file=sys.stderr)
    med = {p: {t: statistics.median(v) for t, v in rs.items()} for p, rs in rates.items()}
    return {"rates": med, "rss_kib": rss, "floor": max(floors), "floors": floors}


def table(rows: list[dict], a, with_b: bool) -> str:
    pp, tg = f"pp{a.pp}", f"tg{a.tg}"
    head = (
        f"| model | type | file GB | prefill {pp} okv / llama.cpp (tok/s) | ratio "
        f"| decode {tg} okv / llama.cpp (tok/s) | ratio | floor GB/s "
        "| decode's share of the floor okv / llama.cpp | okv peak RSS GB (x file) |"
    )
    sep = "|---|---|---|---|---|---|---|---|---|---|"
    if with_b:
        head += f" B prefill {pp} | B/A | B decode {tg} | B/A | B share |"
        sep += "---|---|---|---|---|"
    out = [head, sep]
    for r in rows:
        okv, lc = r["rates"]["okv"], r["rates"]["llama.cpp"]
        gb = r["file_bytes"] / 1e9

        def share(rate: float, row: dict = r) -> str:
            return f"{row['bytes_per_token'] * rate / (row['floor'] * 1e9):.0%}"

        rss = r["rss_kib"]["okv"] * 1024 / 1e9
        line = (
            f"| {r['model']} | {r['type']} | {gb:.2f} "
            f"| {okv[pp]:.1f} / {lc[pp]:.1f} | {okv[pp] / lc[pp]:.2f}x "
            f"| {okv[tg]:.1f} / {lc[tg]:.1f} | {okv[tg] / lc[tg]:.2f}x | {r['floor']:.1f} "
            f"| {share(okv[tg])} / {share(lc[tg])} | {rss:.2f} ({rss / gb:.2f}x) |"
        )
        if with_b:
            b = r["rates"]["okv-b"]
            line += (
                f" {b[pp]:.1f} | {b[pp] / okv[pp]:.2f}x | {b[tg]:.1f} | {b[tg] / okv[tg]:.2f}x "
                f"| {share(b[tg])} |"
            )
        out.append(line)
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-bin", required=True, type=Path, help="dir of llama-quantize/-bench")
    ap.add_argument("--work", required=True, type=Path, help="dir caching the model files")
    ap.add_argument("--models", default="1.7b,8b", help=f"of {','.join(real_shapes.SHAPES)}")
    ap.add_argument("--types", default=",".join(TYPES), help=f"of {','.join(TYPES)}")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=64)
    ap.add_argument("--reps", type=int, default=2, help="runs of each program per file")
    ap.add_argument("--floor-mib", type=int, default=2048)
    ap.add_argument("--okv-bench", help="the engine's okv-bench (default: built from this tree)")
    ap.add_argument("--okv-bench-b", help="a second engine build, run beside the first")
    ap.add_argument("--prepare", action="store_true", help="only write the model files")
    a = ap.parse_args(argv)
    models = a.models.split(",")
    types = a.types.split(",")
    bad = [m for m in models if m not in real_shapes.SHAPES] + [t for t in types if t not in TYPES]
    if bad or a.threads < 1 or a.reps < 1 or a.pp < 1 or a.tg < 1:
        ap.error(f"unknown models/types {bad} or a count below 1")
    a.work.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    files = {(m, t): model_file(a.work, m, t, a.llama_bin) for m in models for t in types}
    if a.prepare:
        return 0
    # The floor comes from the first engine build (one without --floor fails here, clearly).
    okv = a.floor_exe = a.okv_bench or okv_bench_exe()
    progs = {
        "okv": lambda p: okv_run(okv, p, a),
        "llama.cpp": lambda p: llama_run(a.llama_bin, p, a),
    }
    if a.okv_bench_b:
        progs["okv-b"] = lambda p: okv_run(a.okv_bench_b, p, a)
    floor1 = floor_run(a.floor_exe, a, 1)
    rows = []
    for (m, t), path in files.items():
        row = bench_row(path, a, progs)
        row.update(
            model=real_shapes.SHAPES[m].name,
            type=t,
            file_bytes=path.stat().st_size,
            bytes_per_token=real_shapes.bytes_per_token(path),
        )
        rows.append(row)
        print(f"# {json.dumps(row)}", file=sys.stderr)
    print(table(rows, a, bool(a.okv_bench_b)))
    print(
        f"\n{a.threads} threads, f16 KV, runs of each program per file: {a.reps} (alternating); "
        f"floor: {a.floor_mib} MiB streaming read, {floor1:.1f} GB/s on 1 thread; "
        f"wall time {(time.time() - t_start) / 60:.1f} min."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
