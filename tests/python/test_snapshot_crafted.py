"""Crafted snapshots with valid checksums through the bindings: a ring range wider
than its layer's depth, an unknown kind or flag, a position past int64. Each is
okv.SnapshotError and the cache keeps its state, pool sizes and bytes included."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import offgraph_kv as okv
import pytest

H, D = 2, 32
HEADER, PRINT = 16, 27


def config(policies, dtype="float32"):
    layers = [okv.LayerConfig(p, H, D) for p in policies]
    return okv.CacheConfig(48, len(layers), layers, initial_capacity=4, max_step=4, dtype=dtype)


def feed(kv, to, n_layers):
    while kv.length < to:
        n = min(4, to - kv.length)
        p = kv.begin_step(n)
        x = np.arange(H * n * D, dtype=np.float32).reshape(H, n, D) * 0.01 + p
        for layer in range(n_layers):
            kv.update(layer, np.sin(x + layer), np.cos(x + layer))


def state(kv, n_layers):
    pools = [kv.pool_slots(layer) for layer in range(n_layers)]
    rows = kv.save_state() if kv.length else b""
    return (kv.length, kv.high_water, kv.step_open, kv.nbytes(), pools, rows)


def with_crc(body):
    return bytes(body) + struct.pack("<I", zlib.crc32(bytes(body)))


def forged(data, at, patch):
    body = bytearray(data[:-4])
    body[at : at + len(patch)] = patch
    return with_crc(body)


def with_ring_range(snap, row_bytes, layer, new_from):
    """The snapshot with `layer` carrying [new_from, end) as zero rows."""
    n_layers = len(row_bytes)
    st = HEADER + n_layers * PRINT
    end = struct.unpack_from("<Q", snap, st + 8)[0]
    froms = [struct.unpack_from("<Q", snap, st + 16 + 8 * i)[0] for i in range(n_layers)]
    out = bytearray(snap[: st + 16])
    for i, f in enumerate(froms):
        out += struct.pack("<Q", new_from if i == layer else f)
    at = st + 16 + 8 * n_layers
    for i, f in enumerate(froms):
        size = H * (end - f) * 2 * row_bytes[i]
        out += (
            bytes(H * (end - new_from) * 2 * row_bytes[i]) if i == layer else snap[at : at + size]
        )
        at += size
    assert at == len(snap) - 4
    return with_crc(out)


@pytest.mark.parametrize(
    "policies, dtype, row, ring",
    [
        ([okv.Ring(window=4), okv.Flat()], "float32", D * 4, 0),
        ([okv.Flat(), okv.Ring(window=5)], "q8_0", D // 32 * 34, 1),
    ],
)
def test_a_ring_range_wider_than_its_depth_is_a_snapshot_error(policies, dtype, row, ring):
    cfg = config(policies, dtype)
    a = okv.KvSequenceCache(cfg)
    feed(a, 30, 2)
    snap = a.save_state()
    depth = okv.ring_keep(policies[ring].window, 4)
    for new_from in (0, 30 - depth - 1):
        bad = with_ring_range(snap, [row, row], ring, new_from)
        for filled in (0, 3):
            b = okv.KvSequenceCache(cfg)
            feed(b, filled, 2)
            before = state(b, 2)
            with pytest.raises(okv.SnapshotError):
                b.load_state(bad)
            assert state(b, 2) == before
    good = with_ring_range(snap, [row, row], ring, 30 - depth)
    b = okv.KvSequenceCache(cfg)
    b.load_state(good)
    assert b.length == 30


@pytest.mark.parametrize(
    "at, values, match", [(10, (3, 0x80, 0xFF), "unknown kind"), (11, (1, 0x80, 0xFF), "flags")]
)
def test_an_unknown_kind_or_flag_is_a_snapshot_error(at, values, match):
    policies = [okv.Ring(window=4), okv.Flat()]
    a = okv.KvSequenceCache(config(policies))
    feed(a, 9, 2)
    snap = a.save_state()
    b = okv.KvSequenceCache(config(policies))
    before = state(b, 2)
    for value in values:
        d = forged(snap, at, bytes([value]))
        with pytest.raises(okv.SnapshotError, match=match):
            okv.snapshot_info(d)
        with pytest.raises(okv.SnapshotError, match=match):
            b.load_state(d)
    assert state(b, 2) == before


def test_another_caches_kind_is_a_snapshot_error():
    # Kind 2 is a cell sequence's chunk: known (snapshot_info reads it), never a sequence
    # cache's state.
    policies = [okv.Ring(window=4), okv.Flat()]
    a = okv.KvSequenceCache(config(policies))
    feed(a, 9, 2)
    d = forged(a.save_state(), 10, bytes([2]))
    assert okv.snapshot_info(d)["kind"] == "chunk"
    b = okv.KvSequenceCache(config(policies))
    before = state(b, 2)
    with pytest.raises(okv.SnapshotError, match="chunk"):
        b.load_state(d)
    assert state(b, 2) == before


def test_a_position_past_int64_is_a_snapshot_error():
    # A ring-only cell cache: a held range at 2**63 and beyond is refused,
    # the largest int64 end loads.
    cfg = config([okv.Ring(window=4)])
    kc = okv.KvCellCache(cfg, 32, n_seq_max=4)
    s = kc.control().seq_new()
    kc.control().begin_step([s], [0])
    x = np.ones((H, 1, D), np.float32)
    kc.update(0, x, x)
    blob = kc.save_seq(s)
    at = HEADER + PRINT
    to = okv.KvCellCache(cfg, 32, n_seq_max=4)

    def held(start, end):
        d = forged(blob, at + 4, struct.pack("<QQ", start, end))
        return forged(d, at + 24, struct.pack("<Q", end - 1))

    ok = to.load_seq(held(2**63 - 2, 2**63 - 1))
    assert to.control().next_pos(ok) == 2**63 - 1
    to.control().seq_free(ok)
    cells_before = (to.control().free_cells, to.control().live_seqs, to.nbytes())
    for start, end in [(2**63 - 1, 2**63), (0, 2**63), (2**63, 2**64 - 2)]:
        with pytest.raises(okv.SnapshotError, match="largest position"):
            to.load_seq(held(start, end))
        with pytest.raises(okv.SnapshotError, match="largest position"):
            okv.snapshot_info(held(start, end))
        assert (to.control().free_cells, to.control().live_seqs, to.nbytes()) == cells_before
