"""The prefix store for KvCellCache sequences and BatchGenerator(store=...), on tiny
random-weight models (no downloads): a second generator's first request restores the prefix the
first one saved as it prefilled, and generates what ``model.generate`` does."""

from __future__ import annotations

import warnings

import offgraph_kv as okv
import pytest
import torch
from model_helpers import reference as greedy_reference
from model_helpers import tiny_model
from offgraph_kv.hf import BatchGenerator
from offgraph_kv.store import MemoryBackend, PrefixStore, StoreWarning

CHUNK = 8


def tiny(name: str, seed: int = 0):
    return tiny_model(name, seed=seed, num_hidden_layers=4)


def tokens(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, 128, (n,), generator=g).tolist()


def reference(model, prompt: list[int], n: int) -> list[int]:
    return greedy_reference(model, prompt, n)[0]


@pytest.mark.parametrize("name", ["gemma3", "llama"])
def test_a_second_generator_restores_the_prefix_the_first_saved(name):
    model = tiny(name)
    store = PrefixStore(MemoryBackend(1 << 26), chunk_tokens=CHUNK)
    prompt = tokens(40, 1)
    first = BatchGenerator(model, n_cells=256, max_batch_tokens=16, store=store)
    assert first.generate([prompt], 6) == [reference(model, prompt, 6)]
    st = first.stats
    # Saved as the prefill passed each boundary: 8, 16, 24, 32 and 40.
    assert st["store_chunks_saved"] == 5 and st["store_tokens_loaded"] == 0
    second = BatchGenerator(model, n_cells=256, max_batch_tokens=16, store=store)
    assert second.generate([prompt], 6) == [reference(model, prompt, 6)]
    st = second.stats
    assert st["store_loads"] == 1 and st["store_tokens_loaded"] == 32  # at most len - 1
    assert st["prefix_tokens_reused"] == 32 and st["prefill_tokens"] == 8
    # Another prompt sharing 20 tokens: the 16-token prefix from the store.
    other = prompt[:20] + tokens(9, 2)
    third = BatchGenerator(model, n_cells=256, max_batch_tokens=16, store=store)
    assert third.generate([other], 5) == [reference(model, other, 5)]
    assert third.stats["store_tokens_loaded"] == 16
    # A live sequence holding more than the store: no load.
    assert third.generate([prompt[:20] + tokens(4, 3)], 2)
    assert third.stats["store_loads"] == 1


def test_other_weights_of_the_same_shape_miss():
    a, b = tiny("llama", 0), tiny("llama", 1)
    backend = MemoryBackend(1 << 26)
    prompt = tokens(30, 4)
    BatchGenerator(a, 256, max_batch_tokens=16, store=PrefixStore(backend, CHUNK)).generate(
        [prompt], 2
    )
    gen = BatchGenerator(b, 256, max_batch_tokens=16, store=PrefixStore(backend, CHUNK))
    assert gen.generate([prompt], 4) == [reference(b, prompt, 4)]
    assert gen.stats["store_tokens_loaded"] == 0


def cell_cache():
    layers = [okv.LayerConfig(okv.Ring(window=8), 2, 16), okv.LayerConfig(okv.Flat(), 2, 16)]
    cfg = okv.CacheConfig(512, 2, layers, initial_capacity=8, max_step=16)
    return okv.KvCellCache(cfg, 128, n_seq_max=8)


def fill(kc, toks, store=None):
    """Writes ``toks`` in steps of 16, saving to ``store`` after each (as a prefill would)."""
    seq = kc.seq_new()
    for s in range(0, len(toks), 16):
        part = toks[s : s + 16]
        kc.begin_step([seq] * len(part), list(range(s, s + len(part))))
        for layer in range(2):
            x = torch.tensor(part, dtype=torch.float32)[None, :, None] * 0.01 + layer
            x = (x + torch.arange(16.0) * 0.1).expand(2, len(part), 16).contiguous().numpy()
            kc.update(layer, x, -x)
        if store is not None:
            res = store.save_seq(kc, seq, toks[: s + len(part)])
            assert res.failed == []
    return seq


def state(kc):
    return [kc.seq_len(s) for s in range(64) if _live(kc, s)], kc.free_cells


def _live(kc, s):
    try:
        kc.seq_len(s)
        return True
    except okv.CacheError:
        return False


def test_cell_save_and_load_round_trip_and_refusals():
    store = PrefixStore(MemoryBackend(1 << 24), chunk_tokens=CHUNK, model="toy")
    toks = tokens(30, 5)
    kc = cell_cache()
    seq = fill(kc, toks, store)
    assert store.stats()["keys"] == 3 and store.save_seq(kc, seq, toks).present == 3
    # After the fact, the ring table no longer holds chunk 0's tail: reported, not written.
    late = PrefixStore(MemoryBackend(1 << 24), chunk_tokens=CHUNK, model="toy")
    with pytest.warns(StoreWarning, match="could not write 1 of 3"):
        res = late.save_seq(kc, seq, toks)
    assert res == 2 and [k for k, _ in res.failed] == [0]
    other = cell_cache()
    got, n = store.load_seq(other, toks)
    assert n == 24 and other.seq_len(got) == 24
    assert other.save_seq(got) == kc.save_seq(seq, 24)  # the same rows, bit for bit
    # A prompt of exactly 24 tokens restores 16 (at most len - 1).
    assert store.load_seq(cell_cache(), toks[:24])[1] == 16
    # No room: a miss, nothing changes, the value stays.
    tight = okv.KvCellCache(kc.config, 8, n_seq_max=2)
    before = state(tight)
    with pytest.warns(StoreWarning, match="refused"):
        assert store.load_seq(tight, toks) == (None, 0)
    assert state(tight) == before and store.stats()["keys"] == 3


def test_crafted_cell_values_are_misses_and_deleted():
    backend = MemoryBackend(1 << 24)
    store = PrefixStore(backend, chunk_tokens=CHUNK, model="toy")
    toks = tokens(30, 6)
    kc = cell_cache()
    fill(kc, toks, store)
    keys = sorted(backend._data, key=lambda k: len(backend._data[k]))  # chunk 0, 1, 2
    good = {k: backend._data[k] for k in keys}
    # Chunk 1's value under chunk 2's key (another range): refused before the core sees it.
    backend._data[keys[2]] = good[keys[1]]
    target = cell_cache()
    with pytest.warns(StoreWarning, match="bad"):
        got, n = store.load_seq(target, toks)
    assert n == 16 and keys[2] not in backend._data
    # A damaged snapshot (a row byte flipped; the value's header checksum still holds).
    bad = bytearray(good[keys[2]])
    bad[-20] ^= 0x40
    backend._data[keys[2]] = bytes(bad)
    target = cell_cache()
    with pytest.warns(StoreWarning, match="damaged"):
        got, n = store.load_seq(target, toks)
    assert n == 16 and keys[2] not in backend._data
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert store.load_seq(cell_cache(), toks[:17])[1] == 16
