"""Gemma 3 270M: a process that prefilled a prompt saves it; a second process loads it and
generates the tokens a full prefill generates."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch
from offgraph_kv.hf import OffgraphCache
from offgraph_kv.store import MemoryBackend, PrefixStore, RedisBackend
from offgraph_kv.tools.store_demo import demo_prompt, generate

PROMPT = 700  # past the sliding window (512): ring layers wrap and carry only their tail
NEW = 8


def test_second_process_generates_what_a_full_prefill_does(gemma, redis_server):
    model, _ = gemma
    tokens = demo_prompt(PROMPT)
    full = generate(model, tokens, OffgraphCache(model.config), NEW)
    cache = OffgraphCache(model.config)
    with torch.no_grad():
        model(torch.tensor([tokens]), cache=cache, use_cache=True)
    store = PrefixStore(RedisBackend(redis_server.url), namespace="gemma-test", model=model)
    store.clear()
    assert store.save(cache, tokens) == PROMPT // 256
    cmd = [sys.executable, "-m", "offgraph_kv.tools.store_demo", "load", "--url", redis_server.url]
    cmd += ["--prompt-len", str(PROMPT), "--new-tokens", str(NEW), "--namespace", "gemma-test"]
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["pid"] != os.getpid()
    assert res["restored"] == 512
    assert res["tokens"] == full


def test_in_process_memory_hit_matches_and_restores_every_layer(gemma):
    model, _ = gemma
    tokens = demo_prompt(600, seed=1)
    full = generate(model, tokens, OffgraphCache(model.config), NEW)
    store = PrefixStore(MemoryBackend(1 << 30), chunk_tokens=128, model=model)
    cache = OffgraphCache(model.config)
    with torch.no_grad():
        model(torch.tensor([tokens]), cache=cache, use_cache=True)
    assert store.save(cache, tokens) == 4
    again = OffgraphCache(model.config)
    assert store.load(again, tokens) == 512
    assert [kv.length for kv in again.kv_caches()] == [512] * model.config.num_hidden_layers
    assert generate(model, tokens, again, NEW) == full


def test_a_long_remainder_after_a_hit_matches_a_full_prefill(gemma):
    """300 tokens saved, then an 860-token prompt: 256 restored, and the 604 left exceed a
    sliding layer's max_step (512), so the first forward runs the long-step path on restored
    layers."""
    model, _ = gemma
    tokens = demo_prompt(860, seed=3)
    store = PrefixStore(MemoryBackend(1 << 30), model=model)
    first = OffgraphCache(model.config)
    with torch.no_grad():
        model(torch.tensor([tokens[:300]]), cache=first, use_cache=True)
    assert store.save(first, tokens[:300]) == 1
    again = OffgraphCache(model.config)
    assert store.load(again, tokens) == 256
    assert generate(model, tokens, again, 4) == generate(
        model, tokens, OffgraphCache(model.config), 4
    )
