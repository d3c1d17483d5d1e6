"""BatchGenerator logprobs over the native engine (SmolLM2-135M GGUF): each token's logprob and
top-k equal ``log_softmax`` of ``GgufModel.logits`` over the prompt and the tokens generated so
far, computed independently (a private cache, the whole sequence in one forward).

One request at a time they agree to 1e-3 (measured: ~4e-15), prompts prefilled whole or in
chunks over cells of earlier steps. Several requests decoding in one step do not: each decode
row of a step that carries tokens of two or more sequences over cells written in earlier steps
differs from that sequence's ``logits`` by up to ~0.9 in logits (0.38 in logprob here), the same
whatever the other rows hold (even the same prompt twice), while the first step (every prompt
prefilled from nothing, together) agrees exactly. The strict xfail below pins that engine
discrepancy down (it passes, and so fails as an xfail, once the engine is fixed)."""

import numpy as np
import pytest
from offgraph_kv.hf import BatchGenerator

TOL = 1e-3
ASKS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a quiet"]
KS = [5, 20, 0]


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def check(eng, prompt: list[int], toks: list[int], got: list, k: int) -> float:
    """Asserts the entries' shape (greedy's token first, top-k sorted); returns the largest
    difference from the reference logprobs."""
    assert [e.token for e in got] == toks and len(toks) == 12
    ref = log_softmax(eng.logits(prompt + toks[:-1])[len(prompt) - 1 :])
    worst = 0.0
    for i, e in enumerate(got):
        worst = max(worst, abs(e.logprob - ref[i, e.token]), abs(e.logprob - ref[i].max()))
        assert e.logprob <= 0.0 and len(e.top) == k
        lps = [lp for _, lp in e.top]
        assert lps == sorted(lps, reverse=True)
        for t, lp in e.top:
            worst = max(worst, abs(lp - ref[i, t]))
        if k:
            assert e.top[0] == (e.token, e.logprob)  # greedy: the token is the top-1
            rest = ref[i].copy()
            rest[[t for t, _ in e.top]] = -np.inf
            worst = max(worst, rest.max() - lps[-1])  # nothing unlisted is likelier
    return worst


def run(eng, batched: bool, max_batch_tokens: int) -> float:
    gen = BatchGenerator(eng, n_cells=1024, max_batch_tokens=max_batch_tokens)
    prompts = [eng.tokenizer.encode(a) for a in ASKS]
    worst = 0.0
    todo = [list(zip(prompts, KS))] if batched else [[pk] for pk in zip(prompts, KS)]
    for group in todo:
        rids = [gen.add(p, 12, logprobs=k) for p, k in group]  # greedy
        tokens: dict[int, list[int]] = {r: [] for r in rids}
        entries: dict[int, list] = {r: [] for r in rids}
        while gen.has_work:
            for rid, tok in gen.step():
                tokens[rid].append(tok)
                entries[rid] += gen.take_logprobs(rid)
        for rid, (p, k) in zip(rids, group):
            worst = max(worst, check(eng, p, tokens[rid], entries[rid], k))
    return worst


@pytest.mark.parametrize("max_batch_tokens", [64, 3])  # 3: prompts prefilled in chunks
def test_engine_logprobs_equal_log_softmax_of_its_logits_one_request_at_a_time(
    smollm2_engine, max_batch_tokens
):
    worst = run(smollm2_engine, batched=False, max_batch_tokens=max_batch_tokens)
    print(f"largest |logprob - reference|: {worst:.2e}")
    assert worst < TOL


@pytest.mark.xfail(
    strict=True,
    reason="engine: a step holding tokens of 2+ sequences over earlier steps' cells gives "
    "logits off GgufModel.logits by up to ~0.9 (0.38 in logprob here); one sequence agrees",
)
def test_engine_logprobs_equal_log_softmax_of_its_logits_batched(smollm2_engine):
    worst = run(smollm2_engine, batched=True, max_batch_tokens=64)
    print(f"largest |logprob - reference|: {worst:.2e}")
    assert worst < TOL
