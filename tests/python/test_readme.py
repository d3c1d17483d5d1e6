"""The README's Python examples run as written."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_python_blocks_run(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) >= 2
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)
    out = capsys.readouterr().out
    assert "100" in out
    # The transformers example ran: 4 prompt + 20 new tokens, the last not yet fed back.
    assert namespace["cache"].get_seq_length() == 23


def test_readme_starts_with_the_two_commands():
    lines = README.read_text().splitlines()
    head = "\n".join(lines[:6])
    assert "./scripts/demo.sh" in head and "./scripts/test.sh" in head
    ci = (README.parent / ".ci" / "run").read_text()
    assert "./scripts/test.sh" in ci
