"""``pip install 'offgraph-kv[serve]'`` is enough to serve a GGUF: the wheel built from this tree,
installed with the serve extra only into a fresh venv (no torch, no transformers), serves
SmolLM2's GGUF and answers a chat completion from the OpenAI client, and refuses the torch engine
naming the extra to install. Installs from PyPI."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from offgraph_kv.serve.loading import resolve

from .serve_helpers import free_port

ROOT = Path(__file__).resolve().parents[3]


def _run(cmd: list, timeout: float, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    assert proc.returncode == 0, f"{cmd}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def test_a_serve_only_venv_serves_a_gguf(tmp_path):
    wheels = tmp_path / "wheels"
    maturin = Path(sys.executable).parent / "maturin"
    # Release, as `maturin develop --release` builds: cargo's target dir serves both. A plain
    # linux wheel: it links the system's XNNPACK, which a manylinux repair would bundle.
    build = [str(maturin), "build", "--release", "--compatibility", "linux", "-o", str(wheels)]
    _run(build, 1800, cwd=ROOT)
    (wheel,) = wheels.glob("offgraph_kv-*.whl")

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], 300)
    py, okv = venv / "bin" / "python", venv / "bin" / "offgraph-kv"
    pip = [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    _run([*pip, f"{wheel}[serve]"], 900)
    for heavy in ("torch", "transformers"):
        proc = subprocess.run([str(py), "-c", f"import {heavy}"], capture_output=True, timeout=60)
        assert proc.returncode != 0, f"{heavy} is installed by the serve extra"

    where, gguf, _ = resolve("smollm2-135m")
    assert gguf is not None
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # The torch engine is not there: the server says which extra brings it, and exits 2.
    refused = subprocess.run(
        [str(okv), "serve", os.path.join(where, gguf), "--engine", "torch", "--port", str(port)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=env,
    )
    assert refused.returncode == 2, refused.stderr
    assert "pip install 'offgraph-kv[torch]'" in refused.stderr
    assert "Traceback" not in refused.stderr
    log = tmp_path / "serve.log"
    with open(log, "w") as out:
        server = subprocess.Popen(
            [str(okv), "serve", os.path.join(where, gguf), "--port", str(port)]
            + ["--threads", "2", "--log-level", "warning"],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,  # not the source tree: the venv's installed package runs
            env=env,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, f"server exited:\n{log.read_text()}"
            try:
                urllib.request.urlopen(url + "/health", timeout=5).read()
                break
            except (urllib.error.URLError, OSError):
                assert time.monotonic() < deadline, f"server did not start:\n{log.read_text()}"
                time.sleep(0.3)
        import openai

        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        reply = client.chat.completions.create(
            model=gguf,
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_tokens=16,
            temperature=0,
        )
        text = reply.choices[0].message.content
        assert text and sum(c.isalpha() for c in text) >= 2, text
        assert reply.usage.completion_tokens >= 1
    finally:
        server.send_signal(signal.SIGTERM)
        rc = server.wait(120)
    assert rc == 0, log.read_text()
    assert "Traceback" not in log.read_text()
