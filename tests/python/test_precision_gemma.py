"""Accuracy of low-precision pools on a real model: Gemma 3 270M (5 sliding layers of window 512
per full layer), teacher-forced over ~640 tokens of real text in chunks of 128, with the
"offgraph" attention reading the pools in place. Each dtype's next-token distributions are
compared with a float32 cache's: mean KL(float32 || dtype) and top-1 agreement."""

from __future__ import annotations

import argparse
import collections
import difflib
import json
import logging
import subprocess
import textwrap

import pytest
import torch
from offgraph_kv.hf import ATTN_NAME, OffgraphCache

N_TOKENS = 640
CHUNK = 128
# Bounds with a wide margin over what this test measured (see docs/benchmarks.md's precision table);
# the issue's own DynamicCache fake-quantization figures are 7e-7 / 4e-5 / 1e-3 mean KL.
BOUNDS = {"float16": (1e-4, 0.99), "bfloat16": (2e-3, 0.97), "q8_0": (2e-2, 0.93)}


def real_text() -> str:
    docs = [m.__doc__ or "" for m in (argparse, collections, difflib, json, logging, subprocess)]
    return textwrap.dedent("\n\n".join(docs))


def teacher_forced_logits(model, ids: torch.Tensor, kv_dtype: str) -> torch.Tensor:
    cache = OffgraphCache(model.config, kv_dtype=kv_dtype, max_step=CHUNK)
    out = []
    with torch.no_grad():
        for s in range(0, ids.shape[1], CHUNK):
            out.append(model(ids[:, s : s + CHUNK], cache=cache).logits[0].float())
    for layer in cache.layers:
        assert layer.kv.spec(0).k_dtype == kv_dtype
    return torch.cat(out)


@pytest.fixture(scope="module")
def runs(gemma3_270m, gemma3_270m_tokenizer):
    model, tok = gemma3_270m, gemma3_270m_tokenizer
    before = model.config._attn_implementation
    model.set_attn_implementation(ATTN_NAME)
    torch.set_num_threads(2)
    try:
        ids = tok(real_text(), return_tensors="pt").input_ids[:, :N_TOKENS]
        assert ids.shape[1] == N_TOKENS  # past one ring window: the sliding layers wrap
        return {d: teacher_forced_logits(model, ids, d) for d in ["float32", *BOUNDS]}
    finally:
        model.set_attn_implementation(before)  # the model is shared by the session


@pytest.mark.parametrize("dtype", list(BOUNDS))
def test_kl_and_top1_against_float32(runs, dtype):
    ref, got = runs["float32"], runs[dtype]
    logp, logq = ref.log_softmax(-1), got.log_softmax(-1)
    kl = (logp.exp() * (logp - logq)).sum(-1).mean().item()
    agree = (ref.argmax(-1) == got.argmax(-1)).float().mean().item()
    print(f"\n{dtype}: mean KL {kl:.3e}, top-1 agreement {agree:.4f} over {ref.shape[0]} tokens")
    print(json.dumps({"dtype": dtype, "kl": kl, "top1": agree}))
    max_kl, min_agree = BOUNDS[dtype]
    assert 0 < kl <= max_kl
    assert agree >= min_agree
