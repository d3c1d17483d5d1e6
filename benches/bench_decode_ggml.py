"""Decode attention against its byte floor, with ggml's CPU flash attention
beside it: one invocation runs `cargo bench --bench decode_floor` (offgraph-kv,
every dtype, ctx 2048/8192, 1/2 threads, cold/warm) and the same grid through
`benches/ggml/flash_attn.c` (ggml_flash_attn_ext on a persistent ggml
threadpool, its own same-run floor), then prints one table: each side over
its floor (medians of interleaved rounds) and offgraph-kv over ggml.

ggml is not vendored. Build its CPU library from the llama.cpp sources in the
llama-cpp-python sdist, outside the repository:

    pip download --no-binary :all: --no-deps llama-cpp-python   # the sdist
    tar xzf llama_cpp_python-*.tar.gz
    cmake -S llama_cpp_python-*/vendor/llama.cpp/ggml -B ggml-build \\
        -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_OPENMP=OFF \\
        -DBUILD_SHARED_LIBS=ON
    cmake --build ggml-build --target ggml-cpu -j

and pass `--ggml-src llama_cpp_python-*/vendor/llama.cpp/ggml --ggml-build
ggml-build`. Without them the ggml columns are skipped with a message.
"""

import argparse
import glob
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def rows(text):
    """`| ctx | threads | cache | dtype | ms | floor ms | ratio ...` rows by key."""
    out = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 7 and re.fullmatch(r"\d+", cells[0]):
            out[tuple(cells[:4])] = [float(c) for c in cells[4:]]
    return out


def build_ggml(src, build):
    libdir = None
    for cand in glob.glob(str(Path(build) / "**" / "libggml-cpu.so"), recursive=True):
        libdir = str(Path(cand).parent)
    base = glob.glob(str(Path(build) / "**" / "libggml-base.so"), recursive=True)
    if libdir is None or not base:
        return None, f"no libggml-cpu.so / libggml-base.so under {build}"
    basedir = str(Path(base[0]).parent)
    exe = Path(build) / "okv_flash_attn"
    cmd = [
        os.environ.get("CC", "cc"),
        "-O2",
        "-march=native",
        str(ROOT / "benches" / "ggml" / "flash_attn.c"),
        f"-I{Path(src) / 'include'}",
        f"-L{libdir}",
        f"-L{basedir}",
        "-lggml-cpu",
        "-lggml-base",
        "-lpthread",
        f"-Wl,-rpath,{libdir}:{basedir}",
        "-o",
        str(exe),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return None, f"building the ggml harness failed:\n{r.stderr}"
    return exe, None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ggml-src", help="ggml's source directory (holds include/ggml.h)")
    ap.add_argument("--ggml-build", help="ggml's cmake build directory")
    ap.add_argument("--rounds", type=int, default=41)
    ap.add_argument("--out", help="also write the table (markdown) here")
    a = ap.parse_args()

    env = dict(os.environ, DECODE_BENCH_ROUNDS=str(a.rounds))
    r = subprocess.run(
        ["cargo", "bench", "--bench", "decode_floor"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    header = [line for line in r.stdout.splitlines() if line.startswith("floor:")]
    ours = rows(r.stdout)
    theirs = {}
    if a.ggml_src and a.ggml_build:
        exe, err = build_ggml(a.ggml_src, a.ggml_build)
        if exe is None:
            print(f"ggml skipped: {err}", file=sys.stderr)
        else:
            g = subprocess.run(
                [str(exe), str(a.rounds)], env=env, capture_output=True, text=True, check=True
            )
            theirs = rows(g.stdout)
    else:
        print(
            "ggml skipped: pass --ggml-src and --ggml-build"
            " (this script's docstring says how to build ggml)",
            file=sys.stderr,
        )

    lines = header + [
        "",
        "| ctx | threads | cache | dtype | offgraph-kv ms | floor ms | offgraph-kv / floor"
        " | GFLOP/s | / FMA peak | ggml ms | ggml / floor | offgraph-kv / ggml |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, (ms, fl, ratio, gf, peak) in ours.items():
        g = theirs.get(key)
        gcols = f"{g[0]:.3f} | {g[2]:.2f} | {ms / g[0]:.2f}" if g else "- | - | -"
        ours_cols = f"{ms:.3f} | {fl:.3f} | {ratio:.2f} | {gf:.1f} | {peak:.2f}"
        lines.append(f"| {' | '.join(key)} | {ours_cols} | {gcols} |")
    text = "\n".join(lines)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
