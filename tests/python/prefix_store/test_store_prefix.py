"""PrefixStore over MemoryBackend, a real Redis and a real 3-node Redis Cluster."""

from __future__ import annotations

import warnings

import numpy as np
import offgraph_kv as okv
import pytest
from offgraph_kv.store import MemoryBackend, PrefixStore, RedisBackend, StoreWarning

H, D, CHUNK = 2, 8, 8


def config():
    layers = [
        okv.LayerConfig(okv.Ring(window=8), H, D),
        okv.LayerConfig(okv.Flat(), H, D),
        okv.LayerConfig(okv.Ring(window=8), H, D),
    ]
    return okv.CacheConfig(256, 3, layers, initial_capacity=4, max_step=16)


def rows(layer, tokens, p0, salt=0.0):
    """K/V of a toy model: a function of each token and its position."""
    t = np.asarray(tokens, dtype=np.float32)[None, :, None]
    pos = np.arange(p0, p0 + len(tokens), dtype=np.float32)[None, :, None]
    h = np.arange(H, dtype=np.float32)[:, None, None]
    d = np.arange(D, dtype=np.float32)[None, None, :]
    return np.sin(t * 0.01 + pos * 0.3 + h + d * 0.1 + layer * 3 + salt).astype(np.float32)


def prefill(kv, tokens):
    """Computes the positions the cache lacks, in steps of at most 16."""
    while kv.length < len(tokens):
        p = kv.length
        chunk = tokens[p : p + 16]
        kv.begin_step(len(chunk))
        for layer in range(3):
            kv.update(layer, rows(layer, chunk, p), rows(layer, chunk, p, 0.5))


def decode(kv, token):
    p = kv.begin_step(1)
    return [
        okv.attend(
            rows(layer + 5, [token], p),
            kv.update(layer, rows(layer, [token], p), rows(layer, [token], p, 0.5)),
            threads=1,
        )
        for layer in range(3)
    ]


def prompt(n, seed=0):
    return [int(x) for x in np.random.default_rng(seed).integers(0, 50000, n)]


def check_store(store):
    tokens = prompt(41)
    a = okv.KvSequenceCache(config())
    prefill(a, tokens)
    written = store.save(a, tokens)
    assert written == 5 and written.failed == [] and written.present == 0
    again = store.save(a, tokens)
    assert again == 0 and again.present == 5
    b = okv.KvSequenceCache(config())
    assert store.load(b, tokens) == 40
    prefill(b, tokens)
    assert b.save_state() == a.save_state()  # every held row, bit for bit
    for x, y in zip(decode(a, 7), decode(b, 7)):
        assert np.array_equal(x, y)
    # At most len - 1 tokens: a prompt of exactly 40 restores 4 chunks.
    c = okv.KvSequenceCache(config())
    assert store.load(c, tokens[:40]) == 32 and c.length == 32
    # Chunk 2's ring tail was overwritten in `a` before the save (the ring
    # holds 23 positions), so a chain ending there has a hole: a miss.
    assert store.load(okv.KvSequenceCache(config()), tokens[:25]) == 0
    # Another prompt: a miss.
    assert store.load(okv.KvSequenceCache(config()), prompt(41, seed=1)) == 0
    # A non-empty cache is left alone.
    d = okv.KvSequenceCache(config())
    prefill(d, tokens[:3])
    assert store.load(d, tokens) == 0 and d.length == 3


def test_memory_backend_round_trip():
    check_store(PrefixStore(MemoryBackend(1 << 24), chunk_tokens=CHUNK, model="toy"))


def test_memory_backend_is_lru_by_bytes():
    m = MemoryBackend(max_bytes=100)
    assert m.set_many([("a", b"x" * 40), ("b", b"y" * 40)]) == [None, None]
    m.get_many(["a"])  # a is now the most recent
    assert m.set_many([("c", b"z" * 40)]) == [None]
    assert m.exists_many(["a", "b", "c"]) == [True, False, True]
    assert m.set_many([("big", b"0" * 200)]) != [None]
    assert m.stats("") == {"keys": 2, "bytes": 80}


def test_namespaces_and_models_do_not_share_keys():
    backend = MemoryBackend(1 << 24)
    tokens = prompt(41)
    a = okv.KvSequenceCache(config())
    prefill(a, tokens)
    PrefixStore(backend, chunk_tokens=CHUNK, model="toy", namespace="x").save(a, tokens)
    assert (
        PrefixStore(backend, chunk_tokens=CHUNK, model="toy", namespace="y").load(
            okv.KvSequenceCache(config()), tokens
        )
        == 0
    )
    other = okv.CacheConfig(256, 3, [okv.LayerConfig(okv.Flat(), H, D)], max_step=16)
    assert (
        PrefixStore(backend, chunk_tokens=CHUNK, model="toy", namespace="x").load(
            okv.KvSequenceCache(other), tokens
        )
        == 0
    )


def test_redis_round_trip(redis_server):
    store = PrefixStore(
        RedisBackend(redis_server.url), chunk_tokens=CHUNK, model="toy", namespace="rt"
    )
    store.clear()
    check_store(store)
    assert store.stats()["keys"] == 5
    assert store.clear() == 5 and store.stats()["keys"] == 0


def test_corrupted_values_in_redis_are_misses_and_deleted(redis_server):
    import redis

    store = PrefixStore(
        RedisBackend(redis_server.url), chunk_tokens=CHUNK, model="toy", namespace="bad"
    )
    store.clear()
    tokens = prompt(41, seed=3)
    a = okv.KvSequenceCache(config())
    prefill(a, tokens)
    assert store.save(a, tokens) == 5
    keys = store.keys(a, tokens)
    r = redis.Redis.from_url(redis_server.url)
    for i, mangle in enumerate(
        [
            lambda v: v[:-10],  # truncated
            lambda v: v[:50] + bytes([v[50] ^ 4]) + v[51:],  # bit flip
            lambda v: v.replace(b"OKVCHUNK", b"OKVCHUNX", 1),  # foreign
        ]
    ):
        store.save(a, tokens)  # restore what the last round deleted
        good = r.get(keys[4])
        r.set(keys[4], mangle(good))
        b = okv.KvSequenceCache(config())
        with pytest.warns(StoreWarning, match="bad"):
            got = store.load(b, tokens)
        assert got == 32, i  # chunk 4 missing: the chain ends before it
        assert r.exists(keys[4]) == 0  # deleted
        prefill(b, tokens)
        for x, y in zip(decode(b, 9), decode_ref(tokens, 9)):
            assert np.array_equal(x, y)
    # A value of the right shape under another chunk's key: another range.
    r.set(keys[4], r.get(keys[3]))
    with pytest.warns(StoreWarning, match=r"holds kind 0 \[24, 32\)"):
        store.load(okv.KvSequenceCache(config()), tokens)


def decode_ref(tokens, token):
    ref = okv.KvSequenceCache(config())
    prefill(ref, tokens)
    return decode(ref, token)


def test_unreachable_server_is_a_miss_with_a_warning():
    from .conftest import free_port

    for url in [f"redis://127.0.0.1:{free_port()}/0", f"redis-cluster://127.0.0.1:{free_port()}"]:
        store = PrefixStore(RedisBackend(url, timeout=0.5), chunk_tokens=CHUNK, model="toy")
        tokens = prompt(41)
        a = okv.KvSequenceCache(config())
        prefill(a, tokens)
        with pytest.warns(StoreWarning):
            res = store.save(a, tokens)
        assert res == 0 and len(res.failed) == 5
        b = okv.KvSequenceCache(config())
        with pytest.warns(StoreWarning):
            assert store.load(b, tokens) == 0
        assert b.length == 0


def test_cluster_round_trip(redis_cluster):
    store = PrefixStore(
        RedisBackend(redis_cluster.url), chunk_tokens=CHUNK, model="toy", namespace="cl"
    )
    store.clear()
    check_store(store)
    assert store.stats()["keys"] == 5


def test_losing_a_cluster_node_degrades_to_misses(fresh_cluster):
    store = PrefixStore(
        RedisBackend(fresh_cluster.url, timeout=0.5),
        chunk_tokens=CHUNK,
        model="toy",
        namespace="lost",
    )
    tokens = prompt(161, seed=5)
    a = okv.KvSequenceCache(config())
    prefill(a, tokens)
    assert store.save(a, tokens) == 20
    b = okv.KvSequenceCache(config())
    assert store.load(b, tokens) == 160
    fresh_cluster.nodes[1].stop()  # mid-run: the store keeps going
    for _ in range(2):
        c = okv.KvSequenceCache(config())
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            got = store.load(c, tokens)
        assert got < 160 and got % CHUNK == 0
        assert any(issubclass(x.category, StoreWarning) for x in w)
        prefill(c, tokens)
        for x, y in zip(decode(c, 11), decode_ref(tokens, 11)):
            assert np.array_equal(x, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = store.save(a, prompt(161, seed=6))
    assert len(res.failed) + int(res) == 20 and res.failed


def test_cli_stats_and_clear(redis_server):
    import subprocess
    import sys

    store = PrefixStore(
        RedisBackend(redis_server.url), chunk_tokens=CHUNK, model="toy", namespace="cli"
    )
    tokens = prompt(41, seed=8)
    a = okv.KvSequenceCache(config())
    prefill(a, tokens)
    assert store.save(a, tokens) == 5

    def cli(*args):
        cmd = [sys.executable, "-m", "offgraph_kv", "store", *args, "--url", redis_server.url]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout

    assert "5 chunks" in cli("stats", "--namespace", "cli")
    assert "deleted 5 chunks" in cli("clear", "--namespace", "cli")
    assert store.stats()["keys"] == 0


def test_offgraph_cache_miss_leaves_layers_to_the_forward():
    import torch
    from model_helpers import tiny_model
    from offgraph_kv.hf import OffgraphCache

    model = tiny_model("llama", torch.bfloat16)
    store = PrefixStore(MemoryBackend(1 << 24), chunk_tokens=4, model=model)
    cache = OffgraphCache(model.config)
    assert store.load(cache, list(range(1, 12))) == 0
    # A miss leaves nothing set up: a batch of 2 in bfloat16 runs as without the store.
    batch = torch.tensor([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]])
    out = model.generate(batch, cache=cache, max_new_tokens=2, do_sample=False)
    fresh = OffgraphCache(model.config)
    ref = model.generate(batch, cache=fresh, max_new_tokens=2, do_sample=False)
    assert torch.equal(out, ref)
    # A hit restores into bfloat16-model layers and generates the same tokens.
    ids = torch.tensor([list(range(1, 14))])
    first = OffgraphCache(model.config)
    model.generate(ids, cache=first, max_new_tokens=1, do_sample=False)
    assert store.save(first, ids[0].tolist()) == 3
    again = OffgraphCache(model.config)
    assert store.load(again, ids[0].tolist()) == 12
    got = model.generate(ids, cache=again, max_new_tokens=3, do_sample=False)
    want = model.generate(ids, cache=OffgraphCache(model.config), max_new_tokens=3, do_sample=False)
    assert torch.equal(got, want)
