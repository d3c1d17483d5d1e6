"""Snapshots through the bindings: round trips, chains, SnapshotError with the cache unchanged."""

from __future__ import annotations

import zlib

import numpy as np
import offgraph_kv as okv
import pytest

H, D = 2, 8


def config(max_step=4):
    layers = [
        okv.LayerConfig(okv.Ring(window=8), H, D),
        okv.LayerConfig(okv.Flat(), H, D),
    ]
    return okv.CacheConfig(128, 2, layers, initial_capacity=2, max_step=max_step)


def rows(layer, p0, n, salt=0.0):
    pos = np.arange(p0, p0 + n, dtype=np.float32)[None, :, None]
    h = np.arange(H, dtype=np.float32)[:, None, None]
    d = np.arange(D, dtype=np.float32)[None, None, :]
    return np.sin(pos * 0.37 + h * 1.1 + d * 0.13 + layer * 5.0 + salt).astype(np.float32)


def feed(kv, to, step=4):
    while kv.length < to:
        n = min(step, to - kv.length)
        p = kv.begin_step(n)
        for layer in range(2):
            kv.update(layer, rows(layer, p, n), rows(layer, p, n, 0.5))


def next_step(kv, n=3):
    p = kv.begin_step(n)
    outs = []
    for layer in range(2):
        spec = kv.update(layer, rows(layer, p, n), rows(layer, p, n, 0.5))
        outs.append(okv.attend(rows(layer + 3, p, n), spec, threads=1))
    return outs


def state(kv):
    kv_pools = []
    if kv.length:
        snap = kv.save_state()
        kv_pools.append(snap)
    return (kv.length, kv.high_water, kv.step_open, kv.nbytes(), tuple(kv_pools))


def test_round_trip_is_bit_exact_and_checksummed_like_zlib():
    a = okv.KvSequenceCache(config())
    feed(a, 23)
    data = a.save_state()
    assert isinstance(data, bytes)
    assert zlib.crc32(data[:-4]) == int.from_bytes(data[-4:], "little")
    b = okv.KvSequenceCache(config())
    b.load_state(data)
    assert b.length == 23
    assert b.save_state() == data
    for x, y in zip(next_step(a), next_step(b)):
        assert np.array_equal(x, y)


def test_partial_and_chained_snapshots():
    a = okv.KvSequenceCache(config())
    feed(a, 24)
    part = a.save_state(upto=20)
    b = okv.KvSequenceCache(config())
    b.load_state(part)
    ref = okv.KvSequenceCache(config())
    feed(ref, 20)
    for x, y in zip(next_step(b), next_step(ref)):
        assert np.array_equal(x, y)
    chain = [a.save_state(upto=e, start=s) for s, e in [(0, 8), (8, 16), (16, 24)]]
    assert [okv.snapshot_info(c)["complete"] for c in chain] == [False, False, True]
    c = okv.KvSequenceCache(config())
    c.load_state(chain)
    for x, y in zip(next_step(a), next_step(c)):
        assert np.array_equal(x, y)


@pytest.mark.parametrize(
    "mangle",
    [
        lambda d: d[: len(d) // 2],
        lambda d: d[:-1],
        lambda d: b"",
        lambda d: d[:100] + bytes([d[100] ^ 1]) + d[101:],
        lambda d: b"XKVSNAP\0" + d[8:],
    ],
    ids=["half", "short-by-one", "empty", "bit-flip", "magic"],
)
def test_bad_snapshots_raise_snapshot_error_and_change_nothing(mangle):
    a = okv.KvSequenceCache(config())
    feed(a, 12)
    data = a.save_state()
    b = okv.KvSequenceCache(config())
    feed(b, 0)
    before = state(b)
    with pytest.raises(okv.SnapshotError) as e:
        b.load_state(mangle(data))
    assert isinstance(e.value, okv.CacheError) and isinstance(e.value, ValueError)
    assert state(b) == before
    b.load_state(data)  # the intact data still loads
    assert b.length == 12


def test_foreign_and_non_empty_targets_refused():
    a = okv.KvSequenceCache(config())
    feed(a, 12)
    data = a.save_state()
    other = okv.CacheConfig(128, 2, [okv.LayerConfig(okv.Flat(), H, D)], max_step=4)
    o = okv.KvSequenceCache(other)
    before = state(o)
    with pytest.raises(okv.SnapshotError, match="foreign"):
        o.load_state(data)
    assert state(o) == before
    busy = okv.KvSequenceCache(config())
    feed(busy, 3)
    before = state(busy)
    with pytest.raises(okv.SnapshotError, match="length"):
        busy.load_state(data)
    assert state(busy) == before
    with pytest.raises(okv.DTypeError):
        busy.load_state("not bytes")


def test_cell_sequence_moves_between_caches():
    cfg = config(max_step=4)
    a = okv.KvCellCache(cfg, 64, n_seq_max=4)
    s = a.control().seq_new()
    for p0 in range(0, 20, 4):
        a.control().begin_step([s] * 4, list(range(p0, p0 + 4)))
        for layer in range(2):
            a.update(layer, rows(layer, p0, 4), rows(layer, p0, 4, 0.5))
    blob = a.save_seq(s)
    b = okv.KvCellCache(cfg, 64, n_seq_max=4)
    other = b.control().seq_new()
    b.control().begin_step([other] * 2, [0, 1])
    for layer in range(2):
        b.update(layer, rows(layer, 0, 2, 9.0), rows(layer, 0, 2, 9.5))
    t = b.load_seq(blob)
    assert b.control().next_pos(t) == 20 and b.control().seq_len(t) == 20
    outs = []
    for cache, seq in [(a, s), (b, t)]:
        cache.control().begin_step([seq], [20])
        outs.append(
            [
                okv.attend(
                    rows(layer + 3, 20, 1),
                    cache.update(layer, rows(layer, 20, 1), rows(layer, 20, 1, 0.5)),
                    threads=1,
                )
                for layer in range(2)
            ]
        )
    for x, y in zip(*outs):
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-6)
    before = (b.control().free_cells, b.control().live_seqs)
    with pytest.raises(okv.SnapshotError):
        b.load_seq(blob[:-3])
    assert (b.control().free_cells, b.control().live_seqs) == before
