"""Greedy text does not depend on the server's history or load: a few prompts decoded one at a time
on a fresh generator give exactly the same text when decoded again on one generator after a storm
of mixed concurrent requests (different lengths, shared prefixes that fork, requests joining
mid-flight and leaving), and while more such requests share their steps. Logits are bit-identical
whatever shares a step and wherever a sequence's cells lie (engine/tests/model_invariance.rs), so
there are no near-ties to allow for here."""

import random

import pytest
from offgraph_kv.hf import BatchGenerator

PROMPTS = [
    "The first five prime numbers are",
    "Write one sentence about the sea:",
    "Q: What colour is the sky on a clear day?\nA:",
]
NEW = 16
WORDS = (
    "the shop opens at nine and closes at six from monday to saturday but never on sunday".split()
)


@pytest.fixture(scope="module", params=["smollm2", "gemma"])
def engine(request):
    return request.getfixturevalue(f"{request.param}_engine")


def _storm_prompt(tok, rng: random.Random, shared: list[int]) -> list[int]:
    """A prompt of a random length; half of them extend a shared prefix (so they fork it)."""
    words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 30)))
    ids = tok.encode(words)
    return shared + ids if rng.random() < 0.5 else ids


def test_greedy_text_is_the_same_alone_and_after_a_storm(engine):
    tok = engine.tokenizer
    prompts = [tok.encode(p) for p in PROMPTS]
    alone = []
    for p in prompts:
        gen = BatchGenerator(engine, n_cells=256, max_batch_tokens=64)
        alone += gen.generate([p], NEW)
    texts = [tok.decode(t) for t in alone]

    rng = random.Random(39)
    shared = tok.encode("Opening hours of the bookshop on the corner: ")
    gen = BatchGenerator(engine, n_cells=1024, max_batch_tokens=48)
    for _ in range(3):
        for _ in range(rng.randint(3, 6)):
            gen.add(_storm_prompt(tok, rng, shared), rng.randint(1, 12))
        for _ in range(rng.randint(2, 6)):
            gen.step()
        for _ in range(2):
            gen.add(_storm_prompt(tok, rng, shared), rng.randint(1, 12))
        gen.run()
    # The prompts again, joining mid-flight amid more storm requests.
    for _ in range(4):
        gen.add(_storm_prompt(tok, rng, shared), rng.randint(4, 20))
    gen.step()
    rids = [gen.add(p, NEW) for p in prompts]
    for _ in range(3):
        gen.add(_storm_prompt(tok, rng, shared), rng.randint(1, 12))
    done = gen.run()
    after = [done[r] for r in rids]
    assert gen.stats["forks"] >= 1, gen.stats
    for want, have, text in zip(alone, after, texts):
        assert tok.decode(have) == text, (text, tok.decode(have))
        assert have == want
