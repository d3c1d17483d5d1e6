"""Constrained decoding's sharing of a batch, bit-exact, on a pure-numpy model whose logits are a
fixed row per last token (so a request's tokens cannot depend on its neighbours through the
model): a constrained and a free request in one batch each give the same tokens as alone, greedy
and seeded; the free one is plain greedy over the table; every constrained output matches its
grammar and stops as the grammar completes, and a mask never reaches a neighbour's row."""

from __future__ import annotations

import re

import numpy as np
import offgraph_kv as okv
import pytest
from offgraph_kv.batch import BatchGenerator, Constraint

PIECES = ["<eos>", "{", "}", '"', "a", "b", ":", " ", ",", "1", "2", '{"', '":', "x", "y", "\n"]
VOCAB = len(PIECES)
TABLE = np.random.default_rng(40).normal(0.0, 2.0, (VOCAB, VOCAB)).astype(np.float32)


class Vocab:
    """The tokenizer face constraints compile against: bytes per token, one special end token,
    a longest-match encoder."""

    vocab_size = VOCAB
    eos_token_id = 0
    bos_token_id = None

    def token_bytes(self, i):
        return PIECES[i].encode()

    def is_special(self, i):
        return i == 0

    def encode(self, text, add_special_tokens=True):
        out, i = [], 0
        while i < len(text):
            j = max(
                (k for k in range(1, VOCAB) if text.startswith(PIECES[k], i)),
                key=lambda k: len(PIECES[k]),
            )
            out.append(j)
            i += len(PIECES[j])
        return out


class TableModel:
    """A model in the native engine's shape whose logits are ``TABLE[last token]``."""

    vocab_size = VOCAB
    max_positions = 256
    eos_token_ids = [0]
    tokenizer = Vocab()

    def layer_configs(self):
        return [okv.LayerConfig(okv.Flat(), 1, 2)]

    def forward_cells(self, kc, tokens, positions, rows):
        kv = np.zeros((1, len(tokens), 2), np.float32)
        kc.update(0, kv, kv)
        return TABLE[np.asarray(tokens)[list(rows)]].copy()


def greedy(prompt, new):
    out, last = [], prompt[-1]
    for _ in range(new):
        last = int(np.argmax(TABLE[last]))
        out.append(last)
        if last == 0:
            break
    return out


def text(ids):
    return "".join(PIECES[i] for i in ids if i != 0)


def gen():
    return BatchGenerator(TableModel(), n_cells=256, max_batch_tokens=32)


CONSTRAINTS = [
    ("regex", lambda: Constraint.regex(r"(ab|ba){2,4}x"), r"(ab|ba){2,4}x"),
    (
        "lark",
        lambda: Constraint.lark('start: "a" by by? by? "x"\nby: "b" | "y"'),
        r"a[by]{1,3}x",
    ),
    (
        "json",
        lambda: Constraint.json_schema(
            {
                "type": "object",
                "properties": {"a": {"type": "integer"}},
                "required": ["a"],
                "additionalProperties": False,
            }
        ),
        r'\{"a": [12]+\}',
    ),
]


@pytest.mark.parametrize("name,build,pattern", CONSTRAINTS, ids=[c[0] for c in CONSTRAINTS])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_constrained_and_free_share_a_batch_and_each_equal_alone(name, build, pattern, temperature):
    kw = dict(temperature=temperature, seed=7)
    g = gen()
    rc = g.add([4, 5], 12, [0], constraint=build(), **kw)
    c_alone = g.run()[rc]
    g = gen()
    rf = g.add([1, 3, 9], 10, [0], **kw)
    f_alone = g.run()[rf]
    g = gen()
    rf2 = g.add([1, 3, 9], 10, [0], **kw)
    rc2 = g.add([4, 5], 12, [0], constraint=build(), **kw)
    out = g.run()
    assert out[rc2] == c_alone and out[rf2] == f_alone
    if temperature == 0:
        assert f_alone == greedy([1, 3, 9], 10)  # the free row is never masked
    # The grammar completes (no end token spent) and the output matches it.
    assert len(c_alone) < 12 and 0 not in c_alone
    assert re.fullmatch(pattern, text(c_alone)), text(c_alone)
