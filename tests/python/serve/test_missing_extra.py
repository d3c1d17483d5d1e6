"""Without torch or transformers (the ``[torch]`` extra), the torch paths say which extra to
install and exit 2: no ImportError traceback. The packages are hidden in a subprocess by a
``sys.modules`` entry of ``None``, which makes their import fail as if they were absent."""

from __future__ import annotations

import subprocess
import sys

import pytest
from offgraph_kv.serve.loading import MissingExtraError, load, require_torch

HIDE = "import sys\nfor m in {mods!r}:\n    sys.modules[m] = None\n"
RUN = "from offgraph_kv.tools.cli import main\nsys.exit(main({argv!r}))\n"
# The serve extra's imports (pyproject.toml) and pydantic, which fastapi brings.
SERVE_EXTRA = ("fastapi", "uvicorn", "prometheus_client", "jinja2", "llguidance", "pydantic")


def _cli(argv: list[str], hidden: tuple[str, ...]) -> subprocess.CompletedProcess:
    code = HIDE.format(mods=list(hidden)) + RUN.format(argv=argv)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


@pytest.fixture
def hf_dir(tmp_path):
    """A transformers directory: it runs on the torch engine by default."""
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    return str(tmp_path)


@pytest.mark.parametrize("hidden", [("torch",), ("transformers",), ("torch", "transformers")])
def test_serving_a_directory_without_the_torch_extra_names_it(hf_dir, hidden):
    proc = _cli(["serve", hf_dir, "--port", "0"], hidden)
    assert proc.returncode == 2, proc.stderr
    assert "pip install 'offgraph-kv[torch]'" in proc.stderr
    for m in hidden:
        assert m in proc.stderr
    assert "Traceback" not in proc.stderr


def test_engine_torch_on_a_gguf_without_the_extra_names_it():
    proc = _cli(["serve", "smollm2-135m", "--engine", "torch", "--port", "0"], ("torch",))
    assert proc.returncode == 2, proc.stderr
    assert "'smollm2-135m' with --engine torch" in proc.stderr
    assert "pip install 'offgraph-kv[torch]'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_serve_demo_without_the_extra_names_it():
    proc = _cli(["serve-demo", "--requests", "2", "--new", "2", "--no-progress"], ("torch",))
    assert proc.returncode == 2, proc.stderr
    assert "serve-demo" in proc.stderr and "pip install 'offgraph-kv[torch]'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_native_engine_needs_no_extra():
    """The same hiding leaves the native path alone: the model opens and tokenizes a chat
    without the torch extra and without the serve extra but jinja2, which renders the GGUF's
    chat template (``scripts/demo.sh`` installs neither extra; the check above is about the
    torch path, not a broken import of everything)."""
    hidden = ["torch", "transformers", *(m for m in SERVE_EXTRA if m != "jinja2")]
    code = HIDE.format(mods=hidden) + (
        "from offgraph_kv.serve.loading import load_native\n"
        "m, tok, name = load_native('smollm2-135m', threads=1)\n"
        "print(name, len(tok.chat_ids([{'role': 'user', 'content': 'Hi'}])) > 2)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["smollm2-135m", "True"]


def test_load_raises_the_typed_error(monkeypatch, hf_dir):
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(MissingExtraError) as e:
        load(hf_dir)
    assert e.value.extra == "torch" and isinstance(e.value, ImportError)
    assert "transformers" in str(e.value) and "offgraph-kv[torch]" in str(e.value)
    with pytest.raises(MissingExtraError):
        require_torch("this")
