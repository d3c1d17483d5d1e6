"""Refusals of the core through Python: a layer the open step has not written has no
spec and is not attended (StepError naming it), a spec of a closed step is not
attended either; an id from one cell cache is refused by every other; an
overflowing cells_for_forks is InvalidArgumentError. Each leaves the state as it was."""

from __future__ import annotations

import numpy as np
import offgraph_kv as okv
import pytest

H, D = 1, 4


def config():
    layers = [okv.LayerConfig(okv.Flat(), H, D), okv.LayerConfig(okv.Ring(window=3), H, D)]
    return okv.CacheConfig(32, 2, layers, max_step=4)


def rows(n, x=1.0):
    return np.full((H, n, D), x, np.float32)


def q(n):
    return np.ones((2, n, D), np.float32)


def test_a_sequence_cache_layer_not_updated_in_the_open_step_is_refused():
    kv = okv.KvSequenceCache(config())
    kv.begin_step(1)
    s0 = kv.update(0, rows(1), rows(1))
    before = (kv.length, kv.nbytes(), kv.spec(0).k.tobytes())
    with pytest.raises(okv.StepError, match="layer 1 was not updated"):
        kv.spec(1)
    assert (kv.length, kv.nbytes(), kv.spec(0).k.tobytes()) == before
    okv.attend(q(1), s0)
    kv.update(1, rows(1), rows(1))
    # The next step: the earlier step's spec and the unwritten layer are refused.
    kv.begin_step(2)
    with pytest.raises(okv.StepError, match="layer 0"):
        okv.attend(q(1), s0)
    with pytest.raises(okv.StepError, match="layer 0 was not updated"):
        kv.spec(0)
    with pytest.raises(okv.ShapeError):
        kv.update(0, rows(1), rows(1))  # a refused update marks nothing
    with pytest.raises(okv.StepError, match="layer 0 was not updated"):
        kv.spec(0)
    okv.attend(q(2), kv.update(0, rows(2), rows(2)))


def test_a_cell_cache_layer_not_updated_in_the_open_step_is_refused():
    kc = okv.KvCellCache(config(), 16, n_seq_max=2)
    b = kc.control()
    s = b.seq_new()
    b.begin_step([s], [0])
    with pytest.raises(okv.StepError, match="layer 1 was not updated"):
        kc.spec(1)
    spec = kc.update(1, rows(1), rows(1))
    okv.attend(q(1), spec)
    kc.update(0, rows(1), rows(1))
    b.begin_step([s], [1])
    with pytest.raises(okv.StepError, match="layer 1"):
        okv.attend(q(1), spec)
    with pytest.raises(okv.StepError, match="layer 1 was not updated"):
        kc.spec(1)
    assert (b.next_pos(s), b.free_cells) == (2, 14)


def test_ids_are_unique_across_cell_caches_and_refused_by_the_other():
    a = okv.KvCellCache(config(), 8, n_seq_max=2)
    c = okv.CellCache(config(), 8, n_seq_max=2)
    x, y = a.control().seq_new(), c.control().seq_new()
    assert x != y
    ca = c.control()
    before = (ca.live_seqs, ca.free_cells, [ca.next_pos(s) for s in ca.live_seqs])
    for verb in (ca.seq_free, ca.next_pos, ca.seq_len, ca.seq_clone):
        with pytest.raises(okv.UnknownSequenceError):
            verb(x)
    with pytest.raises(okv.UnknownSequenceError):
        ca.seq_rm(x, 0)
    with pytest.raises(okv.UnknownSequenceError):
        ca.begin_step([x], [0])
    assert (ca.live_seqs, ca.free_cells, [ca.next_pos(s) for s in ca.live_seqs]) == before
    with pytest.raises(okv.UnknownSequenceError):
        a.save_seq(y)
    seen = {x, y}
    for _ in range(50):
        for cache in (a, c):
            s = cache.control().seq_new()
            assert s not in seen and 0 <= s < 2**63
            seen.add(s)
            cache.control().seq_free(s)


def test_cells_for_forks_overflow_is_invalid_argument():
    cfg = config()
    assert okv.cells_for_forks(cfg, 4, 2, 3) > 0
    # Within int64 each, the count is past 2**64 (it used to saturate to 2**64 - 1).
    for prefix, n_seqs, new_tokens in [
        (2**40, 2**40, 2**40),
        (2**63 - 1, 2**62, 4),
        (4, 2, 2**63 - 1),
    ]:
        with pytest.raises(okv.InvalidArgumentError, match="overflows"):
            okv.cells_for_forks(cfg, prefix, n_seqs, new_tokens)
