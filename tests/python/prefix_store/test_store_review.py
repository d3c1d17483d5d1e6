"""The prefix store never serves another model's rows and never raises for what a backend
returns: same-shape models, dtypes, crafted chunk values, incomplete chunks healing."""

from __future__ import annotations

import warnings

import offgraph_kv as okv
import pytest
import torch
from offgraph_kv.hf import OffgraphCache
from offgraph_kv.store import MemoryBackend, PrefixStore, StoreWarning
from offgraph_kv.store.format import KIND_SEQ, encode_value
from offgraph_kv.store.identity import weights_digest
from transformers import LlamaConfig, LlamaForCausalLM

from .test_store_prefix import CHUNK, config, decode, decode_ref, prefill, prompt

LLAMA = dict(
    num_hidden_layers=2,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=128,
)


def llama(seed: int, dtype=torch.float32):
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**LLAMA, dtype=dtype)).to(dtype).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def greedy(model, ids: list[int], cache, n: int = 6) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), cache=cache, max_new_tokens=n, do_sample=False)
    return out[0, len(ids) :].tolist()


def saved(model, store, ids):
    cache = OffgraphCache(model.config)
    with torch.no_grad():
        model(torch.tensor([ids]), cache=cache, use_cache=True)
    return store.save(cache, ids)


def test_two_same_shape_models_never_share_keys():
    a, b = llama(0), llama(1)
    ids = list(range(3, 28))
    backend = MemoryBackend(1 << 26)
    assert saved(a, PrefixStore(backend, CHUNK, model=a), ids) == 3
    fresh = OffgraphCache(b.config)
    assert PrefixStore(backend, CHUNK, model=b).load(fresh, ids) == 0
    assert greedy(b, ids, fresh) == greedy(b, ids, OffgraphCache(b.config))
    # The same weights hit.
    again = OffgraphCache(a.config)
    assert PrefixStore(backend, CHUNK, model=a).load(again, ids) == 24


def test_weights_digest_binds_values_and_dtype_and_is_stable():
    a, b = llama(0), llama(1)
    assert weights_digest(a) == weights_digest(llama(0))
    assert weights_digest(a) != weights_digest(b)
    assert weights_digest(a) != weights_digest(llama(0).to(torch.bfloat16))
    with torch.no_grad():
        next(a.parameters()).mul_(1.001)  # a fine-tune moves every sampled element
    assert weights_digest(a) != weights_digest(llama(0))


def test_a_bfloat16_deployment_then_a_float32_model_miss():
    # One name for both (a caller vouching for the checkpoint): the pools' dtype still keys.
    dep, full = llama(0, torch.bfloat16), llama(0)
    ids = list(range(5, 30))
    backend = MemoryBackend(1 << 26)
    assert saved(dep, PrefixStore(backend, CHUNK, model="ckpt"), ids) == 3
    cache = OffgraphCache(full.config)
    assert PrefixStore(backend, CHUNK, model="ckpt").load(cache, ids) == 0
    assert greedy(full, ids, cache) == greedy(full, ids, OffgraphCache(full.config))
    # The bound model's own dtype: the bfloat16 deployment hits its own chunks.
    st = PrefixStore(backend, CHUNK, model=dep)
    saved(dep, st, ids)
    hit = OffgraphCache(dep.config)
    assert st.load(hit, ids) == 24
    assert {kv.config.k_dtype for kv in hit.kv_caches()} == {"bfloat16"}


def seq_store(backend=None):
    return PrefixStore(backend or MemoryBackend(1 << 24), chunk_tokens=CHUNK, model="toy")


def state(kv):
    return (kv.length, kv.high_water, kv.nbytes(), kv.save_state() if kv.length else b"")


def load_checked(store, tokens, want, match):
    """``load`` into a fresh cache: ``want`` tokens, a warning matching ``match``, no raise,
    and the restored cache decodes as a full prefill does."""
    b = okv.KvSequenceCache(config())
    with pytest.warns(StoreWarning, match=match):
        assert store.load(b, tokens) == want
    ref = okv.KvSequenceCache(config())
    prefill(ref, tokens[:want])
    assert state(b) == state(ref)
    prefill(b, tokens)
    for x, y in zip(decode(b, 9), decode_ref(tokens, 9)):
        assert (x == y).all()


def crafted_store():
    backend = MemoryBackend(1 << 24)
    store = seq_store(backend)
    tokens = prompt(41, seed=11)
    a = okv.KvSequenceCache(config())
    prefill(a, tokens)
    assert store.save(a, tokens) == 5
    return backend, store, tokens, a, store.keys(a, tokens)


@pytest.mark.parametrize("which", ["short", "long", "shifted"])
def test_a_chunk_whose_snapshot_holds_another_range_is_a_miss_and_deleted(which):
    backend, store, tokens, a, keys = crafted_store()
    s, e = 32, 40  # the last chunk: the chain before it is complete
    inner = {
        "short": a.save_state(36, start=32),
        "long": a.save_state(41, start=32),
        "shifted": a.save_state(32, start=24),
    }[which]
    backend.set_many([(keys[4], encode_value(KIND_SEQ, s, e, tokens[s:e], [inner], True))])
    load_checked(store, tokens, 32, "chunk 4 is bad")
    assert backend.get_many([keys[4]]) == [None]


def test_a_chunk_of_a_foreign_layout_is_a_miss_and_deleted():
    backend, store, tokens, a, keys = crafted_store()
    layers = [okv.LayerConfig(okv.Ring(window=8), 2, 8)] * 2 + [okv.LayerConfig(okv.Flat(), 2, 8)]
    other = okv.KvSequenceCache(okv.CacheConfig(256, 3, layers, initial_capacity=4, max_step=16))
    while other.length < 40:
        other.begin_step(8)
        for layer in range(3):
            x = torch.rand(2, 8, 8).numpy()
            other.update(layer, x, x)
    inner = other.save_state(40, start=32)
    backend.set_many([(keys[4], encode_value(KIND_SEQ, 32, 40, tokens[32:40], [inner], True))])
    load_checked(store, tokens, 32, "another layout")
    assert backend.get_many([keys[4]]) == [None]


def test_a_damaged_inner_snapshot_is_a_miss_and_deleted():
    backend, store, tokens, a, keys = crafted_store()
    value = bytearray(backend.get_many([keys[4]])[0])
    value[-30] ^= 0x10  # a row byte: the value's header checksum still holds
    backend.set_many([(keys[4], bytes(value))])
    load_checked(store, tokens, 32, "chunk 4 is damaged")
    assert backend.get_many([keys[4]]) == [None]


def test_load_raises_for_nothing_a_backend_returns():
    backend, store, tokens, a, keys = crafted_store()
    # A cache too small for the chain: the core refuses; a miss, the values stay.
    small = okv.KvSequenceCache(okv.CacheConfig(36, 3, config().layers, max_step=16))
    with pytest.warns(StoreWarning, match="refused"):
        assert store.load(small, tokens) == 32
    assert small.length == 32 and all(backend.get_many(keys))

    class Odd:
        def __init__(self, values):
            self.values = values

        def get_many(self, ks):
            return [self.values.get(k) for k in ks]

    for junk in (12, "text", b"", b"OKVCHUNK", RuntimeError("node lost")):
        odd = PrefixStore(Odd({keys[0]: junk}), CHUNK, model="toy")
        odd.backend.delete = lambda ks: None
        b = okv.KvSequenceCache(config())
        with pytest.warns(StoreWarning):
            assert odd.load(b, tokens) == 0
        assert b.length == 0

    class Broken:
        def get_many(self, ks):
            raise ConnectionError("down")

        def delete(self, ks):
            raise ConnectionError("down")

    with pytest.warns(StoreWarning, match="down"):
        assert (
            PrefixStore(Broken(), CHUNK, model="toy").load(okv.KvSequenceCache(config()), tokens)
            == 0
        )


def test_an_incomplete_chunk_is_replaced_when_a_complete_one_is_saved():
    store = seq_store()
    tokens = prompt(41, seed=12)
    long = okv.KvSequenceCache(config())
    prefill(long, tokens)
    assert store.save(long, tokens) == 5  # chunks 0-2 lack their ring tail (the ring wrapped)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert store.load(okv.KvSequenceCache(config()), tokens[:25]) == 0
    short = okv.KvSequenceCache(config())
    prefill(short, tokens[:25])
    res = store.save(short, tokens[:25])
    # Chunks 1 and 2 replaced by complete ones; chunk 0 is incomplete here too (kept).
    assert res.present == 3 and res == 2
    assert store.save(short, tokens[:25]) == 0  # complete now: left alone
    b = okv.KvSequenceCache(config())
    assert store.load(b, tokens[:25]) == 24
    prefill(b, tokens[:25])
    ref = okv.KvSequenceCache(config())
    prefill(ref, tokens[:25])
    assert b.save_state() == ref.save_state()


def test_an_unbound_store_refuses_to_save_or_load():
    store = PrefixStore(MemoryBackend(1 << 20), CHUNK)
    a = okv.KvSequenceCache(config())
    prefill(a, prompt(20))
    before = state(a)
    for call in (store.save, store.load):
        with pytest.raises(okv.InvalidArgumentError, match="no model identity"):
            call(a, prompt(20))
    assert state(a) == before and store.stats()["keys"] == 0


def test_a_remainder_longer_than_a_sliding_max_step_after_a_hit_matches_a_full_prefill():
    # A tiny Gemma 3 (window 8): 12 tokens saved, a 30-token prompt restores 8 and its 22 left
    # exceed the sliding layers' max_step (8): the long-step path on restored layers.
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    model = Gemma3ForCausalLM(Gemma3TextConfig(sliding_window=8, **LLAMA)).eval()
    model.generation_config.eos_token_id = None
    ids = list(range(7, 37))
    store = PrefixStore(MemoryBackend(1 << 24), CHUNK, model=model)
    first = OffgraphCache(model.config, max_step=8)
    with torch.no_grad():
        model(torch.tensor([ids[:12]]), cache=first, use_cache=True)
    assert store.save(first, ids[:12]) == 1
    again = OffgraphCache(model.config, max_step=8)
    assert store.load(again, ids) == 8
    assert greedy(model, ids, again) == greedy(model, ids, OffgraphCache(model.config))


def test_snapshots_load_from_memoryview_slices_in_place_or_copied():
    # A store value's slices reach the core as memoryviews (read in place when contiguous).
    a = okv.KvSequenceCache(config())
    prefill(a, prompt(20))
    data = a.save_state()
    for view in (
        memoryview(b"xx" + data + b"yy")[2:-2],
        memoryview(bytearray(data)),
        memoryview(data).cast("B"),
    ):
        b = okv.KvSequenceCache(config())
        b.load_state([view])
        assert b.save_state() == data
    b = okv.KvSequenceCache(config())
    with pytest.raises(okv.SnapshotError):
        b.load_state(memoryview(data + data)[::2])  # strided: copied, then refused as data
    assert b.length == 0
