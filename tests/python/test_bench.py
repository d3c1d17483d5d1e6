"""``offgraph-kv bench --quick`` writes a table and plots (the CI-sized run)."""

from offgraph_kv.tools.cli import main


def test_bench_quick_writes_table_and_plots(tmp_path, capsys):
    assert main(["bench", "--quick", "--out", str(tmp_path)]) == 0
    table = (tmp_path / "bench.md").read_text()
    assert "DynamicCache" in table and "offgraph-kv native" in table and "read floor" in table
    for name in ("update.png", "attention.png"):
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    assert "wrote" in capsys.readouterr().out
