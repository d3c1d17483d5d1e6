"""``benches/bench_pools.py`` in its quick form: every part runs, and the memory figures (not the
timings) meet the pools' targets on a small shape."""

import json

from bench_helpers import load_bench


def test_quick_run_meets_the_memory_targets(tmp_path):
    bench = load_bench("bench_pools")
    out = tmp_path / "pools"
    res = bench.main(["--quick", "--out", str(out)])
    doc = json.loads(out.with_suffix(".json").read_text())
    assert set(doc["decode"]) == {"float16 reserve", "float16 grow", "q8_0 reserve", "q8_0 grow"}
    s = res["shape"]
    slack = s["layers"] * s["heads"] * 2 * bench.PAGE
    for dtype in ["float16", "q8_0"]:
        r = res["decode"][f"{dtype} reserve"]
        assert r["pool_memory"] == "reserve"
        for mark in r["marks"].values():
            assert mark["nbytes"] == mark["rows"]
            # the interpreter's own noise: a few MiB on top of the target's slack
            assert mark["resident"] <= 1.05 * mark["rows"] + slack + (4 << 20)
        assert r["resident_after_clear"] <= 0.01 * r["peak_resident"] + (4 << 20)
        assert res["decode"][f"{dtype} grow"]["pool_memory"] == "grow"
        cells = res["cells"][dtype]
        assert cells["resident_after_trim"] <= 1.1 * cells["survivor_rows"] + (4 << 20)
    assert set(res["hf"]) == {"DynamicCache", "OffgraphCache"}
    table = out.with_suffix(".md").read_text()
    assert "worst / median" in table and "after trim" in table
