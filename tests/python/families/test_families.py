"""Llama-family GGUFs made the way the world makes them (a transformers checkpoint converted by
llama.cpp's `convert_hf_to_gguf.py`, F16 and Q8_0), run by the native engine and compared with the
float32 transformers model of the same checkpoint over 256 positions of real text; their
tokenizer against the checkpoint's; batched greedy against one request at a time."""

import numpy as np
import pytest
from offgraph_kv.hf import BatchGenerator

from .conftest import POSITIONS
from .variants import F16, VARIANTS

# (type, least top-1 agreement, largest mean KL(hf || engine)). F16 holds the weights to ~1e-3;
# Q8_0 rounds them to 8 bits per 32-block, which moves near-ties (measured: top-1 0.984-0.996,
# KL ~0.0014 on every variant).
BOUNDS = {"f16": (0.97, 0.02), "q8_0": (0.95, 0.01)}
PROMPTS = [
    "The licenses for most software and other practical works are designed to",
    "Developers that use the GNU GPL protect your rights with two steps:",
    "Once upon a time, in a small village by the sea,",
    "To make a cup of tea, first",
]
NEW = 8
# Batched and one-at-a-time greedy may part only where the two tokens' logits were this close
# (summation order differs with a step's shape; see tests/python/engine/test_engine_batch.py).
NEAR_TIE = 0.75
# The variants (variants.VARIANTS): every family the engine runs.
CHECKED = ["llama", "llama3_rope", "linear_rope", "yarn_rope", "mistral",
           "qwen2", "qwen3", "phi3", "phi3_longrope", "gemma2", "granite", "olmo2"]  # fmt: skip
# One variant per family for what RoPE metadata cannot change (tokenizer, batching): the others
# are their family's tensors and tokenizer with other RoPE keys, checked on F16 logits.
FAMILIES = [name for name in CHECKED if VARIANTS[name].types != F16]
LOGIT_CASES = [(name, t, *BOUNDS[t]) for name in CHECKED for t in VARIANTS[name].types]


@pytest.fixture(scope="module", params=FAMILIES)
def variant(request, variant_factory):
    return variant_factory(request.param)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


@pytest.mark.parametrize("name, outtype, min_top1, max_kl", LOGIT_CASES)
def test_logits_match_hugging_face(variant_factory, name, outtype, min_top1, max_kl):
    variant = variant_factory(name)
    want = variant.hf_logits
    # The checkpoint is a real model's: its predictions vary along the text.
    assert len(set(want.argmax(-1).tolist())) > 20
    have = np.asarray(variant.engine(outtype).logits(variant.ids), dtype=np.float64)
    assert have.shape == want.shape == (POSITIONS, want.shape[1])
    p, q = _log_softmax(want), _log_softmax(have)
    kl = float((np.exp(p) * (p - q)).sum(-1).mean())
    top1 = float((want.argmax(-1) == have.argmax(-1)).mean())
    print(f"{variant.name} {outtype}: top-1 {top1:.4f}, mean KL {kl:.6f}")
    assert top1 >= min_top1 and kl <= max_kl, (variant.name, outtype, top1, kl)


def test_gguf_tokenizer_equals_checkpoint_tokenizer(variant, corpus_text):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(variant.hf_dir)
    engine = variant.engine("f16")
    paragraphs = [p for p in corpus_text.split("\n\n") if p.strip()][:80]
    bad = []
    for text in [corpus_text, *paragraphs, *PROMPTS]:
        for special in (True, False):
            want = hf(text, add_special_tokens=special)["input_ids"]
            if engine.tokenizer.encode(text, add_special_tokens=special) != want:
                bad.append((text[:40], special))
    assert not bad, bad[:3]
    assert engine.tokenizer.encode(corpus_text)[:POSITIONS] == variant.ids


def test_batched_greedy_equals_one_at_a_time(variant):
    engine = variant.engine("f16")
    prompts = [engine.tokenizer.encode(p) for p in PROMPTS]
    alone = []
    for p in prompts:
        alone += BatchGenerator(engine, n_cells=256, max_batch_tokens=64).generate([p], NEW)
    batched = BatchGenerator(engine, n_cells=1024, max_batch_tokens=128).generate(prompts, NEW)
    for p, want, have in zip(prompts, alone, batched):
        assert len(want) == len(have) == NEW, (want, have)
        if want != have:
            j = next(i for i, (a, b) in enumerate(zip(want, have)) if a != b)
            logits = engine.logits(p + want[:j])[-1]
            gap = float(logits[want[j]] - logits[have[j]])
            assert abs(gap) <= NEAR_TIE, (variant.name, j, gap)
    assert sum(a == b for a, b in zip(alone, batched)) >= len(prompts) // 2
    # The first token is the argmax of the engine's own one-sequence logits.
    assert alone[0][0] == int(np.argmax(engine.logits(prompts[0])[-1]))
