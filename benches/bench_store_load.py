"""Prefix-store load throughput from Redis on loopback, against a raw GET of the same bytes.

An ``OffgraphCache`` of Gemma 3 270M's layout (18 layers, one KV head of 256, sliding window 512
on 15 layers, float32 pools) is filled with 2,048 tokens of random rows (no model forward: this
measures the store, not the model) and saved in 256-token chunks to a ``redis-server`` started
on loopback. Then, interleaved in one run so they share the machine's noise:

* ``get``: a pipelined ``GET`` of the chunk values through redis-py (with hiredis when it is
  installed): the bytes moved from the server into Python objects, the floor of any load;
* ``raw``: the same pipelined ``GET``s over a plain socket, each bulk reply read with
  ``recv_into`` straight into a buffer of its size: the transport without any client library,
  the lower floor;
* ``load``: ``PrefixStore.load`` into a fresh cache: the same GETs plus the checks, one checksum
  pass and the rows copied into the pools.

Reported: medians, GB/s (stored bytes / median time) and load / get.

    python benches/bench_store_load.py [--reps 15] [--tokens 2048] [--json out.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import socket
import statistics
import tempfile
import time
from pathlib import Path
from urllib.parse import urlparse

import redis as redis_py
import torch
from offgraph_kv.hf import OffgraphCache
from offgraph_kv.store import PrefixStore, RedisBackend
from transformers import Gemma3TextConfig

CHUNK = 256


def _servers():
    path = Path(__file__).resolve().parent.parent / "tests/python/prefix_store/conftest.py"
    spec = importlib.util.spec_from_file_location("store_servers", path)
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod


def pipe_values(client, keys: list[str]) -> list[bytes]:
    pipe = client.pipeline(transaction=False)
    for k in keys:
        pipe.get(k)
    return pipe.execute()


def gemma_like() -> Gemma3TextConfig:
    return Gemma3TextConfig(
        num_hidden_layers=18,
        hidden_size=640,
        intermediate_size=2048,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=256,
        sliding_window=512,
        vocab_size=1024,
        max_position_embeddings=32768,
    )


def filled(config, n: int) -> OffgraphCache:
    cache = OffgraphCache(config)
    g = torch.Generator().manual_seed(0)
    for s in range(0, n, CHUNK):
        t = min(CHUNK, n - s)
        for i in range(config.num_hidden_layers):
            k = torch.randn(1, 1, t, 256, generator=g)
            cache.update(k, -k, i)
    return cache


class RawGet:
    """Pipelined ``GET``s in RESP over one plain socket, each value read into its own buffer."""

    def __init__(self, url: str, keys: list[str]) -> None:
        u = urlparse(url)
        keys = [k.encode() for k in keys]
        self.sock = socket.create_connection((u.hostname, u.port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.request = b"".join(b"*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n" % (len(k), k) for k in keys)
        self.n = len(keys)

    def __call__(self) -> list[memoryview]:
        self.sock.sendall(self.request)
        out, rest = [], b""
        for _ in range(self.n):
            while b"\r\n" not in rest:
                rest += self.sock.recv(1 << 16)
            line, rest = rest.split(b"\r\n", 1)
            size = int(line[1:])
            assert line[:1] == b"$" and size >= 0, line
            view = memoryview(bytearray(size + 2))
            got = min(len(rest), size + 2)
            view[:got] = rest[:got]
            rest = rest[got:]
            while got < size + 2:
                got += self.sock.recv_into(view[got:])
            out.append(view[:size])
        return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    config = gemma_like()
    tokens = list(range(1, args.tokens + 2))
    srv = _servers()
    with tempfile.TemporaryDirectory() as tmp:
        server = srv.RedisServer(Path(tmp))
        try:
            store = PrefixStore(RedisBackend(server.url), chunk_tokens=CHUNK, model="bench")
            written = store.save(filled(config, args.tokens), tokens)
            assert written == args.tokens // CHUNK and not written.failed, written
            stored = store.stats()["bytes"]
            keys = store.keys(OffgraphCache(config), tokens[: args.tokens])
            raw = redis_py.Redis.from_url(server.url)

            def get() -> None:
                assert all(pipe_values(raw, keys))

            raw_get = RawGet(server.url, keys)
            assert [bytes(v) for v in raw_get()] == pipe_values(raw, keys)

            def raw_mode() -> None:
                assert all(len(v) for v in raw_get())

            def load() -> None:
                assert store.load(OffgraphCache(config), tokens) == args.tokens

            modes = {"get": get, "raw": raw_mode, "load": load}
            times: dict[str, list[float]] = {m: [] for m in modes}
            get(), raw_mode(), load()  # warm-up: connections, first pools
            for rep in range(args.reps):
                order = list(modes)[rep % 3 :] + list(modes)[: rep % 3]
                for m in order:
                    t0 = time.perf_counter()
                    modes[m]()
                    times[m].append(time.perf_counter() - t0)
        finally:
            server.stop()
    parser = type(raw.connection_pool.connection_class().__dict__.get("_parser")).__name__
    med = {m: statistics.median(v) for m, v in times.items()}
    print(
        f"{args.tokens} tokens, Gemma 3 270M layout, float32 pools, chunks of {CHUNK}: "
        f"{stored} bytes stored; {args.reps} interleaved runs; redis-py parser {parser}"
    )
    print("| mode | median (ms) | GB/s | vs get |")
    print("|---|---|---|---|")
    for m in modes:
        print(
            f"| {m} | {med[m] * 1000:.1f} | {stored / med[m] / 1e9:.2f} | "
            f"{med[m] / med['get']:.2f}x |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bytes": stored, "times": times, "parser": parser}, f, indent=1)


if __name__ == "__main__":
    main()
