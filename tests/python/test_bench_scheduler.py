"""The scheduler benchmark's quick form, and what it stands for: a step's prefix lookups do not
grow with the number of held sequences."""

from __future__ import annotations

import offgraph_kv.prefix_index as prefix_index
from bench_helpers import load_bench


def test_quick_form_prints_the_table(capsys):
    bench = load_bench("bench_scheduler")
    assert bench.main(["--held", "10,200", "--waiting", "20", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "| 10 |" in out and "| 200 |" in out and "ratio to held 10" in out


def test_prefix_comparisons_per_run_do_not_grow_with_held_sequences(monkeypatch):
    """Token-slice comparisons made while 20 waiting prompts are scheduled and run: with 200
    held sequences about as many as with 10 (before the index: one per held sequence per
    lookup)."""
    bench = load_bench("bench_scheduler")
    calls = {"n": 0}
    real = prefix_index.common_prefix

    def counting(a, b):
        calls["n"] += 1
        return real(a, b)

    counts = {}
    for held in (10, 200):
        monkeypatch.setattr(prefix_index, "common_prefix", counting)
        bench.run_one(held, 20, 32, 32, 16, 8, 64, on_measure=lambda: calls.update(n=0))
        counts[held] = calls["n"]
    # A few more tree nodes on the way with 200 held (distinct tokens that happen to collide).
    assert 0 < counts[200] <= 1.5 * counts[10], counts
