"""The Rust runner (``examples/runner/``) at a tiny size: it builds, runs the
demo's workload through the crate's API, and its output matches the float64
reference of the same workload and the Python demo's tokens; bad flags get a
usage error; the core crate's dependency tree has no pyo3."""

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from offgraph_kv.tools.demo import run_demo
from offgraph_kv.tools.demo_model import (
    DemoConfig,
    fork_token,
    make_weights,
    prompt_prefix,
    reference_hidden,
    rms_norm,
)

ROOT = Path(__file__).resolve().parents[2]
# The first build compiles the crate (and XNNPACK bindings) in release mode.
BUILD_TIMEOUT = 1800


def cargo(*args: str, timeout: float = BUILD_TIMEOUT) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["cargo", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


def runner(*flags: str) -> subprocess.CompletedProcess:
    return cargo("run", "--release", "--quiet", "--example", "runner", "--", *flags)


def cfg_flags(cfg: DemoConfig) -> list[str]:
    return [
        *("--layers", str(cfg.n_layers), "--window", str(cfg.window)),
        *("--hidden", str(cfg.hidden), "--q-heads", str(cfg.n_q_heads)),
        *("--kv-heads", str(cfg.n_kv_heads), "--head-dim", str(cfg.head_dim)),
        *("--vocab", str(cfg.vocab), "--seed", str(cfg.seed)),
    ]


# The demo test's tiny model; one whose greedy tokens change mid-decode (hidden
# 8, a larger vocabulary, a nonzero seed, 7 layers so a ring layer follows the
# flat one, prefill chunks that do not divide the prefix).
CASES = {
    "tiny": (
        DemoConfig(
            n_layers=6, window=8, hidden=32, n_q_heads=4, n_kv_heads=2, head_dim=8, vocab=64
        ),
        dict(n_seqs=3, prefix=20, decode=6, chunk=8),
        [],
    ),
    "varied": (
        DemoConfig(
            n_layers=7, window=6, hidden=8, n_q_heads=4, n_kv_heads=2, head_dim=8, vocab=256, seed=3
        ),
        dict(n_seqs=4, prefix=21, decode=8, chunk=5),
        ["--threads", "2"],
    ),
    # A negative seed: Python's `& 0xFFFF_FFFF_FFFF_FFFF` is Rust's wrapping u64.
    "negative-seed": (
        DemoConfig(
            n_layers=6,
            window=4,
            hidden=16,
            n_q_heads=2,
            n_kv_heads=1,
            head_dim=8,
            vocab=128,
            seed=-7,
        ),
        dict(n_seqs=2, prefix=9, decode=4, chunk=4),
        ["--backend", "native", "--threads", "1"],
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_runner_matches_the_reference_and_the_demo(case, tmp_path):
    cfg, run, extra = CASES[case]
    n_seqs, prefix, decode = run["n_seqs"], run["prefix"], run["decode"]
    dump = tmp_path / "runner.json"
    proc = runner(
        *("--seqs", str(n_seqs), "--prefix", str(prefix), "--decode", str(decode)),
        *("--chunk", str(run["chunk"])),
        *cfg_flags(cfg),
        *extra,
        *("--dump", str(dump)),
    )
    assert proc.returncode == 0, proc.stderr
    assert "tokens/s" in proc.stdout and "cells shared by forks" in proc.stdout
    out = json.loads(dump.read_text())
    generated, hidden = out["generated"], np.array(out["hidden"], dtype=np.float64)
    assert len(generated) == n_seqs and all(len(g) == decode for g in generated)
    assert hidden.shape == (n_seqs, cfg.hidden)
    assert out["fork_tokens"] == [fork_token(cfg, i) for i in range(n_seqs)]
    assert out["shared_cells"] == prefix

    # Each sequence's input tokens: prefix + fork token + generated except the last.
    prompt = [int(t) for t in prompt_prefix(cfg, prefix)]
    inputs = [prompt + [fork_token(cfg, i)] + generated[i][:-1] for i in range(n_seqs)]

    # Same tokens as the Python demo for the same flags.
    res = run_demo(cfg, check_seqs=0, progress=False, **run)
    assert res.tokens == inputs
    # ... and the same cache figures (the same cache, driven the same way).
    for key in (
        "kv_bytes",
        "kv_live_bytes",
        "unshared_bytes",
        "shared_cells",
        "peak_slots_flat",
        "peak_slots_ring",
    ):
        assert out[key] == getattr(res, key), key

    # The final hidden state of every sequence against the float64 reference,
    # and every generated token the greedy choice of the reference (up to ties).
    w64 = make_weights(cfg)
    for i in range(n_seqs):
        ref = reference_hidden(cfg, w64, np.array(inputs[i]))
        scale = max(1.0, float(np.abs(ref[-1]).max()))
        err = float(np.abs(hidden[i] - ref[-1]).max()) / scale
        assert err <= 1e-4, f"sequence {i}: relative max error {err:.2e}"
        logits = rms_norm(ref[prefix:]) @ w64.out
        for m, tok in enumerate(generated[i]):
            best = int(np.argmax(logits[m]))
            gap = logits[m, best] - logits[m, tok]
            assert gap <= 1e-4 * max(1.0, float(np.abs(logits[m]).max())), (
                f"sequence {i} step {m}: runner chose {tok}, reference {best} (gap {gap:.2e})"
            )


@pytest.mark.parametrize(
    "argv, msg",
    [
        (["--seqs", "0"], "positive integer"),
        (["--decode", "x"], "positive integer"),
        (["--q-heads", "3", "--kv-heads", "2"], "multiple"),
        (["--window", "50", "--prefix", "10", "--decode", "4"], "at most"),
        (["--backend", "gpu"], "backend"),
        (["--seqs"], "expected one argument"),
        (["--bogus", "1"], "unrecognized argument"),
    ],
)
def test_runner_bad_flags_get_a_usage_error(argv, msg):
    proc = runner(*argv)
    assert proc.returncode == 2, proc.stderr
    assert "usage: runner" in proc.stderr and msg in proc.stderr
    assert proc.stdout == ""


def test_core_dependency_tree_has_no_pyo3():
    # Every edge kind of the core crate, dev included (the example links dev-deps).
    tree = cargo("tree", "-e", "normal,dev,build", "-p", "offgraph-kv", "--prefix", "none")
    assert tree.returncode == 0, tree.stderr
    crates = {line.split()[0] for line in tree.stdout.splitlines() if line.strip()}
    assert "offgraph-kv" in crates and "xnnpack-sys" in crates
    assert not {c for c in crates if "pyo3" in c or c == "numpy"}, sorted(crates)
    # The spelling: inverting on pyo3 from the core finds nothing ...
    inv = cargo("tree", "-e", "normal", "-i", "pyo3", "-p", "offgraph-kv")
    assert inv.returncode != 0 or inv.stdout.strip() == "", inv.stdout
    assert "offgraph-kv v" not in inv.stdout
    # ... while the same query does find it from the bindings (the check can fail).
    bindings = cargo("tree", "-e", "normal", "-i", "pyo3", "-p", "offgraph-kv-python")
    assert bindings.returncode == 0 and "offgraph-kv-python" in bindings.stdout
