"""The host tier (store/host.py) on raw KvCellCaches with synthetic rows, and chunk snapshots
through the bindings: shared chunks are stored once, the LRU bound holds, a damaged chunk is
dropped and a miss, ring-incomplete chains are never served."""

from __future__ import annotations

import numpy as np
import offgraph_kv as okv
import pytest
from offgraph_kv.store import HostTier

H, D, C = 2, 8, 4  # heads, head_dim, chunk tokens


def make(window: int | None = None, n_cells: int = 128, max_step: int = 4) -> okv.KvCellCache:
    flat = okv.LayerConfig(okv.Flat(), H, D)
    layers = [flat, flat]
    if window is not None:
        layers = [okv.LayerConfig(okv.Ring(window=window), H, D), flat]
    cfg = okv.CacheConfig(256, 2, layers, initial_capacity=2, max_step=max_step)
    return okv.KvCellCache(cfg, n_cells, n_seq_max=16)


def rows(tokens: list[int], p0: int, layer: int, v: bool) -> np.ndarray:
    """Rows that depend on the token and its position only (a prefix gives the same rows)."""
    t = np.asarray(tokens, dtype=np.float32)[None, :, None]
    pos = np.arange(p0, p0 + len(tokens), dtype=np.float32)[None, :, None]
    h = np.arange(H, dtype=np.float32)[:, None, None]
    d = np.arange(D, dtype=np.float32)[None, None, :]
    return np.sin(t * 0.37 + pos * 0.11 + h * 1.3 + d * 0.7 + layer + (0.5 if v else 0.0))


def feed(kc: okv.KvCellCache, tokens: list[int], seq: int | None = None, step: int = 4) -> int:
    seq = kc.seq_new() if seq is None else seq
    p = kc.next_pos(seq)
    while p < len(tokens):
        part = tokens[p : p + step]
        kc.begin_step([seq] * len(part), list(range(p, p + len(part))))
        for layer in range(2):
            kc.update(layer, rows(part, p, layer, False), rows(part, p, layer, True))
        p += len(part)
    return seq


def cache_state(kc: okv.KvCellCache) -> tuple:
    live = tuple(kc.live_seqs)
    return (kc.free_cells, kc.nbytes(), live)


def toks(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(1, 1000, n).tolist()


def test_chunks_round_trip_through_the_bindings():
    kc = make(window=6)
    s = feed(kc, toks(14, 0))
    parts = [kc.save_seq_chunk(s, a, b) for a, b in [(0, 4), (4, 8), (8, 14)]]
    info = okv.snapshot_info(parts[2])
    assert (info["kind"], info["start"], info["end"]) == ("chunk", 8, 14)
    other = make(window=6)
    t = other.load_seq_chunks(parts)
    assert other.next_pos(t) == 14 and other.seq_len(t) == 14
    assert other.save_seq(t) == kc.save_seq(s)
    before = cache_state(other)
    with pytest.raises(okv.SnapshotError):
        other.load_seq_chunks(parts[1:])
    with pytest.raises(okv.SnapshotError):
        other.load_seq_chunks([parts[0], parts[2]])
    assert cache_state(other) == before


def test_shared_chunks_are_stored_once():
    kc = make()
    tier = HostTier(1 << 20, chunk_tokens=C)
    shared = toks(3 * C, 1)
    a = shared + toks(C + 2, 2)
    b = shared + toks(C + 1, 3)
    sa, sb = feed(kc, a), feed(kc, b)
    assert tier.evicted(kc, sa, a) == 4
    one = tier.stats()["host_cache_bytes"] // 4
    assert tier.evicted(kc, sb, b) == 1  # only its own tail chunk
    st = tier.stats()
    assert st["host_cache_chunks"] == 5 and st["host_cache_bytes"] == 5 * one
    # Evicting the same sequence again adds nothing.
    assert tier.evicted(kc, sa, a) == 0 and tier.stats()["host_cache_bytes"] == 5 * one
    kc.seq_free(sa)
    kc.seq_free(sb)
    # A prompt sharing a's first 4 chunks and more restores 16 tokens, rows as fed.
    prompt = a[: 4 * C] + toks(3, 4)
    seq, n = tier.admit(kc, prompt, 0)
    assert n == 4 * C and kc.next_pos(seq) == 4 * C
    ref = make()
    r = feed(ref, a[: 4 * C])
    assert kc.save_seq(seq) == ref.save_seq(r)
    # Not more than `live` already held: nothing.
    assert tier.admit(kc, prompt, 4 * C) == (None, 0)
    st = tier.stats()
    assert st["host_cache_hits"] == 1 and st["host_cache_tokens_restored"] == 4 * C
    assert st["host_cache_misses"] == 0


def test_the_lru_bound_holds_and_heads_outlive_tails():
    kc = make()
    probe = HostTier(1 << 20, chunk_tokens=C)
    p0 = toks(4 * C, 5)
    s0 = feed(kc, p0)
    probe.evicted(kc, s0, p0)
    one = probe.stats()["host_cache_bytes"] // 4
    tier = HostTier(6 * one, chunk_tokens=C)
    p1 = toks(4 * C, 6)
    s1 = feed(kc, p1)
    tier.evicted(kc, s0, p0)
    tier.evicted(kc, s1, p1)  # 8 chunks in 6 chunks' room: p0's last two go
    st = tier.stats()
    assert st["host_cache_bytes"] <= 6 * one and st["host_cache_chunks"] == 6
    assert st["host_cache_evictions"] == 2
    seq, n = tier.admit(kc, p0 + [1], 0)
    assert n == 2 * C  # p0's head survived its tail
    kc.seq_free(seq)
    seq, n = tier.admit(kc, p1 + [1], 0)
    assert n == 4 * C
    kc.seq_free(seq)
    # A sequence larger than the tier: its head is kept, the bound holds.
    small = HostTier(3 * one, chunk_tokens=C)
    assert small.evicted(kc, s1, p1) == 3
    assert small.stats()["host_cache_bytes"] == 3 * one
    assert small.admit(kc, p1 + [1], 0)[1] == 3 * C
    # A tier of 0 bytes holds nothing and serves nothing.
    off = HostTier(0, chunk_tokens=C)
    assert off.evicted(kc, s0, p0) == 0 and off.admit(kc, p0 + [1], 0) == (None, 0)
    assert off.stats()["host_cache_chunks"] == 0


def test_a_damaged_chunk_is_dropped_and_a_miss():
    kc = make()
    tier = HostTier(1 << 20, chunk_tokens=C)
    p = toks(2 * C + 1, 7)
    s = feed(kc, p)
    tier.evicted(kc, s, p)
    kc.seq_free(s)
    first = next(ch for ch in tier._chunks.values() if ch.start == 0)
    bad = bytearray(first.blob)
    bad[len(bad) // 2] ^= 1
    first.blob = bytes(bad)
    before = cache_state(kc)
    assert tier.admit(kc, p, 0) == (None, 0)
    assert cache_state(kc) == before
    st = tier.stats()
    assert st["host_cache_chunks"] == 1 and st["host_cache_misses"] == 1
    assert st["host_cache_hits"] == 0
    # No room in the pool is a miss that keeps the chunks.
    tier.evicted(kc, feed(kc, p), p)
    small = make(n_cells=C)
    before = cache_state(small)
    assert tier.admit(small, p, 0) == (None, 0)
    assert cache_state(small) == before and tier.stats()["host_cache_chunks"] == 2


def test_ring_incomplete_chains_are_not_served_and_get_replaced():
    # Window 6, max_step 4: the ring table keeps 9 positions of a sequence.
    kc = make(window=6)
    tier = HostTier(1 << 20, chunk_tokens=C)
    long = toks(6 * C, 8)  # 24 tokens: ring rows of positions >= 15 only
    s = feed(kc, long)
    tier.evicted(kc, s, long)
    kc.seq_free(s)
    short = long[: 2 * C] + toks(3, 9)  # a chain ending at 8 needs ring rows from 3
    before = cache_state(kc)
    assert tier.admit(kc, short, 0) == (None, 0)
    assert cache_state(kc) == before
    # The full prompt's chain ends ring-complete.
    seq, n = tier.admit(kc, long + [5], 0)
    assert n == 6 * C
    kc.seq_free(seq)
    # A sequence that ended at 9 holds ring rows of chunks 0 and 1: they replace the old ones.
    t = feed(kc, long[:9])
    assert tier.evicted(kc, t, long[:9]) == 2
    seq, n = tier.admit(kc, short, 0)
    assert n == 2 * C


def test_bad_arguments_are_refused():
    for bad in (-1, 1.5, "1", True):
        with pytest.raises(okv.InvalidArgumentError):
            HostTier(bad)
    with pytest.raises(okv.InvalidArgumentError):
        HostTier(10, chunk_tokens=0)
    tier = HostTier(10)
    tier.bind(object)
    with pytest.raises(okv.InvalidArgumentError):
        tier.bind(int)


@pytest.mark.parametrize("name", ["gemma3", "llama"])
def test_a_generator_restores_evicted_prompts_from_the_tier(name):
    """Tiny random models (the Gemma 3 one slides a window of 8): a prompt evicted for room comes
    back from the tier, and every output is what ``model.generate`` gives alone."""
    from model_helpers import reference, tiny_model
    from offgraph_kv.hf import BatchGenerator

    model = tiny_model(name, seed=0, num_hidden_layers=4)
    # Room for one 33-token session only (the all-sliding tiny Gemma holds 15 per sequence).
    cells = 64 if name == "llama" else 24
    tier = HostTier(1 << 24, chunk_tokens=C)
    gen = BatchGenerator(model, n_cells=cells, max_batch_tokens=8, host_cache_bytes=tier)
    a, b = toks(30, 10), toks(30, 11)
    a = [t % 127 + 1 for t in a]
    b = [t % 127 + 1 for t in b]
    # Shares 28 tokens with a: the chain to 28 carries the ring rows from 21 its next step needs.
    follow = a[:28] + [3, 4, 5]
    for p in (a, b, follow):
        assert gen.generate([p], 4) == [reference(model, p, 4)[0]]
    st = gen.stats
    assert st["evictions"] >= 1 and st["host_cache_hits"] == 1
    assert st["host_cache_tokens_restored"] == 28 and st["prefix_tokens_reused"] == 28


def test_the_generator_refuses_a_bad_tier_size():
    from model_helpers import tiny_model
    from offgraph_kv.hf import BatchGenerator

    model = tiny_model("llama", seed=0, num_hidden_layers=1)
    for bad in ("1G", 1.5, True, -1):
        with pytest.raises(okv.InvalidArgumentError):
            BatchGenerator(model, n_cells=16, host_cache_bytes=bad)
    tier = HostTier(1 << 20)
    BatchGenerator(model, n_cells=16, host_cache_bytes=tier)
    other = tiny_model("llama", seed=1, num_hidden_layers=1)
    with pytest.raises(okv.InvalidArgumentError):  # one tier, one model
        BatchGenerator(other, n_cells=16, host_cache_bytes=tier)
