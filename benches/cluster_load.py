"""``offgraph-kv serve-cluster`` for the router benchmarks: started, its replicas' ports read
from its banner, their ``/metrics`` counters summed, stopped with SIGTERM."""

from __future__ import annotations

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
