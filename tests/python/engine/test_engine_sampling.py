"""Sampling on the native engine's path: its requests draw from a numpy ``Generator`` (the path
never imports torch), seeded per request, so one seed repeats its tokens; top-p keeps the
smallest head reaching ``top_p``; a transformers model's requests keep torch's generator."""

from __future__ import annotations

import numpy as np
from offgraph_kv.batch import BatchGenerator
from offgraph_kv.batch.sampling import sample, sampler_for

PROMPT = "Bread is made from"


def _run(engine, **kw) -> list[int]:
    # A fresh generator: the same cells every run (the logits depend a little on where a
    # sequence's cells lie, see tests/python/serve/test_serve_native.py).
    gen = BatchGenerator(engine, n_cells=512, max_batch_tokens=64, prefix_cache=False)
    return gen.generate([engine.tokenizer.encode(PROMPT)], 12, **kw)[0]


def test_a_seed_repeats_its_tokens(smollm2_engine):
    a = _run(smollm2_engine, temperature=0.9, seed=11)
    assert _run(smollm2_engine, temperature=0.9, seed=11) == a
    others = [_run(smollm2_engine, temperature=0.9, seed=s) for s in (12, 13, 14)]
    assert any(o != a for o in others)  # the seed is used: not all four runs agree
    greedy = _run(smollm2_engine)
    assert _run(smollm2_engine, temperature=0.9, top_p=1e-6, seed=3) == greedy


def test_the_numpy_sampler():
    rng = sampler_for(0.7, 5, numpy=True)
    assert isinstance(rng, np.random.Generator) and sampler_for(0.0, 5, numpy=True) is None
    import torch

    assert isinstance(sampler_for(0.7, 5), torch.Generator)  # the transformers path: unchanged
    row = np.array([0.0, 3.0, 3.0, -1.0, 2.0], dtype=np.float32)
    assert sample(row, 0.0, 1.0, None) == 1  # greedy: the first of equal maxima, as torch's
    draws = [sample(row, 1.0, 1.0, sampler_for(1.0, s, numpy=True)) for s in range(400)]
    counts = np.bincount(draws, minlength=5)
    p = np.exp(row - row.max())
    p /= p.sum()
    assert np.all(np.abs(counts / 400 - p) < 0.08), counts
    # top_p 0.6: the two 3.0 logits hold 0.36 each: both and only both are kept.
    kept = {sample(row, 1.0, 0.6, sampler_for(1.0, s, numpy=True)) for s in range(100)}
    assert kept == {1, 2}
    a = [sample(row, 0.8, 0.9, rng) for _ in range(20)]
    rng2 = sampler_for(0.7, 5, numpy=True)
    assert [sample(row, 0.8, 0.9, rng2) for _ in range(20)] == a
