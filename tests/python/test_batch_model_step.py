"""BatchGenerator over the model-step adapter: a pure-numpy model that has ``forward_cells``.

The fake model (``CountingModel``) writes every token's K/V into the cell cache (K zero, V
``[token, 1]``) and attends with a zero query, so each layer's output is the mean of the tokens
the token sees: all of its sequence's tokens on the flat layer, the last ``WINDOW`` on the ring
layer. Its logits peak at ``next_token(tokens, pos)``, a function of the token, its position and
those two sums: a generator that feeds a wrong token or position, or forks a sequence holding
the wrong prefix, produces other tokens than ``reference`` (the same function over the request's
own history), so every output is checked exactly, batched or alone.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import offgraph_kv as okv
import pytest
from offgraph_kv.batch import BatchGenerator, CellsModel, ModelStep

VOCAB = 97
WINDOW = 4
MAX_POS = 512


def next_token(tokens: list[int], pos: int) -> int:
    """What the fake model predicts after ``tokens[pos]`` (``tokens[: pos + 1]`` its context)."""
    seen = tokens[: pos + 1]
    return (3 * seen[-1] + 5 * pos + sum(seen) + 7 * sum(seen[-WINDOW:])) % VOCAB


def reference(prompt: list[int], new: int, eos: int | None = None) -> list[int]:
    tokens = list(prompt)
    out: list[int] = []
    for _ in range(new):
        tok = next_token(tokens, len(tokens) - 1)
        tokens.append(tok)
        out.append(tok)
        if tok == eos:
            break
    return out


class CountingModel:
    """A model object in the native engine's shape: ``layer_configs``, ``vocab_size``,
    ``max_positions``, ``eos_token_ids`` and ``forward_cells``; records every forward."""

    def __init__(self) -> None:
        self.vocab_size = VOCAB
        self.max_positions = MAX_POS
        self.eos_token_ids = [0]
        self.calls: list[tuple[list[int], list[int], list[int]]] = []

    def layer_configs(self) -> list[okv.LayerConfig]:
        return [okv.LayerConfig(okv.Flat(), 1, 2), okv.LayerConfig(okv.Ring(window=WINDOW), 1, 2)]

    def forward_cells(self, kc, tokens, positions, rows):
        self.calls.append((list(tokens), list(positions), list(rows)))
        t = len(tokens)
        k = np.zeros((1, t, 2), np.float32)
        v = np.zeros((1, t, 2), np.float32)
        v[0, :, 0] = tokens
        v[0, :, 1] = 1.0
        q = np.zeros((1, t, 2), np.float32)  # equal scores: each output is a plain mean
        means = [okv.attend(q, kc.update(layer, k, v))[0, :, 0] for layer in range(2)]
        pos = np.asarray(positions)
        s_all = np.rint(means[0] * (pos + 1)).astype(np.int64)
        s_win = np.rint(means[1] * np.minimum(pos + 1, WINDOW)).astype(np.int64)
        tok = np.asarray(tokens, np.int64)
        target = (3 * tok + 5 * pos + s_all + 7 * s_win) % VOCAB
        logits = np.full((len(rows), VOCAB), -4.0, np.float32)
        logits[np.arange(len(rows)), target[rows]] = 4.0
        return logits


def prompt(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(1, VOCAB, n).tolist()


def test_the_fake_model_is_a_model_step_and_the_generator_adapts_it():
    model = CountingModel()
    assert isinstance(model, ModelStep)
    gen = BatchGenerator(model, n_cells=256, max_batch_tokens=16)
    assert isinstance(gen.model_step, CellsModel)
    assert (gen.vocab_size, gen.max_positions, gen.eos_token_ids) == (VOCAB, MAX_POS, [0])
    assert gen.n_layers == 2 and gen.has_flat and gen.ring_depth == WINDOW + 16 - 1


def test_batched_with_forks_equals_the_reference_and_one_at_a_time():
    prefix = prompt(24, 1)
    prompts = [prefix + prompt(k, 10 + k) for k in (3, 7, 1, 12)] + [prompt(30, 2)]
    model = CountingModel()
    gen = BatchGenerator(model, n_cells=512, max_batch_tokens=16)
    got = gen.generate(prompts, 12)
    assert got == [reference(p, 12) for p in prompts]
    st = gen.stats
    assert st["forks"] == 3 and st["prefix_tokens_reused"] >= 3 * 16
    assert st["prefill_tokens"] == sum(len(p) for p in prompts) - st["prefix_tokens_reused"]
    assert st["generated_tokens"] == 5 * 12 and st["forward_tokens"] == sum(
        len(t) for t, _, _ in model.calls
    )
    assert st["cells_used"] < st["cells_unshared"]
    for p, g in zip(prompts, got):  # the same request alone, on a fresh generator
        alone = BatchGenerator(CountingModel(), n_cells=512, max_batch_tokens=16)
        assert alone.generate([p], 12) == [g]


def test_every_forward_gets_each_sequence_its_next_tokens_at_its_next_positions():
    model = CountingModel()
    gen = BatchGenerator(model, n_cells=512, max_batch_tokens=8)
    prompts = [prompt(11, 3), prompt(5, 4), prompt(19, 5)]
    gen.generate(prompts, 6)
    for tokens, positions, rows in model.calls:
        assert len(tokens) == len(positions) <= 8
        assert rows == sorted(rows) and all(0 <= r < len(tokens) for r in rows)
    # Every position of every request was fed exactly once: prompt plus all new tokens but the
    # last, none of them twice (no fork here: distinct prompts).
    fed = sorted(p for _, positions, _ in model.calls for p in positions)
    want = sorted(p for pr in prompts for p in range(len(pr) + 6 - 1))
    assert fed == want


def test_decoders_and_late_requests_share_steps():
    model = CountingModel()
    gen = BatchGenerator(model, n_cells=512, max_batch_tokens=8)
    a = gen.add(prompt(3, 6), 10)
    gen.step()
    b = gen.add(prompt(40, 7), 4)  # a long prefill: `a` keeps decoding meanwhile
    c = gen.add(prompt(2, 8), 5, eos_token_id=reference(prompt(2, 8), 5)[2])
    done = gen.run()
    assert done[a] == reference(prompt(3, 6), 10)
    assert done[b] == reference(prompt(40, 7), 4)
    assert done[c] == reference(prompt(2, 8), 5)[:3]  # stopped at its eos, which ends it
    assert gen.request_info(c) is None  # collected by run


def test_seeded_sampling_repeats_batched_or_alone():
    prompts = [prompt(9, 20), prompt(9, 20) + [5], prompt(14, 21)]
    kw = dict(temperature=1.5, top_p=0.9, seed=7)
    batched = BatchGenerator(CountingModel(), n_cells=256, max_batch_tokens=16)
    rids = [batched.add(p, 8, **kw) for p in prompts]
    done = batched.run()
    for rid, p in zip(rids, prompts):
        alone = BatchGenerator(CountingModel(), n_cells=256, max_batch_tokens=16)
        assert alone.generate([p], 8, **kw) == [done[rid]]


def test_prefix_cache_serves_a_later_request_and_eviction_frees_it():
    model = CountingModel()
    gen = BatchGenerator(model, n_cells=64, max_batch_tokens=16)
    first = prompt(30, 30)
    assert gen.generate([first], 4) == [reference(first, 4)]
    assert gen.stats["cached_sequences"] == 1
    second = first + reference(first, 4)[:3] + [7]  # the first sequence holds all but [7]
    assert gen.generate([second], 4) == [reference(second, 4)]
    assert gen.stats["forks"] == 1 and gen.stats["prefix_tokens_reused"] == len(second) - 1
    other = prompt(40, 31)  # needs the cells both cached sequences hold
    assert gen.generate([other], 10) == [reference(other, 10)]
    assert gen.stats["evictions"] >= 1


class WrongShape(CountingModel):
    def forward_cells(self, kc, tokens, positions, rows):
        return super().forward_cells(kc, tokens, positions, rows)[:, :-1]


class WrongDtype(CountingModel):
    def forward_cells(self, kc, tokens, positions, rows):
        return super().forward_cells(kc, tokens, positions, rows).astype(np.float64)


@pytest.mark.parametrize(
    ("cls", "err"), [(WrongShape, okv.ShapeError), (WrongDtype, okv.DTypeError)]
)
def test_bad_logits_are_refused_and_the_cache_is_as_before(cls, err):
    gen = BatchGenerator(cls(), n_cells=64, max_batch_tokens=8)
    gen.add(prompt(5, 40), 3)
    free = gen.kc.free_cells
    with pytest.raises(err, match="forward_cells"):
        gen.step()
    assert gen.kc.seq_len(gen._running[0].seq) == 0  # the failed step's tokens are not held
    assert gen.kc.free_cells == free and gen.stats["steps"] == 0


class NoLayers(CountingModel):
    def layer_configs(self):
        return []


class BadVocab(CountingModel):
    def __init__(self):
        super().__init__()
        self.vocab_size = 0


@pytest.mark.parametrize("cls", [NoLayers, BadVocab])
def test_a_model_with_bad_attributes_is_refused_at_construction(cls):
    with pytest.raises(okv.ConfigError):
        BatchGenerator(cls(), n_cells=64)


def test_requests_are_checked_against_the_model_step_limits():
    gen = BatchGenerator(CountingModel(), n_cells=64)
    with pytest.raises(okv.InvalidArgumentError, match="vocabulary"):
        gen.add([VOCAB], 2)
    with pytest.raises(okv.CapacityError, match="positions"):
        gen.add([1] * MAX_POS, 2)
    assert not gen.has_work


def test_the_engine_path_does_not_import_transformers():
    code = (
        "import sys\n"
        "from offgraph_kv.batch import BatchGenerator\n"
        "import test_batch_model_step as t\n"
        "g = BatchGenerator(t.CountingModel(), n_cells=64)\n"
        "assert g.generate([[1, 2, 3]], 3) == [t.reference([1, 2, 3], 3)]\n"
        "assert 'transformers' not in sys.modules, 'transformers imported'\n"
    )
    here = __file__.rsplit("/", 1)[0]
    res = subprocess.run(
        [sys.executable, "-c", code], cwd=here, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
