"""``benches/bench_hf.py`` on a tiny context: every cache variant runs and the files agree."""

import json

from bench_helpers import load_bench


def test_bfloat16_run_writes_every_variant(tmp_path):
    bench = load_bench("bench_hf")
    out = tmp_path / "hf"
    bench.main(["--dtype", "bfloat16", "--contexts", "40", "--steps", "3", "--out", str(out)])
    doc = json.loads(out.with_suffix(".json").read_text())
    assert doc["meta"]["dtype"] == "bfloat16" and doc["meta"]["steps"] == 3
    run = doc["contexts"]["40"]
    names = [n for n, _, _ in bench.variants("bfloat16")]
    assert len(names) == 6 and list(run["median_ms"]) == names
    for n in names:
        assert len(run["samples_ms"][n]) == 3 and len(run["warmup_ms"][n]) == 2
        assert run["median_ms"][n] > 0
    # 4 layers x K+V x 8 heads x 128: every cache holds the 40 + 2 + 3 tokens' rows in bfloat16
    # (OffgraphCache's nbytes counts the rows written), float32 pools twice the bytes.
    held = run["held_bytes"]
    assert held[bench.DYNAMIC] == 4 * 2 * 8 * 45 * 128 * 2
    assert held[bench.OG_ATTN] == held[bench.OG_SDPA] == held[bench.DYNAMIC]
    assert held[bench.F32_ATTN] == 2 * held[bench.OG_ATTN]
    table = out.with_suffix(".md").read_text()
    assert "bfloat16 model" in table and all(n in table for n in names)
    assert "| 40 | " in table


def test_float32_run_has_no_float32_pool_variants():
    names = [n for n, _, _ in load_bench("bench_hf").variants("float32")]
    assert names == [
        "DynamicCache (sdpa)",
        "StaticCache (sdpa)",
        "OffgraphCache (sdpa)",
        "OffgraphCache (offgraph attn)",
    ]
