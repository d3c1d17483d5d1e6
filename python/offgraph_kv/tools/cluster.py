"""``offgraph-kv serve-cluster``: N ``offgraph-kv serve`` replicas behind SMG (``pip install smg``,
Shepherd Model Gateway, a cache-aware router), started, watched and stopped together.

Everything binds 127.0.0.1 unless ``--host`` says otherwise: the replicas, the router's API port
and its Prometheus port (SMG's own default for both is 0.0.0.0). ``--api-key`` reaches every
replica (through the environment, not the command line) and the router, which then asks clients
for it and sends it on. A replica that exits is started again on its port (SMG drops it while it
is gone and re-adds it once its health checks pass). SIGTERM or SIGINT stops the router first,
then the replicas (each finishes what it runs, up to ``--shutdown-timeout``); exit status 0.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

__all__ = ["SPILL", "ClusterOptions", "add_arguments", "replica_command", "router_command", "run"]

SPILL = ["--balance-abs-threshold", "1", "--balance-rel-threshold", "1.2"]
"""When SMG's cache-aware policy leaves a replica its prompt matches for the least loaded one: once
the match holds at least one request more than the replicas' mean, and 1.2 times it. SMG's own
gate (64 more, and 1.5 times) never opens at a few requests in flight, so a system prompt every
session shares pulls all of them to one replica while the other idles; with this gate sessions
spread and still stay where their history is (benches/bench_router_split.py)."""


@dataclass
class ClusterOptions:
    """What ``serve-cluster`` runs: ``replicas`` servers of ``model`` (``threads`` each) on
    ``host``, the router on ``port`` and its metrics on ``metrics_port`` (``None``: a free one),
    ``store`` a prefix store URL every replica shares, ``serve_args`` more ``serve`` flags,
    ``router_args`` more router flags."""

    model: str
    replicas: int = 2
    router: str = "smg"
    host: str = "127.0.0.1"
    port: int = 8000
    metrics_port: int | None = None
    threads: int | None = None
    store: str | None = None
    api_key: str | None = None
    policy: str = "cache_aware"
    shutdown_timeout: float = 30.0
    startup_timeout: float = 600.0
    serve_args: list[str] = field(default_factory=list)
    router_args: list[str] = field(default_factory=list)


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def replica_command(opts: ClusterOptions, port: int) -> list[str]:
    """One replica's ``offgraph-kv serve`` command (its API key goes in the environment)."""
    cmd = [sys.executable, "-m", "offgraph_kv", "serve", opts.model]
    cmd += ["--host", opts.host, "--port", str(port)]
    if opts.threads:
        cmd += ["--threads", str(opts.threads)]
    if opts.store:
        cmd += ["--store", opts.store]
    cmd += ["--shutdown-timeout", str(opts.shutdown_timeout), *opts.serve_args]
    return cmd


def router_command(opts: ClusterOptions, smg: str, urls: list[str], metrics_port: int) -> list[str]:
    """SMG's command over replica ``urls``: health checked every second, so a replica that dies
    or comes back is seen within a few seconds; its load polled as often."""
    cmd = [smg, "launch", "--host", opts.host, "--port", str(opts.port)]
    cmd += ["--prometheus-host", opts.host, "--prometheus-port", str(metrics_port)]
    cmd += ["--worker-urls", *urls, "--policy", opts.policy]
    cmd += SPILL
    cmd += ["--health-check-interval-secs", "1", "--load-monitor-interval", "1"]
    cmd += ["--shutdown-grace-period-secs", str(max(1, int(opts.shutdown_timeout)))]
    cmd += ["--log-level", "warn"]
    if opts.api_key:
        cmd += ["--api-key", opts.api_key]
    return cmd + opts.router_args


def find_smg() -> str | None:
    """The ``smg`` executable: on PATH, or beside this Python (a virtualenv not activated)."""
    here = os.path.join(os.path.dirname(sys.executable), "smg")
    return shutil.which("smg") or (here if os.access(here, os.X_OK) else None)


def _die_with_parent() -> None:
    # A child gets SIGTERM if the launcher dies without stopping it (Linux).
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _answers(url: str, key: str | None) -> bool:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5) as r:
            return r.status == 200
    except (urllib.error.URLError, ConnectionError, OSError):
        return False


class Cluster:
    """The children: replicas (restarted when they exit) and the router."""

    def __init__(self, opts: ClusterOptions, smg: str):
        self.opts = opts
        self.smg = smg
        self.ports = [free_port(opts.host) for _ in range(opts.replicas)]
        self.urls = [f"http://{opts.host}:{p}" for p in self.ports]
        self.metrics_port = opts.metrics_port or free_port(opts.host)
        self.env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        if opts.api_key:
            self.env["OFFGRAPH_KV_API_KEY"] = opts.api_key
        self.replicas: list[subprocess.Popen] = []
        self.router: subprocess.Popen | None = None
        self.restarts = 0

    def _spawn(self, cmd: list[str]) -> subprocess.Popen:
        return subprocess.Popen(cmd, env=self.env, preexec_fn=_die_with_parent)

    def start(self) -> None:
        self.replicas = [self._spawn(replica_command(self.opts, p)) for p in self.ports]
        deadline = time.monotonic() + self.opts.startup_timeout
        for i, url in enumerate(self.urls):
            while not _answers(url + "/health", self.opts.api_key):
                if self.replicas[i].poll() is not None:
                    raise RuntimeError(f"replica {i} exited {self.replicas[i].returncode}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"replica {i} did not answer on {url}")
                time.sleep(0.5)
        self.router = self._spawn(router_command(self.opts, self.smg, self.urls, self.metrics_port))
        ready = f"http://{self.opts.host}:{self.opts.port}/readiness"
        while not _answers(ready, self.opts.api_key):
            if self.router.poll() is not None:
                raise RuntimeError(f"the router exited {self.router.returncode}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the router did not become ready on {ready}")
            time.sleep(0.2)

    def watch(self) -> None:
        """Starts again a replica that exited (one check a second)."""
        for i, proc in enumerate(self.replicas):
            if proc.poll() is not None:
                print(
                    f"serve-cluster: replica {i} ({self.urls[i]}) exited {proc.returncode}; "
                    "starting it again",
                    file=sys.stderr,
                    flush=True,
                )
                self.replicas[i] = self._spawn(replica_command(self.opts, self.ports[i]))
                self.restarts += 1

    def stop(self) -> None:
        """The router first (no new request reaches a stopping replica), then the replicas."""
        for group in ([self.router] if self.router else [], self.replicas):
            for proc in group:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in group:
                try:
                    proc.wait(self.opts.shutdown_timeout + 5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def run(opts: ClusterOptions) -> int:
    """Starts the cluster and serves until SIGTERM/SIGINT; 0 after a clean stop, 1 if it never
    started, 2 without SMG."""
    if opts.router != "smg":
        print(f"serve-cluster: unknown router {opts.router!r} (smg)", file=sys.stderr)
        return 2
    smg = find_smg()
    if smg is None:
        print("serve-cluster needs SMG: pip install smg", file=sys.stderr)
        return 2
    stop = {"now": False}

    def on_signal(*_: object) -> None:
        stop["now"] = True

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    cluster = Cluster(opts, smg)
    try:
        try:
            cluster.start()
        except RuntimeError as e:
            print(f"serve-cluster: {e}", file=sys.stderr, flush=True)
            return 1
        print(
            f"serve-cluster: http://{opts.host}:{opts.port}/v1 ({opts.router} {opts.policy}) "
            f"over {', '.join(cluster.urls)}; metrics on port {cluster.metrics_port}",
            flush=True,
        )
        while not stop["now"]:
            time.sleep(1.0)
            if not stop["now"]:
                cluster.watch()
        return 0
    finally:
        cluster.stop()


def add_arguments(p: argparse.ArgumentParser, positive: object) -> None:
    p.add_argument("model", metavar="MODEL", help="what `offgraph-kv serve` takes: a .gguf, ...")
    p.add_argument("--replicas", type=positive, default=2, help="servers (default 2)")
    p.add_argument("--router", choices=["smg"], default="smg", help="the router (default smg)")
    p.add_argument("--host", default="127.0.0.1", help="address of everything (127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="the router's port (default 8000)")
    p.add_argument("--metrics-port", type=int, default=None, help="router's Prometheus port")
    p.add_argument("--threads", type=positive, default=None, help="engine threads per replica")
    p.add_argument("--store", default=None, help="prefix store every replica shares: redis://...")
    p.add_argument("--api-key", default=None, help="key clients send; reaches every replica")
    p.add_argument(
        "--policy",
        default="cache_aware",
        choices=["cache_aware", "round_robin", "power_of_two", "least_load", "random"],
        help="SMG's routing policy (default cache_aware)",
    )
    p.add_argument("--shutdown-timeout", type=float, default=30.0, help="per process (30 s)")
    p.add_argument(
        "--serve-arg",
        action="append",
        default=[],
        dest="serve_args",
        metavar="ARG",
        help="one more `serve` argument for every replica (repeat: --serve-arg=--n-cells ...)",
    )
    p.add_argument(
        "--router-arg",
        action="append",
        default=[],
        dest="router_args",
        metavar="ARG",
        help="one more router argument, after the launcher's (a later flag wins: "
        "--router-arg=--balance-abs-threshold --router-arg=64 restores SMG's spill gate)",
    )


def cmd(args: argparse.Namespace) -> int:
    fields = ClusterOptions.__dataclass_fields__
    return run(ClusterOptions(**{k: v for k, v in vars(args).items() if k in fields}))
