"""BatchGenerator logprobs on tiny random-weight models: each generated token's entry equals
``log_softmax`` of the model's own logits computed independently (a plain transformers forward
over the prompt and the tokens generated so far), the top-k are the k most likely tokens sorted,
greedy's token is the top-1; requests that did not ask get nothing; bad values are refused and
change nothing."""

from __future__ import annotations

import numpy as np
import offgraph_kv as okv
import pytest
import torch
from model_helpers import tiny_model
from offgraph_kv.batch.sampling import MAX_LOGPROBS, logprob_entry
from offgraph_kv.hf import BatchGenerator

torch.set_num_threads(2)

TOL = 1e-4  # the cell kernel's attention vs eager attention, float32, on a tiny model


def rand_tokens(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, 128, (n,), generator=g).tolist()


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def model(request):
    return tiny_model(request.param, num_hidden_layers=4)


def reference_logprobs(model, prompt: list[int], generated: list[int]) -> torch.Tensor:
    """``log_softmax`` rows of each generated token's step: one eager forward of the whole
    sequence (causal, so row ``len(prompt) - 1 + i`` is the distribution token ``i`` came
    from)."""
    ids = torch.tensor([prompt + generated[:-1]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].to(torch.float64)
    return torch.log_softmax(logits, dim=-1)[len(prompt) - 1 :]


def check_entries(ref: torch.Tensor, generated: list[int], entries, k: int, greedy: bool):
    assert [e.token for e in entries] == generated
    for i, e in enumerate(entries):
        row = ref[i]
        assert e.logprob <= 0.0
        assert abs(e.logprob - float(row[e.token])) < TOL, (i, e.logprob, float(row[e.token]))
        assert len(e.top) == k
        lps = [lp for _, lp in e.top]
        assert lps == sorted(lps, reverse=True)
        for t, lp in e.top:
            assert abs(lp - float(row[t])) < TOL
        if k:  # the k listed are the k most likely (up to the tolerance)
            rest = row.clone()
            rest[[t for t, _ in e.top]] = -float("inf")
            assert float(rest.max()) <= lps[-1] + TOL
        if greedy:
            assert abs(e.logprob - float(row.max())) < TOL
            if k:
                assert e.top[0] == (e.token, e.logprob)


def test_entries_equal_log_softmax_of_the_models_logits(model):
    gen = BatchGenerator(model, n_cells=256, max_batch_tokens=16)
    asks = [  # (prompt, k, sampling): prefill chunks of 16 mix with the others' decodes
        (rand_tokens(30, 1), 5, {}),
        (rand_tokens(7, 2), 0, {}),
        (rand_tokens(12, 3), MAX_LOGPROBS, {"temperature": 1.0, "top_p": 0.9, "seed": 4}),
        (rand_tokens(9, 4), None, {}),
    ]
    rids = [gen.add(p, 10, logprobs=k, **kw) for p, k, kw in asks]
    got: dict[int, list] = {r: [] for r in rids}
    tokens: dict[int, list[int]] = {r: [] for r in rids}
    while gen.has_work:
        for rid, tok in gen.step():
            tokens[rid].append(tok)
            new = gen.take_logprobs(rid)
            k = asks[rids.index(rid)][1]
            assert len(new) == (0 if k is None else 1)  # one entry per token, taken as it comes
            got[rid] += new
    for rid, (p, k, kw) in zip(rids, asks):
        assert gen.take_logprobs(rid) == []  # finished, not forgotten: nothing new
        if k is None:
            assert got[rid] == []
            continue
        ref = reference_logprobs(model, p, tokens[rid])
        check_entries(ref, tokens[rid], got[rid], k, greedy=not kw)
        assert gen.forget_finished(rid)
        assert gen.take_logprobs(rid) is None  # forgotten with the request


def test_entries_wait_until_taken_and_a_cancel_keeps_them():
    model = tiny_model("llama")
    gen = BatchGenerator(model, n_cells=64, max_batch_tokens=8)
    p = rand_tokens(5, 5)
    rid = gen.add(p, 6, logprobs=2)
    toks = [t for _ in range(3) for _, t in gen.step()]
    assert gen.cancel(rid)
    entries = gen.take_logprobs(rid)  # three steps' entries at once, oldest first
    assert [e.token for e in entries] == toks
    check_entries(reference_logprobs(model, p, toks), toks, entries, 2, greedy=True)
    assert gen.pop_finished() == {rid: toks}
    assert gen.take_logprobs(rid) is None


def test_logprob_entry_on_torch_and_numpy_rows_agree():
    g = torch.Generator().manual_seed(0)
    row = torch.randn(1000, generator=g) * 4
    row[7] = row[8] = row.max() + 1  # a tie at the top: the lower id first
    a = logprob_entry(row, 8, 4)
    b = logprob_entry(row.numpy(), 8, 4)
    assert a == b
    want = torch.log_softmax(row.double(), -1)
    assert [t for t, _ in a.top] == [7, 8, *torch.topk(want, 4).indices.tolist()[2:]]
    assert abs(a.logprob - float(want[8])) < 1e-6  # float32 exponentials, a float64 sum
    assert logprob_entry(row, 3, 0).top == []
    assert len(logprob_entry(np.zeros(3, np.float32), 0, 20).top) == 3  # k beyond the vocab


def _state(gen: BatchGenerator):
    return gen.stats, list(gen.kc.live_seqs), gen.kc.free_cells, [r.rid for r in gen._waiting]


@pytest.mark.parametrize(
    "value", [-1, MAX_LOGPROBS + 1, 10**30, True, False, 1.0, 2.5, "3", [1], np.float32(2)]
)
def test_bad_logprobs_are_refused_and_change_nothing(value):
    gen = BatchGenerator(tiny_model("llama"), n_cells=64, max_batch_tokens=8)
    gen.add(rand_tokens(5, 6), 3, logprobs=1)
    gen.step()
    gen.add(rand_tokens(4, 7), 3)
    before = _state(gen)
    with pytest.raises(okv.InvalidArgumentError, match="logprobs"):
        gen.add([1, 2, 3], 4, logprobs=value)
    with pytest.raises(okv.InvalidArgumentError, match="logprobs"):
        gen.generate([[1, 2], [3, 4]], 2, logprobs=value)
    assert _state(gen) == before
    # A refused request took no id: the next one gets the id it would have had.
    assert gen.add([1, 2], 2, logprobs=np.int64(3)) == 2
