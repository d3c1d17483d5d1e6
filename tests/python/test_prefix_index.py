"""PrefixIndex: the radix tree BatchGenerator finds fork sources with, against brute force."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st
from offgraph_kv.prefix_index import PrefixIndex, common_prefix


def brute(seqs: dict[int, list[int]], prompt: list[int], limit: int) -> dict[int, int]:
    out = {}
    for k, toks in seqs.items():
        n = min(common_prefix(prompt, toks), limit)
        if n > 0:
            out[k] = n
    return out


tokens = st.lists(st.integers(0, 3), max_size=12)
ops = st.lists(
    st.tuples(
        st.sampled_from(["insert", "extend", "remove", "truncate"]), st.integers(0, 5), tokens
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(ops, st.lists(tokens, min_size=1, max_size=5))
def test_longest_equals_brute_force_after_any_edits(script, prompts):
    idx, seqs = PrefixIndex(), {}
    for op, key, toks in script:
        if op == "insert" and key not in seqs:
            idx.insert(key, toks)
            seqs[key] = list(toks)
        elif op == "extend" and key in seqs:
            idx.extend(key, toks)
            seqs[key] += toks
        elif op == "remove":
            idx.remove(key)
            seqs.pop(key, None)
        elif op == "truncate" and key in seqs:
            idx.truncate(key, len(toks))
            seqs[key] = seqs[key][: len(toks)]
        assert len(idx) == len(seqs)
        for k, v in seqs.items():
            assert idx.tokens(k) == v and idx.length(k) == len(v)
    for prompt in prompts:
        for limit in (len(prompt), max(0, len(prompt) - 1)):
            got = list(idx.longest(prompt, limit))
            assert dict(got) == brute(seqs, prompt, limit)
            assert len(got) == len(dict(got))  # each key once
            assert [n for _, n in got] == sorted((n for _, n in got), reverse=True)


def test_removing_everything_leaves_an_empty_tree():
    idx = PrefixIndex()
    rnd = random.Random(0)
    for k in range(50):
        idx.insert(k, [rnd.randrange(3) for _ in range(rnd.randrange(20))])
    for k in range(50):
        idx.remove(k)
    assert len(idx) == 0 and not idx._root.children and not idx._root.keys
