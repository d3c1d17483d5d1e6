"""The serving benchmark's quick form (CI): a small chat load against ``offgraph-kv serve``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

BENCHES = Path(__file__).resolve().parents[3] / "benches"


def test_bench_serve_quick(tmp_path, capsys):
    sys.path.insert(0, str(BENCHES))
    try:
        import bench_serve
    finally:
        sys.path.remove(str(BENCHES))
    out = tmp_path / "serve.json"
    assert bench_serve.main(["--quick", "--json", str(out)]) == 0
    res = json.loads(out.read_text())["results"]["offgraph-kv"]
    assert res["tokens"] > 0 and res["tok_per_s"] > 0
    assert 0 < res["ttft_p50_s"] <= res["ttft_p99_s"]
    assert "| offgraph-kv |" in capsys.readouterr().out
