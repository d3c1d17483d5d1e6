"""BatchGenerator over the native engine, exactly as over a transformers model: greedy tokens one
request at a time equal the batched run with forks of a shared prefix, and every pool dtype gives
the float32 pools' tokens, both up to near-ties.

Why near-ties and not bit equality: attention's summation order depends on a step's shape (rows per
block, a key range split over threads), so a batched row differs from the same row alone by ~1e-7;
the Q8 activation rounding of the next matmul now and then turns that into a different int8 value,
which moves the logits by up to ~1e-2 (engine/tests/model_batch.rs shows batching is exact on f32
activations). Where two candidates are that close, greedy may take either."""

import numpy as np
import pytest
from offgraph_kv.hf import BatchGenerator

SYSTEM = (
    "You are the help desk of a small bookshop. Answer in one short sentence, politely, and "
    "never invent a price. The shop opens at nine and closes at six, Monday to Saturday. "
)
ASKS = [
    "When do you open?",
    "Do you sell maps?",
    "Can I return a book?",
    "Is there parking nearby?",
    "Do you buy used books?",
    "Are you open on Sunday?",
    "Can you order a book for me?",
    "Where is the poetry shelf?",
]
NEW = 12
# A token chosen with low-precision pools may differ from the float32 pools' choice only where the
# float32 logits of the two tokens were this close (a near-tie); everything before must be equal.
# Largest gap seen: 0.53 (Gemma 3, q8_0 pools, after the kernels' batched blocks went two a
# register and the summation order changed which near-ties flip).
NEAR_TIE = 0.75


@pytest.fixture(scope="module", params=["smollm2", "gemma"])
def engine(request):
    return request.getfixturevalue(f"{request.param}_engine")


def _prompts(engine) -> list[list[int]]:
    tok = engine.tokenizer
    return [tok.encode(SYSTEM + ask) for ask in ASKS]


def _check_near_ties(engine, prompts, want_all, have_all, what):
    """Each pair of greedy runs is equal, or equal up to a first divergence where the reference's
    own logits had the two tokens within NEAR_TIE of each other."""
    for p, want, have in zip(prompts, want_all, have_all):
        if want == have:
            continue
        j = next((i for i, (a, b) in enumerate(zip(want, have)) if a != b), None)
        assert j is not None, (what, want, have)  # one stopped early: lengths differ, same tokens
        logits = engine.logits(p + want[:j])[-1]
        gap = float(logits[want[j]] - logits[have[j]])
        print(f"{what}: first divergence at token {j}, float32 logit gap {gap:.4f}")
        assert abs(gap) <= NEAR_TIE, (what, j, gap)


def _alone(engine, prompts, kv_dtype=None) -> list[list[int]]:
    out = []
    for p in prompts:
        gen = BatchGenerator(engine, n_cells=512, max_batch_tokens=64, kv_dtype=kv_dtype)
        out += gen.generate([p], NEW)
    return out


def test_batched_with_forks_equals_one_at_a_time(engine):
    prompts = _prompts(engine)
    alone = _alone(engine, prompts)
    gen = BatchGenerator(engine, n_cells=2048, max_batch_tokens=128)
    batched = gen.generate(prompts, NEW)
    _check_near_ties(engine, prompts, alone, batched, "batched")
    assert sum(a == b for a, b in zip(alone, batched)) >= len(prompts) // 2
    assert gen.stats["forks"] >= 1 and gen.stats["prefix_tokens_reused"] > 0, gen.stats
    # The first token is the argmax of the engine's own one-sequence logits.
    for p, toks in zip(prompts[:2], alone[:2]):
        assert toks[0] == int(np.argmax(engine.logits(p)[-1]))


@pytest.mark.parametrize("kv_dtype", ["float16", "bfloat16", "q8_0"])
def test_pool_dtypes_agree_up_to_near_ties(engine, kv_dtype):
    prompts = _prompts(engine)[:4]
    ref = _alone(engine, prompts)
    got = BatchGenerator(engine, n_cells=2048, max_batch_tokens=128, kv_dtype=kv_dtype).generate(
        prompts, NEW
    )
    _check_near_ties(engine, prompts, ref, got, kv_dtype)
