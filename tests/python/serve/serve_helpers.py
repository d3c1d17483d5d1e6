"""A real ``offgraph-kv serve`` process on a free loopback port, for the serve tests."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One ``offgraph-kv serve`` process; with ``api_key`` (``--api-key``) every request the
    helpers make sends it."""

    def __init__(self, model: str, *args: str, timeout: float = 900.0, api_key: str | None = None):
        self.api_key = api_key
        if api_key is not None:
            args = (*args, "--api-key", api_key)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile("w+", prefix="okv-serve-", suffix=".log")
        cmd = [sys.executable, "-m", "offgraph_kv", "serve", model, "--port", str(self.port)]
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        self.proc = subprocess.Popen(
            [*cmd, "--log-level", "warning", *args],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited {self.proc.returncode}:\n{self.output()}")
            try:
                self.get("/health")
                break
            except (urllib.error.URLError, ConnectionError, OSError):
                if time.monotonic() > deadline:
                    self.proc.kill()
                    raise RuntimeError(f"server did not start:\n{self.output()}") from None
                time.sleep(0.5)

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def _headers(self, key: str | None = None) -> dict[str, str]:
        key = self.api_key if key is None else key
        return {} if not key else {"Authorization": f"Bearer {key}"}

    def get(self, path: str) -> dict:
        req = urllib.request.Request(self.url + path, headers=self._headers())
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())

    def text(self, path: str) -> str:
        req = urllib.request.Request(self.url + path, headers=self._headers())
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.read().decode()

    def post(
        self,
        path: str,
        body: bytes,
        content_type: str = "application/json",
        key: str | None = None,
    ):
        """``(status, headers, json body)`` of a raw POST (``key``: another API key than the
        server's; ``""`` sends none)."""
        headers = {"Content-Type": content_type, **self._headers(key)}
        req = urllib.request.Request(self.url + path, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=300) as r:
                return r.status, r.headers, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, e.headers, json.loads(e.read())

    def metric(self, name: str) -> float:
        """The value of an unlabelled sample ``name`` in /metrics."""
        for line in self.text("/metrics").splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise KeyError(name)

    def client(self, **kw):
        import openai

        kw.setdefault("api_key", self.api_key or "none")
        return openai.OpenAI(base_url=self.url + "/v1", max_retries=0, **kw)

    def async_client(self, **kw):
        import openai

        kw.setdefault("api_key", self.api_key or "none")
        return openai.AsyncOpenAI(base_url=self.url + "/v1", max_retries=0, **kw)

    def stop(self, timeout: float = 120.0) -> int:
        """SIGTERM, then the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def stream_chats(
    server: Server, model: str, convs: list, leaving: set, stay: int, leave: int
) -> list[str]:
    """Every conversation as a concurrent greedy stream (``stay`` tokens, ``leave`` for the
    clients in ``leaving``, which go away after their first text chunk); each stream's text."""
    import asyncio

    async def one(client, i):
        stream = await client.chat.completions.create(
            model=model,
            messages=convs[i],
            max_tokens=leave if i in leaving else stay,
            temperature=0,
            stream=True,
        )
        text = []
        async for c in stream:
            if c.choices and c.choices[0].delta.content:
                text.append(c.choices[0].delta.content)
                if i in leaving:
                    break
        await stream.close()
        return "".join(text)

    async def main():
        client = server.async_client(timeout=600)
        try:
            return await asyncio.gather(*(one(client, i) for i in range(len(convs))))
        finally:
            await client.close()

    return asyncio.run(main())


def settled_health(server: Server, timeout: float = 300.0) -> dict:
    """``/health?audit=true`` once nothing runs any more (cancelled streams wind down)."""
    deadline = time.monotonic() + timeout
    while server.get("/health")["running"]:
        assert time.monotonic() < deadline, "requests still running"
        time.sleep(0.2)
    return server.get("/health?audit=true")
