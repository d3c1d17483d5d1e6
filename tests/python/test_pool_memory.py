"""The pools' memory model from Python: a reservation keeps every view's
address across growth and a view taken early reads rows written later;
clear() and trim() give pages back; the copy-growth fallback
(OFFGRAPH_KV_POOLS=grow) passes the same behaviour tests."""

import gc
import sys

import numpy as np
import offgraph_kv as okv
import pytest

DTYPES = ["float32", "float16", "bfloat16", "q8_0"]


@pytest.fixture(params=["reserve", "grow"])
def memory(request, monkeypatch):
    """Each test runs with reserved pools and again with the forced fallback."""
    monkeypatch.setenv("OFFGRAPH_KV_POOLS", request.param)
    return request.param


def config(capacity=512, dtype="float32", window=None, heads=2, dim=32, max_step=64):
    policy = okv.Ring(window=window) if window else okv.Flat()
    layer = okv.LayerConfig(policy, heads, dim)
    return okv.CacheConfig(capacity, 2, [layer], initial_capacity=4, max_step=max_step, dtype=dtype)


def run(kv, steps, seed):
    """Drives `steps` (token counts); returns every step's attention per layer."""
    rng = np.random.default_rng(seed)
    outs = []
    for n in steps:
        kv.control().begin_step(n)
        for layer in range(2):
            k, v = (rng.standard_normal((2, n, 32)).astype(np.float32) for _ in range(2))
            q = rng.standard_normal((4, n, 32)).astype(np.float32)
            outs.append(okv.attend(q, kv.update(layer, k, v), threads=1))
    return outs


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window", [None, 40])
def test_clear_then_refill_gives_identical_attention(memory, dtype, window):
    steps = [37, 1, 1, 64, 1, 30, 1]
    kv = okv.KvSequenceCache(config(dtype=dtype, window=window))
    assert kv.pool_memory == memory
    first = run(kv, steps, 3)
    peak = kv.nbytes()
    kv.control().clear()
    assert kv.nbytes() == 0
    again = run(kv, steps, 3)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    assert kv.nbytes() == peak
    fresh = run(okv.KvSequenceCache(config(dtype=dtype, window=window)), steps, 3)
    for a, b in zip(first, fresh):
        np.testing.assert_array_equal(a, b)


def test_nbytes_is_rows_and_reserved_bytes_the_address_space(memory):
    kv = okv.KvSequenceCache(config(capacity=1000))
    run(kv, [50, 1, 1], 1)
    per_row = 2 * 32 * 4 * 2  # heads x dim x float32, K and V
    assert kv.nbytes() == 2 * 52 * per_row
    assert kv.nbytes(0) == 52 * per_row
    depth_rows = 1000 if memory == "reserve" else 64
    assert kv.reserved_bytes() == 2 * depth_rows * per_row
    kv.control().rewind(10)
    assert kv.nbytes() == 2 * 52 * per_row  # a rewind keeps its pages


def test_views_stay_alive_after_clear_and_drop(memory):
    kv = okv.KvSequenceCache(config())
    kv.control().begin_step(3)
    rows = np.arange(2 * 3 * 32, dtype=np.float32).reshape(2, 3, 32)
    spec = kv.update(0, rows, -rows)
    k = spec.k
    kv.control().clear()
    del kv, spec
    gc.collect()
    # Still readable: the view's base owns the memory. A reservation gave its
    # pages back (zeros); a grown pool kept the old buffer for the view.
    got = np.asarray(k[:, :3])
    assert got.shape == (2, 3, 32)
    if memory == "grow":
        np.testing.assert_array_equal(got, rows)
    else:
        assert not got.any()


def test_reservation_keeps_the_address_and_early_views_see_later_rows(memory):
    kv = okv.KvSequenceCache(config(capacity=1 << 14, max_step=8))
    rng = np.random.default_rng(0)
    kv.control().begin_step(1)
    first = kv.update(1, *(rng.standard_normal((2, 1, 32)).astype(np.float32) for _ in range(2)))
    kv.update(0, *(rng.standard_normal((2, 1, 32)).astype(np.float32) for _ in range(2)))
    early = first.k
    addr = early.__array_interface__["data"][0]
    for _ in range(1, 10_000):
        kv.control().begin_step(1)
        kv.update(0, *(rng.standard_normal((2, 1, 32)).astype(np.float32) for _ in range(2)))
        k = rng.standard_normal((2, 1, 32)).astype(np.float32)
        spec = kv.update(1, k, k)
    now = spec.k.__array_interface__["data"][0]
    if memory == "reserve":
        assert now == addr
        np.testing.assert_array_equal(early[:, 9_999], k[:, 0])
    else:
        # The fallback copies on growth: the early view keeps the old rows.
        assert now != addr and early.shape[1] < 10_000


@pytest.mark.parametrize("dtype", DTYPES)
def test_trim_keeps_every_live_row(memory, dtype):
    cfg = config(capacity=4096, dtype=dtype)
    kc = okv.KvCellCache(cfg, 1024, n_seq_max=8)
    b = kc.control()
    rng = np.random.default_rng(2)
    seqs = [b.seq_new() for _ in range(4)]
    for chunk in range(4):
        for s in seqs:
            b.begin_step([s] * 50, list(range(chunk * 50, chunk * 50 + 50)))
            for layer in range(2):
                kc.update(
                    layer, *(rng.standard_normal((2, 50, 32)).astype(np.float32) for _ in range(2))
                )
    survivor = seqs[1]
    q = rng.standard_normal((4, 1, 32)).astype(np.float32)
    k1 = rng.standard_normal((2, 1, 32)).astype(np.float32)

    def step():
        b.begin_step([survivor], [200])
        out = okv.attend(q, kc.update(0, k1, k1), threads=1)
        b.seq_rm(survivor, 200)
        return out

    before = step()
    high = kc.nbytes()
    for s in (seqs[0], seqs[2], seqs[3]):
        b.seq_free(s)
    kc.trim()
    np.testing.assert_allclose(step(), before, atol=1e-5)
    assert kc.nbytes() < high  # placement is lowest-free-first
    b.clear()
    assert kc.nbytes() == 0


def test_a_depth_the_address_space_cannot_hold_falls_back(memory):
    # 2 PiB of K and V: no address space holds it; the pools grow instead.
    layer = okv.LayerConfig(okv.Flat(), 64, 4096)
    cfg = okv.CacheConfig(1 << 31, 1, [layer], initial_capacity=1, max_step=4)
    kv = okv.KvSequenceCache(cfg)
    assert kv.pool_memory == "grow"
    kv.control().begin_step(2)
    r = np.full((64, 2, 4096), 0.5, np.float32)
    kv.update(0, r, r)
    assert kv.nbytes() == 2 * 64 * 2 * 4096 * 4


def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/statm is Linux's")
def test_resident_memory_drops_after_clear_and_trim(monkeypatch):
    monkeypatch.setenv("OFFGRAPH_KV_POOLS", "reserve")
    layer = okv.LayerConfig(okv.Flat(), 8, 128)
    cfg = okv.CacheConfig(8192, 1, [layer], max_step=512)
    kv = okv.KvSequenceCache(cfg)
    r = np.full((8, 512, 128), 0.25, np.float32)
    rows = 2 * 8 * 8192 * 128 * 4  # 64 MiB of K and V
    base = rss()
    for _ in range(16):
        kv.control().begin_step(512)
        kv.update(0, r, r)
    full = rss()
    assert full - base >= rows * 0.9
    kv.control().clear()
    assert full - rss() >= rows * 0.9

    kc = okv.KvCellCache(cfg, 8192, n_seq_max=8)
    b = kc.control()
    seqs = [b.seq_new() for _ in range(8)]
    for s in seqs:
        for chunk in range(2):
            b.begin_step([s] * 512, list(range(chunk * 512, chunk * 512 + 512)))
            kc.update(0, r, r)
    full = rss()
    for s in seqs[1:]:
        b.seq_free(s)
    kc.trim()
    assert full - rss() >= rows * 7 / 8 * 0.9
