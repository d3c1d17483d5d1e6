"""``benches/plot_precision.py`` reads the precision bench's criterion medians and plots them."""

import json

import pytest
from bench_helpers import load_bench


@pytest.fixture(scope="module")
def plot_precision():
    return load_bench("plot_precision")


def _estimate(root, group, name, ctx, ns):
    d = root / group / name / str(ctx) / "new"
    d.mkdir(parents=True)
    (d / "estimates.json").write_text(json.dumps({"median": {"point_estimate": ns}}))


def test_reads_the_cases_that_exist(plot_precision, tmp_path):
    # 1 thread at 8192 complete; 2 threads at 2048 without float32 (left out); nothing else.
    for i, name in enumerate(["float32", "float16", "bfloat16", "q8_0", "floor_float32"]):
        _estimate(tmp_path, "precision_threads1", name, 8192, (i + 1) * 1.5e6)
    _estimate(tmp_path, "precision_threads2", "float16", 2048, 1e6)
    (tmp_path / "precision_threads1" / "q8_0" / "2048" / "new").mkdir(parents=True)
    got = plot_precision.read_medians(tmp_path)
    assert got == {
        (1, 8192): {
            "float32": 1.5,
            "float16": 3.0,
            "bfloat16": 4.5,
            "q8_0": 6.0,
            "floor_float32": 7.5,
        }
    }


def test_bytes_per_token_follow_the_formats(plot_precision):
    # Per value: 4 bytes float32, 2 for the 16-bit types, 34 per block of 32 for q8_0.
    per_value = {"float32": 4.0, "float16": 2.0, "bfloat16": 2.0, "q8_0": 34 / 32}
    got = plot_precision.bytes_per_token()
    for shape, (layers, heads, head_dim) in plot_precision.SHAPES.items():
        for dtype, b in per_value.items():
            assert got[shape][dtype] == 2 * layers * heads * head_dim * b
    assert got["Llama-3-8B"]["float32"] == 262144


def test_main_writes_a_png_and_refuses_an_empty_tree(plot_precision, tmp_path, capsys):
    crit = tmp_path / "criterion"
    for name in ["float32", "bfloat16", "floor_bfloat16"]:
        _estimate(crit, "precision_threads2", name, 2048, 2e6)
    out = tmp_path / "p.png"
    assert plot_precision.main(["--criterion", str(crit), "--out", str(out)]) == 0
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    assert "2 thread(s), ctx 2048: float32 2.00 ms, bfloat16 2.00 ms" in capsys.readouterr().out

    empty, out2 = tmp_path / "none", tmp_path / "q.png"
    assert plot_precision.main(["--criterion", str(empty), "--out", str(out2)]) == 1
    assert not out2.exists()
    assert "no precision bench results" in capsys.readouterr().err
