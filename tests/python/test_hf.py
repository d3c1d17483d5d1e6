"""OffgraphCache as a drop-in transformers cache: identical generations to DynamicCache on tiny
random-weight Llama, Mistral (sliding), Gemma2 (eager, alternating) and Gemma3 (5:1), with beam
search, left padding, continuation, prompt-lookup decoding, bf16, and the "offgraph" attention."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import offgraph_kv as okv
import pytest
import torch
from cpu_helpers import int8_scores
from model_helpers import tiny_config, tiny_model
from offgraph_kv import hf
from offgraph_kv.hf import ATTN_NAME, OffgraphCache
from transformers import DynamicCache, LlamaForCausalLM

torch.set_num_threads(2)


def make(name: str, attn: str = "sdpa", dtype: torch.dtype = torch.float32):
    over = {"num_hidden_layers": 6} if name == "gemma3" else {}
    model = tiny_model(name, dtype, **over)
    model.set_attn_implementation(attn)
    return model


def prompt(n: int = 12, batch: int = 1, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, 128, (batch, n), generator=g)


def gen(model, ids, cache, n=40, **kw):
    with torch.no_grad():
        return model.generate(
            ids,
            cache=cache,
            max_new_tokens=n,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            **kw,
        )


def assert_same(ref, got, atol=1e-5):
    assert torch.equal(ref.sequences, got.sequences)
    diff = max((a.float() - b.float()).abs().max().item() for a, b in zip(ref.logits, got.logits))
    assert diff <= atol, diff


MODELS = [("llama", "sdpa"), ("mistral", "eager"), ("gemma2", "eager"), ("gemma3", "eager")]


@pytest.mark.parametrize("name,attn", MODELS)
def test_greedy_40_tokens_match_dynamic_cache(name, attn):
    model = make(name, attn)
    ids = prompt(12)
    ref = gen(model, ids, DynamicCache(config=model.config))
    assert ref.sequences.shape[1] == 52
    assert_same(ref, gen(model, ids, OffgraphCache(model.config)))


@pytest.mark.parametrize("name", ["llama", "mistral", "gemma2", "gemma3"])
def test_offgraph_attention_matches_dynamic_cache(name, monkeypatch):
    ref_model = make(name, "eager")
    ids = prompt(12)
    ref = gen(ref_model, ids, DynamicCache(config=ref_model.config))
    calls = []
    attend = hf._okv.attend
    monkeypatch.setattr(hf._okv, "attend", lambda *a, **k: calls.append(1) or attend(*a, **k))
    model = make(name, ATTN_NAME)
    assert_same(ref, gen(model, ids, OffgraphCache(model.config)))
    n_layers = model.config.num_hidden_layers
    if name == "gemma2":  # attention-logit softcap: falls back to plain attention
        assert not calls
    else:  # every layer of the prefill and of the 39 decode steps read the pools
        assert len(calls) == n_layers * 40


def test_long_prompt_on_ring_layers_is_chunked():
    """A 30-token prompt on window-8 ring layers whose max_step is 8: written in four chunks."""
    model = make("mistral", "eager")
    ids = prompt(30)
    ref = gen(model, ids, DynamicCache(config=model.config), n=12)
    cache = OffgraphCache(model.config, max_step=1)
    assert cache.layers[0].max_step == 8
    assert_same(ref, gen(model, ids, cache, n=12))
    assert cache.get_seq_length() == 30 + 12 - 1
    assert cache.layers[0].kv.pool_slots(0) <= 8 + 8 - 1


@pytest.mark.parametrize("name", ["llama", "mistral"])
def test_beam_search_3_beams(name):
    model = make(name, "eager")
    ids = prompt(10)
    kw = dict(num_beams=3, num_return_sequences=3, output_scores=True)
    ref = gen(model, ids, DynamicCache(config=model.config), n=20, **kw)
    got = gen(model, ids, OffgraphCache(model.config), n=20, **kw)
    assert torch.equal(ref.sequences, got.sequences)
    torch.testing.assert_close(ref.sequences_scores, got.sequences_scores, atol=1e-5, rtol=0)


@pytest.mark.parametrize("attn", ["eager", "sdpa", ATTN_NAME])
@pytest.mark.parametrize("name", ["llama", "gemma3"])
def test_batch_of_two_with_left_padding(name, attn):
    model = make(name, attn)
    ids = prompt(14, batch=2)
    mask = torch.ones_like(ids)
    ids[1, :5] = 0
    mask[1, :5] = 0
    ref_model = make(name, "eager")
    ref = gen(ref_model, ids, DynamicCache(config=model.config), n=30, attention_mask=mask)
    got = gen(model, ids, OffgraphCache(model.config), n=30, attention_mask=mask)
    assert_same(ref, got, atol=1e-5)


@pytest.mark.parametrize("name", ["llama", "gemma3"])
def test_continue_generation_from_returned_cache(name):
    model = make(name, "eager")
    ids = prompt(12)
    ref_cache, cache = DynamicCache(config=model.config), OffgraphCache(model.config)
    ref1, got1 = gen(model, ids, ref_cache, n=15), gen(model, ids, cache, n=15)
    assert_same(ref1, got1)
    assert cache.get_seq_length() == 12 + 15 - 1  # the last token is not fed yet
    ref2 = gen(model, ref1.sequences, ref_cache, n=15)
    got2 = gen(model, got1.sequences, cache, n=15)
    assert_same(ref2, got2)
    # and the continuation is what one 30-token run gives
    once = gen(model, ids, OffgraphCache(model.config), n=30)
    assert torch.equal(once.sequences, got2.sequences)


@pytest.mark.parametrize("name", ["llama", "mistral", "gemma3"])
def test_prompt_lookup_decoding_matches_greedy(name):
    model = make(name, "eager")
    base = prompt(6)
    ids = torch.cat([base, base, base, base], dim=1)  # repetitive, so lookups find candidates
    greedy = gen(model, ids, DynamicCache(config=model.config), n=30)
    cache = OffgraphCache(model.config)
    assert cache.is_croppable
    with torch.no_grad():
        out = model.generate(
            ids, cache=cache, max_new_tokens=30, do_sample=False, prompt_lookup_num_tokens=4
        )
    assert torch.equal(greedy.sequences, out)
    assert cache.get_seq_length() == ids.shape[1] + 30 - 1


@pytest.mark.parametrize("attn", ["sdpa", ATTN_NAME])
def test_bf16_model(attn):
    model = make("gemma3", attn, dtype=torch.bfloat16)
    ref_model = make("gemma3", "sdpa", dtype=torch.bfloat16)
    ids = prompt(12)
    ref = gen(ref_model, ids, DynamicCache(config=model.config))
    cache = OffgraphCache(model.config)
    got = gen(model, ids, cache)
    assert model.dtype == torch.bfloat16 and cache.layers[0].dtype == torch.bfloat16
    if attn == "sdpa":  # bf16 -> f32 -> bf16 is exact, so the attention sees the same tensors
        assert_same(ref, got, atol=0)
    else:  # attend accumulates in f32 where bf16 sdpa rounds: teacher-force the reference
        # tokens one at a time and compare every step's logits loosely
        assert got.sequences.shape == ref.sequences.shape
        ref_cache, cache = DynamicCache(config=model.config), OffgraphCache(model.config)
        seq = ref.sequences
        with torch.no_grad():
            for step in range(12, seq.shape[1]):
                lo = 0 if step == 12 else step - 1
                a = ref_model(seq[:, lo:step], cache=ref_cache).logits[:, -1].float()
                b = model(seq[:, lo:step], cache=cache).logits[:, -1].float()
                assert (a - b).abs().max().item() < 0.05


def test_f16_model_update_roundtrip():
    cache = OffgraphCache(make("llama").config)
    k = torch.randn(1, 2, 5, 16).to(torch.float16)
    v = torch.randn(1, 2, 5, 16).to(torch.float16)
    ko, vo = cache.update(k, v, 0)
    assert ko.dtype == torch.float16 and torch.equal(ko, k) and torch.equal(vo, v)


def test_update_returns_zero_copy_views_and_mask_sizes_match():
    model = make("gemma3")
    cache = OffgraphCache(model.config)
    full, ring = cache.layers[5], cache.layers[0]
    assert not full.is_sliding and ring.is_sliding and ring.window == 8
    rng = torch.Generator().manual_seed(0)
    length = 0
    for t in [5, 1, 1, 1, 1, 4, 1, 1, 1, 1, 1, 3, 1]:
        for layer in (0, 5):
            n, off = cache.get_mask_sizes(t, layer)
            k = torch.randn(2, 2, t, 16, generator=rng)
            ko, vo = cache.update(k, k + 1, layer)
            assert ko.shape == (2, 2, n, 16) and vo.shape == ko.shape
            assert off == (0 if layer == 5 else max(length - 7, 0))
            torch.testing.assert_close(ko[:, :, -t:], k, atol=0, rtol=0)
            spec = cache.layers[layer].kv.spec(0)
            if len(spec.read) == 1:  # one run: a view into the pool, no copy
                assert np.shares_memory(ko.numpy(), spec.k)
        length += t
        assert cache.get_seq_length() == length
    # crop rewinds both kinds of layers; the next step overwrites
    cache.crop(-3)
    assert cache.get_seq_length() == length - 3
    with pytest.raises(ValueError):
        cache.crop(2)


def test_reorder_cache_gathers_rows():
    cache = OffgraphCache(make("mistral").config)
    k = torch.arange(3 * 2 * 10 * 16, dtype=torch.float32).reshape(3, 2, 10, 16)
    cache.update(k, -k, 0)
    cache.reorder_cache(torch.tensor([2, 2, 0]))
    ko, vo = cache.update(torch.zeros(3, 2, 1, 16), torch.zeros(3, 2, 1, 16), 0)
    torch.testing.assert_close(ko[:, :, :-1], k[[2, 2, 0], :, -7:], atol=0, rtol=0)
    torch.testing.assert_close(vo[:, :, :-1], -k[[2, 2, 0], :, -7:], atol=0, rtol=0)
    cache.batch_select_indices(torch.tensor([1]))
    assert cache.layers[0].batch_size == 1 and cache.get_seq_length() == 11


def test_deep_crop_of_a_ring_layer_is_refused():
    cache = OffgraphCache(make("mistral").config, max_step=8)
    for _ in range(40):
        cache.update(torch.zeros(1, 2, 1, 16), torch.zeros(1, 2, 1, 16), 0)
    with pytest.raises(okv.CacheError):
        cache.crop(-20)
    assert cache.get_seq_length() == 40


def test_unsupported_layer_types_are_refused():
    cfg = tiny_config("llama")
    cfg.layer_types = ["full_attention", "chunked_attention"]
    cfg.attention_chunk_size = 4
    with pytest.raises(NotImplementedError):
        OffgraphCache(cfg)


def test_importing_offgraph_kv_does_not_import_torch():
    code = "import sys, offgraph_kv; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("attn", ["eager", ATTN_NAME])
def test_second_turn_longer_than_max_step_matches_dynamic_cache(attn):
    """A continued cache whose ring pools reached full depth, then a turn of more than max_step
    tokens: the chunked writes must not overwrite the prior window before it is returned."""
    # window 8, max_step raised to 8: ring depth 15. The full layer lets the last query see
    # every position the ring layers produced, including those of the turn's first chunk.
    model = make("gemma3", attn)
    ids = prompt(20)
    ref_cache, cache = DynamicCache(config=model.config), OffgraphCache(model.config, max_step=1)
    ref1, got1 = gen(model, ids, ref_cache, n=6), gen(model, ids, cache, n=6)
    assert_same(ref1, got1)
    turn = prompt(19, seed=2)  # more than max_step new tokens in one forward
    ref2 = gen(model, torch.cat([ref1.sequences, turn], 1), ref_cache, n=8)
    got2 = gen(model, torch.cat([got1.sequences, turn], 1), cache, n=8)
    assert_same(ref2, got2)


def _filled(name: str, batch: int, steps: int, **kw) -> tuple[OffgraphCache, torch.Tensor]:
    """A cache fed `steps` single-token steps on every layer; returns it and the K history
    ``[batch, 2, steps, 16]`` (V is -K)."""
    cache = OffgraphCache(make(name).config, **kw)
    hist = torch.arange(batch * 2 * steps * 16, dtype=torch.float32).reshape(batch, 2, steps, 16)
    for t in range(steps):
        for layer in range(len(cache.layers)):
            k = hist[:, :, t : t + 1]
            cache.update(k, -k, layer)
    return cache, hist


@pytest.mark.parametrize("op", ["reorder", "select", "repeat", "long_step"])
def test_batch_ops_after_a_crop_deeper_than_the_last_step(op):
    """After crop(-5) following single-token steps the ring still holds the window; every batch op
    (and a step longer than max_step) reads it from the cache, not from the last step's runs."""
    cache, hist = _filled("mistral", 2, 30, max_step=8)  # ring depth 8 + 8 - 1 = 15
    cache.crop(-5)
    assert cache.get_seq_length() == 25
    hist = hist[:, :, :25]
    new = torch.full((2, 2, 1, 16), -7.0)
    if op == "reorder":
        cache.reorder_cache(torch.tensor([1, 0]))
        hist = hist[[1, 0]]
    elif op == "select":
        cache.batch_select_indices(torch.tensor([1]))
        hist, new = hist[[1]], new[:1]
    elif op == "repeat":
        cache.batch_repeat_interleave(2)
        hist, new = hist.repeat_interleave(2, dim=0), new.repeat_interleave(2, dim=0)
    else:
        new = torch.full((2, 2, 10, 16), -7.0)
    ko, vo = cache.update(new, -new, 0)
    want = torch.cat([hist[:, :, -7:], new], dim=2)
    torch.testing.assert_close(ko, want, atol=0, rtol=0)
    torch.testing.assert_close(vo, -want, atol=0, rtol=0)
    assert cache.get_seq_length() == 25 + new.shape[2]


def _state(cache: OffgraphCache) -> list:
    """Per layer: length, the held range and the held K/V rows, read from the pools."""
    out = []
    for layer in cache.layers:
        lo, hi = layer.kv.held_range(0)
        kp, vp = layer._views[2], layer._views[3]
        runs = layer.kv.held_runs(0, lo, hi)
        k = torch.cat([kp[:, :, s : s + n] for s, n in runs], dim=2)
        v = torch.cat([vp[:, :, s : s + n] for s, n in runs], dim=2)
        out.append((layer.kv.length, lo, hi, k.clone(), v.clone()))
    return out


def test_refused_crop_changes_no_layer():
    """transformers' Cache.crop crops layer by layer: a ring layer refusing after a flat layer
    was cropped would leave the layers at different lengths. Every layer is checked first."""
    cfg = tiny_config("gemma3", layer_types=["full_attention", "sliding_attention"])
    cache = OffgraphCache(cfg, max_step=8)
    assert [layer.is_sliding for layer in cache.layers] == [False, True]
    rng = torch.Generator().manual_seed(3)
    for _ in range(40):
        for layer in range(2):
            k = torch.randn(1, 2, 1, 16, generator=rng)
            cache.update(k, k + 1, layer)
    before = _state(cache)
    with pytest.raises(okv.CacheError, match="layer 1"):
        cache.crop(-20)
    after = _state(cache)
    for a, b in zip(before, after):
        assert a[:3] == b[:3]
        assert torch.equal(a[3], b[3]) and torch.equal(a[4], b[4])
    cache.crop(-8)  # within max_step: every layer rewinds
    assert [layer.kv.length for layer in cache.layers] == [32, 32]


def test_cache_shorter_than_the_sliding_window_matches_dynamic_cache():
    """max_cache_len below the window: the ring layers hold every position (a full layer)."""
    model = make("gemma3", "eager")  # window 8
    ids = prompt(4)
    ref = gen(model, ids, DynamicCache(config=model.config), n=3)
    cache = OffgraphCache(model.config, max_cache_len=6)
    assert_same(ref, gen(model, ids, cache, n=3))
    assert cache.get_seq_length() == 6


@pytest.mark.parametrize("op", ["reorder", "select"])
def test_a_crop_after_a_batch_op_finds_every_held_row_reordered(op):
    """A batch op reorders every row the ring holds, not only the visible window: a later crop
    within max_step brings older rows back into the window."""
    cache, hist = _filled("mistral", 2, 30, max_step=8)  # ring depth 15: holds [15, 30)
    idx = torch.tensor([1, 0]) if op == "reorder" else torch.tensor([1])
    if op == "reorder":
        cache.reorder_cache(idx)
    else:
        cache.batch_select_indices(idx)
    hist = hist[idx]
    assert cache.layers[0].kv.held_range(0) == (15, 30)
    cache.crop(-8)  # length 22: the next step's window is [15, 22)
    new = torch.full((len(idx), 2, 1, 16), -7.0)
    ko, vo = cache.update(new, -new, 0)
    want = torch.cat([hist[:, :, 15:22], new], dim=2)
    torch.testing.assert_close(ko, want, atol=0, rtol=0)
    torch.testing.assert_close(vo, -want, atol=0, rtol=0)


def test_pools_default_to_the_model_dtype_and_views_stay_zero_copy():
    for dtype, name in [(torch.bfloat16, "bfloat16"), (torch.float16, "float16")]:
        cache = OffgraphCache(make("llama").config)
        k = torch.randn(1, 2, 5, 16).to(dtype)
        ko, vo = cache.update(k, k * 2, 0)
        spec = cache.layers[0].kv.spec(0)
        assert (spec.k_dtype, spec.v_dtype) == (name, name)
        assert ko.dtype == dtype and torch.equal(ko, k) and torch.equal(vo, k * 2)
        assert np.shares_memory(ko.view(torch.int16).numpy(), spec.k)
        # layer 0 only (layer 1 not initialised yet): K + V, 2 heads, 5 rows, 16 values, 2 bytes
        assert cache.nbytes() == 2 * 2 * 5 * 16 * 2


@pytest.mark.parametrize("kv_dtype", ["float16", "bfloat16", "q8_0"])
def test_kv_dtype_by_name_offgraph_attention_matches_sdpa_over_the_same_rows(kv_dtype):
    # head_dim 32 so q8_0 applies; both runs read the same rounded rows, so their logits agree
    # to float32 accumulation order, and both stay close to a float32 cache. Where the kernel
    # scores q8_0 keys by integer dots (an AVX2-only CPU), q is rounded to Q8_0 as well: a
    # relative 1/254 per value, which moved these logits by 7e-4 on such a CPU.
    cfg = tiny_config("llama", head_dim=32, hidden_size=128)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    ids = prompt(20)
    outs = {}
    for attn in ["sdpa", ATTN_NAME]:
        model.set_attn_implementation(attn)
        cache = OffgraphCache(model.config, kv_dtype=kv_dtype)
        with torch.no_grad():
            a = model(ids[:, :12], cache=cache).logits
            b = model(ids[:, 12:], cache=cache).logits
        assert cache.layers[0].kv.spec(0).k_dtype == kv_dtype
        outs[attn] = torch.cat([a, b], dim=1)
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        ref = model(ids, cache=DynamicCache(config=model.config)).logits
    atol = 3e-3 if int8_scores(kv_dtype, cfg.head_dim) else 2e-4
    torch.testing.assert_close(outs[ATTN_NAME], outs["sdpa"], atol=atol, rtol=1e-4)
    tol = {"float16": 5e-3, "bfloat16": 3e-2, "q8_0": 3e-2}[kv_dtype]
    assert (outs["sdpa"] - ref).abs().max().item() < tol


def test_unknown_kv_dtype_is_refused():
    with pytest.raises(okv.ConfigError, match="kv_dtype"):
        OffgraphCache(make("llama").config, kv_dtype="int4")
