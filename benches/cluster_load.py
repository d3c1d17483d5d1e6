"""``offgraph-kv serve-cluster`` for the router benchmarks: started, its replicas' ports read
from its banner, their ``/metrics`` counters summed, stopped with SIGTERM."""

from __future__ import annotations

import concurrent.futures
import contextlib
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator


def metrics(port: int) -> dict[str, float]:
    """A replica's requests served (all outcomes), prompt tokens and cached prompt tokens."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    out: dict[str, float] = {"requests": 0.0}
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name.startswith("offgraph_kv_requests_total{"):
            out["requests"] += float(value)
        elif name in ("offgraph_kv_prompt_tokens_total", "offgraph_kv_cached_tokens_total"):
            out[name] = float(value)
    return out


@contextlib.contextmanager
def cluster(model: str, port: int, flags: list[str]) -> Iterator[list[int]]:
    """``serve-cluster model --port port *flags`` until the block ends; yields the replicas'
    ports once the router answers."""
    cmd = [sys.executable, "-m", "offgraph_kv", "serve-cluster", model, "--port", str(port)]
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen([*cmd, *flags], stdout=log, stderr=subprocess.STDOUT)
        try:
            while True:
                log.seek(0)
                out = log.read()
                if "serve-cluster: http" in out:
                    break
                if proc.poll() is not None:
                    raise RuntimeError(out)
                time.sleep(0.5)
            line = next(x for x in out.splitlines() if x.startswith("serve-cluster:"))
            _, *replicas = [int(p) for p in re.findall(r"//127\.0\.0\.1:(\d+)", line)]
            yield replicas
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(120)


def run_sessions(
    model: str, port: int, flags: list[str], sessions: int, concurrency: int, session
) -> tuple[float, list[dict[str, float]]]:
    """A cluster (:func:`cluster`) answering ``session(client, s)`` for every session ``s``,
    ``concurrency`` at a time, through the router with the official ``openai`` client; the wall
    time and each replica's :func:`metrics` after."""
    import openai

    with cluster(model, port, flags) as replicas:
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=600
        )
        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(lambda s: session(client, s), range(sessions)))
        wall = time.perf_counter() - t0
        return wall, [metrics(p) for p in replicas]


def totals(ms: list[dict[str, float]]) -> tuple[str, float, float]:
    """Requests per replica (``a:b``), prompt tokens and cached prompt tokens, summed."""
    split = ":".join(str(int(m["requests"])) for m in ms)
    prompt = sum(m["offgraph_kv_prompt_tokens_total"] for m in ms)
    return split, prompt, sum(m["offgraph_kv_cached_tokens_total"] for m in ms)
