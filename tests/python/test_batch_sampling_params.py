"""BatchGenerator's per-request ``logit_bias``, ``frequency_penalty`` and ``presence_penalty`` on
a pure-numpy model whose logits are a fixed row per last token: every generated token is
checked against OpenAI's formula applied to that row by hand (``logits[j] += bias[j] - c[j] *
frequency_penalty - (c[j] > 0) * presence_penalty``, ``c`` the request's generated tokens, the
prompt not counted); the logprobs stay the model's; a request's bias never reaches its batch
neighbours; bad values are refused and queue nothing."""

from __future__ import annotations

import math

import numpy as np
import offgraph_kv as okv
import pytest
import torch
from offgraph_kv.batch import BatchGenerator
from offgraph_kv.batch.sampling import adjusted

VOCAB = 16
# Row t: the logits after token t. Token 3 leads every row by a margin, so greedy repeats it.
TABLE = np.random.default_rng(5).normal(0.0, 1.0, (VOCAB, VOCAB)).astype(np.float32)
TABLE[:, 3] = TABLE.max(axis=1) + 1.5


class TableModel:
    """A model in the native engine's shape whose logits are ``TABLE[last token]``."""

    vocab_size = VOCAB
    max_positions = 256
    eos_token_ids: list[int] = []

    def layer_configs(self):
        return [okv.LayerConfig(okv.Flat(), 1, 2)]

    def forward_cells(self, kc, tokens, positions, rows):
        kv = np.zeros((1, len(tokens), 2), np.float32)
        kc.update(0, kv, kv)
        return TABLE[np.asarray(tokens)[list(rows)]].copy()


def by_hand(prompt, new, bias=None, freq=0.0, pres=0.0):
    """Greedy tokens with the formula applied in float64 to each step's row."""
    last, counts, out = prompt[-1], {}, []
    for _ in range(new):
        row = TABLE[last].astype(np.float64)
        for j, c in counts.items():
            row[j] -= c * freq + (c > 0) * pres
        for j, b in (bias or {}).items():
            row[j] += b
        last = int(np.argmax(row))
        counts[last] = counts.get(last, 0) + 1
        out.append(last)
    return out


def gen():
    return BatchGenerator(TableModel(), n_cells=256, max_batch_tokens=32)


def test_greedy_repeats_and_a_penalty_breaks_the_repetition_by_the_formula():
    plain = gen().generate([[1, 2]], 8)[0]
    assert plain == [3] * 8 == by_hand([1, 2], 8)
    for freq, pres in [(0.5, 0.0), (0.0, 1.0), (1.2, -0.3), (-2.0, 2.0), (2.0, 0.0)]:
        got = gen().generate([[1, 2]], 12, frequency_penalty=freq, presence_penalty=pres)[0]
        assert got == by_hand([1, 2], 12, freq=freq, pres=pres), (freq, pres)
    assert gen().generate([[1, 2]], 8, frequency_penalty=2.0)[0] != plain
    # The prompt does not count: a prompt full of 3s still starts with 3.
    assert gen().generate([[3, 3, 3]], 1, presence_penalty=2.0)[0] == [3]


def test_adjusted_is_the_formula_on_torch_and_numpy_rows_and_leaves_the_row():
    rng = np.random.default_rng(1)
    row = rng.normal(0, 3, VOCAB).astype(np.float32)
    keep = row.copy()
    counts = {2: 3, 7: 1, 9: 2}
    bias = (np.array([7, 11], np.int64), np.array([-100.0, 4.5], np.float32))
    want = row.astype(np.float64)
    for j, c in counts.items():
        want[j] -= c * 0.7 + 0.4
    want[7] -= 100.0
    want[11] += 4.5
    for r in (row, torch.from_numpy(row.copy())):
        got = adjusted(r, bias, counts, 0.7, 0.4)
        assert got.dtype == np.float32 and np.allclose(got, want, atol=1e-5)
    assert np.array_equal(row, keep)


def test_logit_bias_bans_and_forces_greedy_and_sampled_and_logprobs_stay_the_models():
    g = gen()
    banned = g.add([1, 2], 6, logit_bias={3: -100}, logprobs=2)
    forced = g.add([1, 2], 6, logit_bias={9: 100.0}, temperature=1.0, seed=3)
    sampled = g.add([1, 2], 40, logit_bias={3: -100}, temperature=2.0, seed=4)
    free = g.add([1, 2], 6)  # in the same batch: no bias reaches it
    entries = []
    while g.has_work:
        g.step()
        entries += g.take_logprobs(banned) or []
    done = g.pop_finished()
    assert done[banned] == by_hand([1, 2], 6, bias={3: -100}) and 3 not in done[banned]
    assert done[forced] == [9] * 6
    assert 3 not in done[sampled]
    assert done[free] == [3] * 6
    # Logprobs are log_softmax of the model's own row, before the bias.
    prev = [2] + done[banned][:-1]
    for e, last in zip(entries, prev):
        x = TABLE[last].astype(np.float64)
        lse = x.max() + math.log(np.exp(x - x.max()).sum())
        assert abs(e.logprob - (x[e.token] - lse)) < 1e-5
        assert e.top[0][0] == 3  # the banned token is still the model's likeliest


@pytest.mark.parametrize(
    "kw",
    [
        {"logit_bias": {VOCAB: 1.0}},
        {"logit_bias": {-1: 1.0}},
        {"logit_bias": {2: 100.5}},
        {"logit_bias": {2: float("nan")}},
        {"logit_bias": {2: True}},
        {"logit_bias": {"2": 1.0}},
        {"logit_bias": [(2, 1.0)]},
        {"frequency_penalty": 2.5},
        {"presence_penalty": -2.01},
        {"frequency_penalty": float("inf")},
        {"presence_penalty": "1"},
    ],
)
def test_bad_bias_and_penalties_are_refused_and_queue_nothing(kw):
    g = gen()
    with pytest.raises(okv.InvalidArgumentError, match=next(iter(kw))):
        g.add([1, 2], 4, **kw)
    with pytest.raises(okv.InvalidArgumentError):
        g.generate([[1, 2], [3, 4]], 4, **kw)
    assert not g.has_work and g.stats["waiting"] == 0
    assert g.add([1, 2], 1) == 0  # a refused request took no id
