"""BatchGenerator logprobs over the native engine (SmolLM2-135M GGUF): each token's logprob and
top-k equal ``log_softmax`` of ``GgufModel.logits`` over the prompt and the tokens generated so
far, computed independently (a private cache, the whole sequence in one forward).

One request at a time they agree to 1e-3 (measured: ~2e-8), prompts prefilled whole or in
chunks over cells of earlier steps. Batched they do not: a sequence whose cells are not
contiguous (another sequence's cells between its prompt and its new token) gets logits off by up
to ~0.8 (0.38 in logprob on these prompts), the same figure whatever the other sequence holds and
however long it is; contiguous cells agree exactly. test_engine_batch.py explains batched
differences by attention's summation order amplified by the Q8 activation rounding (it says up
to ~1e-2); whether this larger one is that or a defect is open (an engine test with
``set_exact_matmul(true)`` over interleaved cells tells). The two strict xfails below pin it
down: they pass, and so fail as xfails, once the engine agrees."""

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
    reason="engine: batched decodes (non-contiguous cells) are off GgufModel.logits by up to "
    "0.38 in logprob here; one request at a time agrees",
)
def test_engine_logprobs_equal_log_softmax_of_its_logits_batched(smollm2_engine):
    worst = run(smollm2_engine, batched=True, max_batch_tokens=64)
    print(f"largest |logprob - reference|: {worst:.2e}")
    assert worst < TOL


@pytest.mark.xfail(
    strict=True,
    reason="engine: a sequence whose cells are not contiguous (another sequence's cells "
    "between them) gets logits off by ~0.77; contiguous cells are exact",
)
def test_engine_decode_over_non_contiguous_cells_equals_logits(smollm2_engine):
    """The smallest case behind the batched discrepancy: A is prefilled, then B, then A decodes
    one token alone. A's cells are 0..n-1 and n+len(B), with B's in between; A's logits should
    not care (every cell of another sequence is masked out) but move by ~0.77, whatever B holds
    (1 to 20 tokens tried). Decoding A before B is prefilled (its cells contiguous) gives
    GgufModel.logits exactly."""
    import offgraph_kv as okv

    eng = smollm2_engine
    a_ids = eng.tokenizer.encode("The capital of France is")
    b_ids = eng.tokenizer.encode("def fibonacci(n):")
    want = eng.logits(a_ids + [5])[-1]
    layers = eng.layer_configs()
    cfg = okv.CacheConfig(eng.max_positions, len(layers), layers, max_step=64)

    def step(kc, seqs, toks, pos):
        kc.begin_step(seqs, pos)
        return eng.forward_cells(kc, toks, pos, [len(toks) - 1])[0]

    gaps = {}
    for b_first in (False, True):
        kc = okv.KvCellCache(cfg, 256, n_seq_max=4)
        a, b = kc.seq_new(), kc.seq_new()
        step(kc, [a] * len(a_ids), a_ids, list(range(len(a_ids))))
        if b_first:
            step(kc, [b] * len(b_ids), b_ids, list(range(len(b_ids))))
        gaps[b_first] = float(np.abs(step(kc, [a], [5], [len(a_ids)]) - want).max())
    print(f"max |logit - reference|: contiguous {gaps[False]:.2e}, after B {gaps[True]:.2e}")
    assert gaps[False] < 1e-4  # holds today: the xfail is the second
    assert gaps[True] < 1e-4
