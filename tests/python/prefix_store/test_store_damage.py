"""Values the core refuses for their contents (checksums recomputed, flags claiming complete)
are deleted and the store heals: a sequence chunk whose ring layer carries more positions than
its slots, a cell chunk whose ring positions are shifted or reach below the tail the next step
needs (deleted also where the cache has no room for it), a value whose flags lie."""

from __future__ import annotations

import struct
import warnings
import zlib

import offgraph_kv as okv
import pytest
from offgraph_kv.store import MemoryBackend, PrefixStore, StoreWarning
from offgraph_kv.store.format import KIND_CELL, KIND_SEQ, decode_value, encode_value, tokens_bytes

from .test_store_cells import cell_cache, fill, state, tokens
from .test_store_prefix import D, H, prompt, rows

HEADER, PRINT = 16, 27
ROW = D * 4  # float32 rows of one head


def narrow_config():
    """Ring layers of window 8 and max_step 2: 9 slots each, fewer than a 20-token chunk."""
    layers = [
        okv.LayerConfig(okv.Ring(window=8), H, D),
        okv.LayerConfig(okv.Flat(), H, D),
        okv.LayerConfig(okv.Ring(window=8), H, D),
    ]
    return okv.CacheConfig(256, 3, layers, initial_capacity=4, max_step=2)


def narrow_prefill(kv, toks):
    while kv.length < len(toks):
        p = kv.length
        part = toks[p : p + 2]
        kv.begin_step(len(part))
        for layer in range(3):
            kv.update(layer, rows(layer, part, p), rows(layer, part, p, 0.5))


def with_crc(body):
    return bytes(body) + struct.pack("<I", zlib.crc32(bytes(body)))


def with_ring_from(snap, layer, new_from, n_layers=3):
    """The sequence snapshot with ``layer`` carrying ``[new_from, end)`` as zero rows."""
    st = HEADER + n_layers * PRINT
    end = struct.unpack_from("<Q", snap, st + 8)[0]
    froms = [struct.unpack_from("<Q", snap, st + 16 + 8 * i)[0] for i in range(n_layers)]
    out = bytearray(snap[: st + 16])
    for i, f in enumerate(froms):
        out += struct.pack("<Q", new_from if i == layer else f)
    at = st + 16 + 8 * n_layers
    for i, f in enumerate(froms):
        size = H * (end - f) * 2 * ROW
        out += bytes(H * (end - new_from) * 2 * ROW) if i == layer else snap[at : at + size]
        at += size
    assert at == len(snap) - 4
    return with_crc(out)


def quiet_load(store, cache, toks):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", StoreWarning)
        return store.load(cache, toks)


def test_a_ring_layer_carrying_more_than_its_slots_is_deleted_and_healed():
    backend = MemoryBackend(1 << 24)
    store = PrefixStore(backend, chunk_tokens=20, model="toy")
    toks = prompt(41, seed=21)
    a = okv.KvSequenceCache(narrow_config())
    narrow_prefill(a, toks)
    assert store.save(a, toks) == 2  # chunk 0 incomplete (the ring wrapped), chunk 1 complete
    keys = store.keys(a, toks)
    assert quiet_load(store, okv.KvSequenceCache(narrow_config()), toks) == 40
    # Chunk 0 with layer 0 carrying [0, 20): 20 positions, its ring has 9 slots.
    (value,) = backend.get_many([keys[0]])
    (snap,) = decode_value(value, KIND_SEQ, 0, 20, tokens_bytes(toks[:20]), 1)
    wide = with_ring_from(bytes(snap), 0, 0)
    with pytest.raises(okv.SnapshotError, match="more than its 9 slots"):
        okv.KvSequenceCache(narrow_config()).load_state([wide, a.save_state(40, start=20)])
    backend.set_many([(keys[0], encode_value(KIND_SEQ, 0, 20, toks[:20], [wide], True))])
    b = okv.KvSequenceCache(narrow_config())
    with pytest.warns(StoreWarning, match="chunk 0 is bad"):
        assert store.load(b, toks) == 0
    assert backend.get_many([keys[0]]) == [None] and b.length == 0
    # The next save writes chunk 0 again, and the prompt hits whole.
    assert store.save(a, toks) == 1
    assert quiet_load(store, okv.KvSequenceCache(narrow_config()), toks) == 40


def test_a_cell_chunk_with_shifted_ring_positions_is_deleted_for_the_shorter_prefix():
    backend = MemoryBackend(1 << 24)
    store = PrefixStore(backend, chunk_tokens=8, model="toy")
    toks = tokens(30, 7)
    kc = cell_cache()
    seq0 = fill(kc, toks, store)
    keys = sorted(backend._data, key=lambda k: len(backend._data[k]))  # chunk 0, 1, 2
    (snap,) = decode_value(backend._data[keys[2]], KIND_CELL, 0, 24, tokens_bytes(toks[:24]), 1)
    # Layout after the prints: n_ranges u32, ranges (u64, u64), n_ring u32, ring positions u64.
    ring_at = HEADER + 2 * PRINT + 4 + 16
    (n_ring,) = struct.unpack_from("<I", snap, ring_at)
    body = bytearray(snap[:-4])
    for i in range(n_ring):
        at = ring_at + 4 + 8 * i
        struct.pack_into("<Q", body, at, struct.unpack_from("<Q", body, at)[0] - 5)
    shifted = with_crc(body)
    with pytest.raises(okv.SnapshotError, match="not the held tail"):
        cell_cache().load_seq(shifted)
    backend._data[keys[2]] = encode_value(KIND_CELL, 0, 24, toks[:24], [shifted], True)
    target = cell_cache()
    with pytest.warns(StoreWarning, match="chunk 2 is damaged"):
        seq, n = store.load_seq(target, toks)
    assert n == 16 and target.seq_len(seq) == 16 and keys[2] not in backend._data
    # The next save writes chunk 2 again.
    assert store.save_seq(kc, seq0, toks) == 1
    assert store.load_seq(cell_cache(), toks)[1] == 24


def test_a_value_whose_flags_claim_complete_is_deleted_on_load_and_healed():
    from .test_store_prefix import config, prefill

    backend = MemoryBackend(1 << 24)
    store = PrefixStore(backend, chunk_tokens=8, model="toy")
    toks = prompt(41, seed=12)
    long = okv.KvSequenceCache(config())
    prefill(long, toks)
    assert store.save(long, toks) == 5  # chunks 0-2 lack their ring tail (the ring wrapped)
    keys = store.keys(long, toks)
    # Chunk 2's incomplete snapshot under a flags byte that says complete.
    (value,) = backend.get_many([keys[2]])
    (snap,) = decode_value(value, KIND_SEQ, 16, 24, tokens_bytes(toks[16:24]), 1)
    liar = encode_value(KIND_SEQ, 16, 24, toks[16:24], [bytes(snap)], True)
    backend.set_many([(keys[2], liar)])
    short = okv.KvSequenceCache(config())
    prefill(short, toks[:25])
    store.save(short, toks[:25])  # chunks 1 replaced; chunk 2's head says complete
    with pytest.warns(StoreWarning, match="chunk 2 is bad.*claim"):
        assert store.load(okv.KvSequenceCache(config()), toks[:25]) == 16
    assert backend.get_many([keys[2]]) == [None]
    assert store.save(short, toks[:25]) == 1
    b = okv.KvSequenceCache(config())
    assert store.load(b, toks[:25]) == 24
    ref = okv.KvSequenceCache(config())
    prefill(ref, toks[:24])
    assert b.save_state() == ref.save_state()


def test_a_cell_chunk_with_ring_rows_below_the_tail_is_damage_even_in_a_full_cache():
    # A shared store holds values other processes wrote: ring rows from 9 where the next step
    # needs them from 17 are damage whatever the room, so the value is deleted, not kept as a
    # miss for a cache with more free cells; the nearly full cache is left as it was.
    backend = MemoryBackend(1 << 24)
    store = PrefixStore(backend, chunk_tokens=8, model="toy")
    toks = tokens(30, 7)
    fill(cell_cache(), toks, store)
    keys = sorted(backend._data, key=lambda k: len(backend._data[k]))  # chunk 0, 1, 2
    (snap,) = decode_value(backend._data[keys[2]], KIND_CELL, 0, 24, tokens_bytes(toks[:24]), 1)
    # After the prints: n_ranges u32, [0, 24), n_ring u32, ring positions; then each layer's
    # rows (layer 0 the ring layer: a row per ring position; layer 1 flat: 24). Zero rows.
    ring_at = HEADER + 2 * PRINT + 4 + 16
    ring = list(range(9, 24))
    body = bytes(snap[:ring_at]) + struct.pack(f"<I{len(ring)}Q", len(ring), *ring)
    body += bytes((len(ring) + 24) * 2 * 16 * 4 * 2)
    wide = with_crc(body)
    roomy = cell_cache()
    with pytest.raises(okv.SnapshotError, match="not the held tail"):
        roomy.load_seq(wide)
    backend._data[keys[2]] = encode_value(KIND_CELL, 0, 24, toks[:24], [wide], True)
    full = cell_cache()
    fill(full, tokens(120, 3))  # 8 cells free: neither chunk 2 nor chunk 1 fits
    before = state(full)
    with pytest.warns(StoreWarning) as said:
        assert store.load_seq(full, toks) == (None, 0)
    said = [str(w.message) for w in said]
    assert "chunk 2 is damaged" in said[0] and "not the held tail" in said[0], said
    assert "chunk 1 refused (CapacityError" in said[1], said  # intact: no room, kept
    assert state(full) == before
    assert keys[2] not in backend._data and keys[1] in backend._data
