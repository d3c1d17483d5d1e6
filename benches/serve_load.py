"""What the serving benchmarks share: the servers (``offgraph-kv serve`` on either engine,
llama.cpp's ``llama-server``, ``transformers serve``) as processes on free loopback ports, their
resident memory, and a streamed chat request timed through the official ``openai`` client.

Every server is started, measured and stopped in turn by one script run, on the same GGUF and
the same threads, so figures are compared side by side (``bench_serve.py``, ``bench_agents.py``).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_bytes(pid: int) -> tuple[int, int]:
    """``(resident now, peak resident)`` of process ``pid`` (VmRSS, VmHWM), in bytes."""
    now = peak = 0
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    now = int(line.split()[1]) * 1024
                elif line.startswith("VmHWM:"):
                    peak = int(line.split()[1]) * 1024
    except OSError:
        pass
    return now, peak


class Proc:
    """A server process, ready once ``path`` answers 200; its resident memory is sampled every
    0.2 s while it runs (``peak_rss``: the highest sample, or VmHWM where larger)."""

    def __init__(self, cmd: list[str], port: int, path: str, log: Path, timeout: float = 1800):
        self.cmd = cmd
        self.log = open(log, "w")  # noqa: SIM115 (closed in stop)
        self.log_path = log
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{port}"
        self.peak_rss = 0
        self._stop = threading.Event()
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{cmd[:4]} exited {self.proc.returncode}; see {log}")
            try:
                with urllib.request.urlopen(self.url + path, timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{cmd[:4]} did not start; see {log}")
            time.sleep(0.5)
        self.start_rss = rss_bytes(self.proc.pid)[0]
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.2):
            now, peak = rss_bytes(self.proc.pid)
            self.peak_rss = max(self.peak_rss, now, peak)

    def rss(self) -> int:
        return rss_bytes(self.proc.pid)[0]

    def stop(self) -> int:
        self._stop.set()
        if self.proc.poll() is None:
            now, peak = rss_bytes(self.proc.pid)
            self.peak_rss = max(self.peak_rss, now, peak)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


def gguf_path(model: str) -> str:
    """The GGUF file of a known model name (its PyPI package) or a path."""
    from offgraph_kv.serve.loading import resolve

    where, gguf, _ = resolve(model)
    if gguf is None:
        raise SystemExit(f"{model}: not a GGUF model")
    return os.path.join(where, gguf)


def okv_server(
    model: str, engine: str, threads: int, n_cells: int, log: Path, extra: list[str] = ()
) -> Proc:
    """``offgraph-kv serve MODEL --engine ENGINE`` on a free port."""
    port = free_port()
    cmd = [sys.executable, "-m", "offgraph_kv", "serve", model, "--port", str(port)]
    cmd += ["--engine", engine, "--threads", str(threads), "--n-cells", str(n_cells)]
    cmd += ["--log-level", "warning", *extra]
    return Proc(cmd, port, "/health", log)


def llama_server(
    exe: str, model: str, threads: int, ctx: int, slots: int, log: Path, extra: list[str] = ()
) -> Proc:
    """llama.cpp's ``llama-server`` on the same GGUF, ``slots`` parallel sequences with
    continuous batching, ``ctx`` cells in all, and its host prompt cache at its default size."""
    port = free_port()
    cmd = [exe, "-m", gguf_path(model), "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["-t", str(threads), "-tb", str(threads), "-c", str(ctx), "-np", str(slots)]
    if "gemma" in model:  # its GGUF has no template: the Gemma 3 format offgraph-kv serve uses
        from offgraph_kv.serve.loading import GEMMA3_TEMPLATE

        template = log.parent / "gemma3.jinja"
        template.write_text(GEMMA3_TEMPLATE)
        cmd += ["--chat-template-file", str(template)]
    cmd += ["--cont-batching", "--metrics", "--no-webui", *extra]
    return Proc(cmd, port, "/health", log)


def llama_flags(proc: Proc) -> str:
    return " ".join(proc.cmd[1:2] + ["<gguf>"] + proc.cmd[3:])


def llama_metric(url: str, name: str) -> float:
    """A llama-server ``/metrics`` counter (``llamacpp:<name>``)."""
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    m = re.search(rf"^llamacpp:{re.escape(name)}\s+(\S+)$", text, flags=re.M)
    return float(m.group(1)) if m else float("nan")


@dataclass
class Timed:
    """One streamed request: its times and token counts."""

    ttft: float = float("nan")
    gaps: list[float] = field(default_factory=list)  # between streamed content chunks
    text: str = ""
    completion_tokens: int = 0
    prompt_tokens: int = 0
    computed_tokens: int | None = None  # prompt tokens the server computed (not from cache)
    decode_s: float = float("nan")  # first to last content chunk


async def chat_stream(client, model: str, messages, max_tokens: int, **extra) -> Timed:
    """One greedy streamed chat completion, timed from the call; ``extra``: more request
    fields (``response_format``, ...)."""
    t0 = time.perf_counter()
    stream = await client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        **extra,
    )
    out = Timed()
    first = last = None
    parts: list[str] = []
    async for c in stream:
        extra = c.model_extra or {}
        timings = extra.get("timings")  # llama-server: prompt_n = prompt tokens it computed
        if isinstance(timings, dict) and "prompt_n" in timings:
            out.computed_tokens = int(timings["prompt_n"])
        if c.usage is not None:
            out.completion_tokens = c.usage.completion_tokens
            out.prompt_tokens = c.usage.prompt_tokens
            det = c.usage.prompt_tokens_details
            if out.computed_tokens is None and det is not None and det.cached_tokens is not None:
                out.computed_tokens = c.usage.prompt_tokens - det.cached_tokens
        if not (c.choices and c.choices[0].delta.content):
            continue
        parts.append(c.choices[0].delta.content)
        now = time.perf_counter()
        if first is None:
            first = now
            out.ttft = now - t0
        else:
            out.gaps.append(now - last)
        last = now
    out.text = "".join(parts)
    if first is not None and last is not None:
        out.decode_s = last - first
    if not out.completion_tokens:
        out.completion_tokens = len(parts)
    return out


def client_for(url: str):
    import openai

    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=2, timeout=7200)


def pct(xs: list[float], p: float) -> float:
    xs = sorted(x for x in xs if x == x)
    if not xs:
        return float("nan")
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")
