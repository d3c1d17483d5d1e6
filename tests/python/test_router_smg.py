"""Replicas of ``offgraph-kv serve`` behind SMG (``pip install smg``, a cache-aware router) on
loopback, started with the commands ``offgraph-kv serve-cluster`` runs: two SmolLM2-135M
replicas (one thread each) and the router, once for the module. A replica answers what the
router asks (its load, server and model info, a health check through its stepping thread); a
chat works whole, with ``n`` and streamed through the router; a session's turns reach the
replica that holds its history (``cached_tokens`` grow); a replica killed under load is dropped
(the requests it held fail with an OpenAI-shaped error, the rest complete) and, started again,
rejoins; the replicas share a Redis store, so a prompt one prefilled the other restores. Last,
the launcher itself: one chat with its API key, SIGTERM, every port closed."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import openai
import pytest
from offgraph_kv.tools.cluster import (
    ClusterOptions,
    find_smg,
    free_port,
    replica_command,
    router_command,
)
from prefix_store.conftest import RedisServer

MODEL = "smollm2-135m"
HOST = "127.0.0.1"
OPTS = ClusterOptions(MODEL, threads=1, serve_args=["--n-cells", "4096", "--log-level", "warning"])
SYSTEM = "You are a careful assistant for a bicycle shop; answer briefly. " * 12


class Proc:
    """A child process with its output in a temporary file."""

    def __init__(self, cmd: list[str], env: dict[str, str] | None = None):
        self.log = tempfile.NamedTemporaryFile("w+", prefix="okv-router-", suffix=".log")
        env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-4000:]

    def stop(self, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def get(url: str, key: str | None = None) -> dict:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as r:
        return json.loads(r.read())


def wait_for(what: str, ok, proc: Proc | None = None, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if ok():
                return
        except (urllib.error.URLError, ConnectionError, OSError, KeyError):
            pass
        if proc is not None and proc.proc.poll() is not None:
            raise RuntimeError(f"{what}: exited {proc.proc.returncode}:\n{proc.output()}")
        assert time.monotonic() < deadline, f"{what}: timed out"
        time.sleep(0.2)


def unique_text(i: int) -> str:
    """A prompt sharing no words with another ``i``'s: SMG's tree matches little of it, so the
    router places it by load and the size of what each replica holds."""
    return " ".join(f"item{i}x{j}" for j in range(12)) + ": write a short line."


def prompt_tokens_served(url: str) -> float:
    """The replica's ``offgraph_kv_prompt_tokens_total``."""
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("offgraph_kv_prompt_tokens_total "):
                return float(line.split()[1])
    raise KeyError("offgraph_kv_prompt_tokens_total")


@dataclasses.dataclass
class Cluster:
    opts: ClusterOptions
    ports: list[int]
    replicas: list[Proc]
    url: str
    router: Proc | None = None

    @property
    def urls(self) -> list[str]:
        return [f"http://{HOST}:{p}" for p in self.ports]

    def client(self, **kw) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key="none", max_retries=0, **kw)

    def states(self) -> dict[str, str]:
        """The router's view: replica URL -> its status (``ready``, ``not_ready``)."""
        return {w["url"]: w["status"] for w in get(self.url + "/workers")["workers"]}

    def start_replica(self, i: int) -> None:
        self.replicas[i] = Proc(replica_command(self.opts, self.ports[i]))
        wait_for(f"replica {i}", lambda: get(self.urls[i] + "/health"), self.replicas[i])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    smg = find_smg()
    assert smg is not None, "smg is not installed (pip install smg)"
    redis = RedisServer(tmp_path_factory.mktemp("redis"))
    opts = dataclasses.replace(OPTS, port=free_port(HOST), store=redis.url)
    ports = [free_port(HOST) for _ in range(2)]
    replicas = [Proc(replica_command(opts, p)) for p in ports]
    c = Cluster(opts, ports, replicas, f"http://{HOST}:{opts.port}")
    try:
        for i, url in enumerate(c.urls):
            wait_for(f"replica {i}", lambda u=url: get(u + "/health"), replicas[i])
        c.router = Proc(router_command(opts, smg, c.urls, free_port(HOST)))
        wait_for(
            "the router",
            lambda: get(c.url + "/readiness")["healthy_workers"] == 2,
            c.router,
            timeout=60,
        )
        yield c
    finally:
        if c.router is not None:
            c.router.stop()
        codes = [p.stop() for p in c.replicas]
        redis.stop()
    assert codes == [0] * len(codes), "a replica did not stop cleanly"


def test_a_replica_answers_what_the_router_asks(cluster):
    url = cluster.urls[0]
    (load,) = get(url + "/v1/loads?include=core")["loads"]
    assert load["max_total_num_tokens"] == 4096 and load["dp_rank"] == 0
    assert load["num_running_reqs"] == load["num_waiting_reqs"] == 0
    assert 0.0 <= load["token_usage"] <= 1.0 and load["max_running_requests"] == 256
    for path in ("/server_info", "/get_server_info"):
        info = get(url + path)
        assert info["served_model_name"] == MODEL and info["max_total_tokens"] == 4096
    for path in ("/model_info", "/get_model_info"):
        info = get(url + path)
        assert info["is_generation"] is True and info["model_type"] == "llama"
    assert get(url + "/health_generate") == {"status": "ok"}
    assert get(url + "/get_load")["load"] == 0
    # The router registered both with their server info, and polls their load (every second).
    workers = get(cluster.url + "/workers")["workers"]
    assert sorted(w["url"] for w in workers) == sorted(cluster.urls)
    for w in workers:
        assert w["status"] == "ready" and w["labels"]["max_total_tokens"] == "4096"

    def polled() -> bool:
        loads = [w["engine_load"]["loads"][0] for w in get(cluster.url + "/workers")["workers"]]
        return [x["max_total_num_tokens"] for x in loads] == [4096, 4096]

    wait_for("the router polls the loads", polled, timeout=10)


def test_a_chat_works_whole_with_n_and_streamed_through_the_router(cluster):
    client = cluster.client(timeout=120)
    messages = [{"role": "user", "content": "Name a colour."}]
    whole = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=8, temperature=0
    )
    text = whole.choices[0].message.content
    assert text and whole.usage.completion_tokens == 8
    two = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=8, temperature=0, n=2
    )
    assert [c.message.content for c in two.choices] == [text, text]
    stream = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=8, temperature=0, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == text


def test_a_sessions_turns_reach_the_replica_that_holds_it(cluster):
    client = cluster.client(timeout=120)
    before = [prompt_tokens_served(u) for u in cluster.urls]
    for s in range(4):
        # Each session's own prefix from its first token: another replica would hold none of it.
        messages = [{"role": "system", "content": f"Session {s}. {SYSTEM}"}]
        last_prompt = 0
        for turn in range(3):
            messages.append({"role": "user", "content": f"Turn {turn}: pick a number."})
            r = client.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=6, temperature=0
            )
            cached = r.usage.prompt_tokens_details.cached_tokens
            if turn:
                assert cached >= last_prompt, (s, turn, cached, last_prompt)
            last_prompt = r.usage.prompt_tokens
            messages.append({"role": "assistant", "content": r.choices[0].message.content})
    # The router spread the sessions: each replica prefilled some of them.
    after = [prompt_tokens_served(u) for u in cluster.urls]
    assert all(b > a for a, b in zip(before, after)), (before, after)


def test_a_prompt_prefilled_on_one_replica_is_restored_on_the_other(cluster):
    # Both replicas share one Redis store (--store): the chunk the first saved as its prefill
    # passed position 256, the second loads instead of computing it.
    prompt = " ".join(
        f"Part {i}: the shop stocks {i * 7 % 13} wheels and {i} chains." for i in range(30)
    )
    kw = dict(model=MODEL, prompt=prompt, max_tokens=6, temperature=0)
    first, second = (
        openai.OpenAI(base_url=u + "/v1", api_key="none", max_retries=0, timeout=120)
        for u in cluster.urls
    )
    a = first.completions.create(**kw)
    assert a.usage.prompt_tokens > 256 and a.usage.prompt_tokens_details.cached_tokens == 0
    b = second.completions.create(**kw)
    assert b.usage.prompt_tokens_details.cached_tokens == 256
    assert b.choices[0].text == a.choices[0].text


def test_a_killed_replica_is_dropped_and_the_restarted_one_rejoins(cluster):
    client = cluster.client(timeout=120)

    def ask(i: int) -> str | BaseException:
        try:
            r = client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": unique_text(i)}],
                max_tokens=24,
                temperature=0,
            )
            return r.choices[0].message.content
        except openai.APIError as e:
            return e

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(ask, i) for i in range(16)]
        time.sleep(1.0)  # requests in flight on both replicas
        cluster.replicas[1].proc.kill()
        cluster.replicas[1].proc.wait()
        results = [f.result() for f in futures]
    failed = [r for r in results if isinstance(r, BaseException)]
    # Only what the killed replica held may fail, with the router's OpenAI-shaped error.
    assert len(failed) < len(results) // 2, failed
    for e in failed:
        assert isinstance(e, openai.APIStatusError) and e.status_code >= 500, repr(e)
    wait_for("the router drops it", lambda: cluster.states()[cluster.urls[1]] != "ready")
    for i in range(4):
        assert isinstance(ask(100 + i), str)
    cluster.start_replica(1)
    wait_for("the router re-adds it", lambda: cluster.states()[cluster.urls[1]] == "ready")
    served = prompt_tokens_served(cluster.urls[1])
    for i in range(8):  # new prompts: the replica holding least takes some
        assert isinstance(ask(200 + i), str)
        if prompt_tokens_served(cluster.urls[1]) > served:
            break
    assert prompt_tokens_served(cluster.urls[1]) > served, "the restarted replica got nothing"


def ports_open(ports: list[int]) -> list[int]:
    out = []
    for p in ports:
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex((HOST, p)) == 0:
                out.append(p)
    return out


def test_the_launcher_serves_with_its_key_and_stops_everything_on_sigterm():
    port, metrics = free_port(HOST), free_port(HOST)
    cmd = [sys.executable, "-m", "offgraph_kv", "serve-cluster", MODEL, "--replicas", "2"]
    cmd += ["--threads", "1", "--port", str(port), "--metrics-port", str(metrics)]
    cmd += ["--api-key", "k3y", "--serve-arg=--n-cells", "--serve-arg=2048"]
    launcher = Proc(cmd)
    try:
        wait_for("the launcher", lambda: "serve-cluster: http" in launcher.output(), launcher)
        line = next(x for x in launcher.output().splitlines() if x.startswith("serve-cluster:"))
        router_port, *replica_ports = [int(p) for p in re.findall(r"//127\.0\.0\.1:(\d+)", line)]
        assert router_port == port and len(replica_ports) == 2
        base = f"http://{HOST}:{port}/v1"
        anonymous = openai.OpenAI(base_url=base, api_key="wrong", max_retries=0, timeout=60)
        with pytest.raises(openai.AuthenticationError):
            anonymous.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4
            )
        client = openai.OpenAI(base_url=base, api_key="k3y", max_retries=0, timeout=120)
        r = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4
        )
        assert r.choices[0].message.content
        # The replicas want the key too: the router passed it on.
        with pytest.raises(urllib.error.HTTPError) as e:
            get(f"http://{HOST}:{replica_ports[0]}/v1/models")
        assert e.value.code == 401
        assert get(f"http://{HOST}:{replica_ports[0]}/v1/models", key="k3y")["data"]
        all_ports = [port, metrics, *replica_ports]
        assert ports_open(all_ports) == all_ports
    finally:
        rc = launcher.stop(timeout=90)
    assert rc == 0, launcher.output()
    assert ports_open(all_ports) == []
