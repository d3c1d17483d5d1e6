"""Speculative decoding in ``BatchGenerator`` on both real models (the native engine): greedy
tokens are those of the same requests without speculation (every pool dtype, prompts shared by
forks, a request opted out beside one that speculates, bias and penalties), a draft model
drafting for itself is accepted whole, a draft model of another vocabulary is refused, seeded
sampling repeats, and the rejection rule keeps the sampler's distribution; the counters add
up."""

from __future__ import annotations

import numpy as np
import pytest
from offgraph_kv import InvalidArgumentError
from offgraph_kv.batch import BatchGenerator
from offgraph_kv.batch.draft_length import PROBE_EVERY
from offgraph_kv.batch.ngram import NgramIndex
from offgraph_kv.batch.sampling import sampler_for
from offgraph_kv.batch.speculative import Speculation, accept, distribution

# Text that repeats itself, so that prompt lookup drafts and some drafts are rejected.
QUOTE = (
    "def area(r):\n    return 3.14159 * r * r\n\ndef perimeter(r):\n    return 2 * 3.14159 * r\n"
)
ASKS = (
    "Copy this code exactly, then write it again with the functions renamed:\n\n" + QUOTE,
    "Repeat this code twice:\n\n" + QUOTE,
)
N_NEW = 40
# Drafts priced as free (no forward costs more than a one-token one): every speculating step
# drafts all it may, whatever this machine measures.
FLAT = Speculation("ngram", step_cost={})


def _prompts(engine) -> list[list[int]]:
    return [engine.tokenizer.encode(a) for a in ASKS]


def _both(engine, kv_dtype="float32", **kw):
    """Each prompt twice in one batch (the second a fork of the first's prefix), speculating
    and opted out; returns both sides' tokens and the generator."""
    gen = BatchGenerator(
        engine, n_cells=1024, max_batch_tokens=64, kv_dtype=kv_dtype, speculative=FLAT
    )
    spec, plain = [], []
    for p in _prompts(engine):
        spec.append(gen.add(p, N_NEW, **kw))
        plain.append(gen.add(p, N_NEW, speculative=False, **kw))
    out = gen.run()
    return [out[r] for r in spec], [out[r] for r in plain], gen


@pytest.mark.parametrize("kv_dtype", ["float32", "float16", "bfloat16", "q8_0"])
@pytest.mark.parametrize("name", ["smollm2", "gemma"])
def test_greedy_tokens_equal_without_speculation(request, name, kv_dtype):
    engine = request.getfixturevalue(f"{name}_engine")
    spec, plain, gen = _both(engine, kv_dtype)
    assert spec == plain
    st = gen.stats
    assert st["forks"] >= 2  # the opted-out twins forked the speculating ones' prompts
    assert st["spec_accepted_tokens"] > 0
    assert st["spec_drafted_tokens"] > st["spec_accepted_tokens"]  # some drafts rejected
    assert st["spec_acceptance_rate"] == st["spec_accepted_tokens"] / st["spec_drafted_tokens"]
    assert st["steps"] < 2 * N_NEW  # fewer steps than tokens: drafts were kept
    assert gen.kc.audit() is None


def test_bias_penalties_and_logprobs_under_speculation(smollm2_engine):
    bias = {smollm2_engine.tokenizer.encode("r", add_special_tokens=False)[0]: -3.0}
    spec, plain, gen = _both(
        smollm2_engine, logit_bias=bias, frequency_penalty=0.3, presence_penalty=0.2
    )
    assert spec == plain and gen.stats["spec_accepted_tokens"] > 0
    # One logprob entry per token, even when a step produces several.
    rid = gen.add(_prompts(smollm2_engine)[1], 24, logprobs=2)
    while gen.has_work:
        gen.step()
    entries = gen.take_logprobs(rid)
    toks = gen.pop_finished()[rid]
    assert [e.token for e in entries] == toks


def test_draft_model_drafting_for_itself(smollm2_engine, gemma_engine):
    prompts = _prompts(smollm2_engine)
    ref = BatchGenerator(smollm2_engine, n_cells=1024, max_batch_tokens=64).generate(prompts, N_NEW)
    spec = Speculation(smollm2_engine, max_draft=4, draft_cells=512)
    gen = BatchGenerator(smollm2_engine, n_cells=1024, max_batch_tokens=64, speculative=spec)
    assert gen.generate(prompts, N_NEW) == ref
    st = gen.stats
    assert st["spec_drafted_tokens"] > 0
    assert st["spec_accepted_tokens"] == st["spec_drafted_tokens"]  # its own greedy tokens
    assert gen._drafter.kc.live_seqs == []  # finished requests' draft sequences are freed
    with pytest.raises(InvalidArgumentError, match="vocabulary"):
        BatchGenerator(smollm2_engine, n_cells=64, speculative=gemma_engine)


def test_bad_speculation_arguments_are_refused(smollm2_engine):
    for bad in ("bigram", 3, Speculation):
        with pytest.raises(InvalidArgumentError, match="speculative"):
            BatchGenerator(smollm2_engine, n_cells=64, speculative=bad)
    with pytest.raises(InvalidArgumentError, match="max_draft"):
        Speculation("ngram", max_draft=0)
    gen = BatchGenerator(smollm2_engine, n_cells=256, speculative="ngram")
    with pytest.raises(InvalidArgumentError, match="speculative"):
        gen.add([1, 2, 3], 4, speculative="no")
    assert not gen.has_work  # nothing queued


def test_opted_out_and_sampled_requests(smollm2_engine):
    gen = BatchGenerator(smollm2_engine, n_cells=1024, max_batch_tokens=64, speculative=FLAT)
    p = _prompts(smollm2_engine)[1]
    gen.generate([p], N_NEW, speculative=False)
    assert gen.stats["spec_drafted_tokens"] == 0  # alone and opted out: no drafts
    kw = dict(temperature=0.8, top_p=0.9, seed=7)
    a = gen.generate([p], N_NEW, **kw)[0]
    assert gen.stats["spec_drafted_tokens"] > 0
    gen.clear_prefix_cache()
    assert gen.generate([p], N_NEW, **kw)[0] == a  # a seed repeats its tokens
    assert len(a) == N_NEW and all(0 <= t < smollm2_engine.vocab_size for t in a)


def test_the_rejection_rule_keeps_the_distribution():
    row = np.array([1.0, 2.5, 0.3, 2.0, -1.0, 1.7], dtype=np.float32)
    p = distribution(row, 0.9, 0.95)
    n = 20000
    for draft in (1, 4):  # a likely draft, and one outside the top-p head (p = 0)
        rng = sampler_for(0.9, 3, numpy=True)
        counts = np.bincount([accept(row, draft, 0.9, 0.95, rng) for _ in range(n)], minlength=6)
        assert np.all(np.abs(counts / n - p) < 0.015), (draft, counts / n, p)
    assert p[4] == 0.0
    assert accept(row, 3, 0.0, 1.0, None) == 1  # greedy: the argmax, whatever was drafted


def test_prompt_lookup_drafts_the_latest_longest_match():
    idx = NgramIndex(max_n=3, min_n=2)
    toks = [1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 2, 3]
    # "2 3" recurs; its latest earlier occurrence (followed by 7 8 5) wins over the first.
    assert idx.draft(toks, 3) == [7, 8, 5]
    toks += [9, 1, 2, 3]  # now "1 2 3" (3 tokens) last occurred before 7
    assert idx.draft(toks, 2) == [7, 8]
    assert NgramIndex().draft([1, 2, 3, 4], 4) == []  # nothing recurs
    assert NgramIndex().draft([5, 6, 5, 6], 0) == []


def test_gguf_model_generate_speculating(smollm2_engine):
    p = _prompts(smollm2_engine)[1]
    plain = smollm2_engine.generate(p, 24)
    assert smollm2_engine.generate(p, 24, speculative="ngram") == plain
    assert (
        plain
        == BatchGenerator(smollm2_engine, n_cells=256).generate(
            [p], 24, eos_token_id=smollm2_engine.eos_token_ids
        )[0]
    )


def _drafted_lengths(engine, spec, n_new=N_NEW, found=None):
    """Greedy tokens of one speculating request, the lengths it asked the drafter for, and
    the generator; ``found`` (a list) takes the length of each draft the drafter returned."""
    gen = BatchGenerator(engine, n_cells=1024, max_batch_tokens=64, speculative=spec)
    asked: list[tuple[int, int]] = []  # (length, the request's room for drafts)
    draft = gen._drafter.draft

    def spy(wants):
        asked.extend((k, r.max_new_tokens - len(r.generated) - 1) for r, k in wants)
        got = draft(wants)
        if found is not None:
            found.extend(len(d) for d in got)
        return got

    gen._drafter.draft = spy
    p = _prompts(engine)[1]
    return gen.generate([p], n_new)[0], asked, gen


def test_draft_lengths_follow_the_step_cost(smollm2_engine):
    plain = BatchGenerator(smollm2_engine, n_cells=1024).generate(
        [_prompts(smollm2_engine)[1]], N_NEW
    )[0]
    # By 4-token chunks (an AVX2 kernel's lockstep rows): a draft ends at a chunk's end.
    chunked = {t: 1.0 + 0.5 * (-(-t // 4) - 1) for t in range(1, 13)}
    out, asked, gen = _drafted_lengths(smollm2_engine, Speculation("ngram", step_cost=chunked))
    assert out == plain
    assert asked and all(k in (3, 7) or k == room < 3 for k, room in asked), asked
    assert gen.stats["spec_accepted_tokens"] > 0
    # Any draft costing 10x a one-token step: only the probes draft, one in PROBE_EVERY steps
    # (a probe the drafter finds nothing for asks again the next step).
    costly = {t: 10.0 for t in range(2, 13)}
    found: list[int] = []
    spec = Speculation("ngram", step_cost=costly)
    out, asked, gen = _drafted_lengths(smollm2_engine, spec, found=found)
    assert out == plain
    assert asked and len(found) == len(asked)
    drafted = sum(1 for n in found if n)
    assert drafted <= gen.stats["steps"] // PROBE_EVERY + 1, (asked, found)
    # Measured on this machine: whatever it picks, greedy output is unchanged.
    out, _, gen = _drafted_lengths(smollm2_engine, "ngram")
    assert out == plain
    assert set(gen.step_cost.ratios()) >= {1}
