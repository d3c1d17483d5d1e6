"""CellCache from Python: forks share cells, masks in position space, and the
refusals with their exception classes, each leaving the state unchanged."""

import numpy as np
import offgraph_kv as okv
import pytest


def cfg(window=4, max_step=4):
    ring = okv.LayerConfig(okv.Ring(window=window), 2, 8)
    flat = okv.LayerConfig(okv.Flat(), 2, 8)
    return okv.CacheConfig(1024, 2, [ring, flat], max_step=max_step)


def snapshot(cc):
    seqs = cc.live_seqs
    state = [repr(cc), cc.free_cells, seqs, [(cc.next_pos(s), cc.seq_len(s)) for s in seqs]]
    for layer in (0, 1):
        try:
            p = cc.plan(layer) if hasattr(cc, "plan") else cc.planner().plan(layer)
            state.append((repr(p), p.mask.tolist()))
        except okv.StepError:
            state.append("closed")
    return state


def refused(cc, exc, fn, *args, match=None, **kwargs):
    before = snapshot(cc)
    with pytest.raises(exc, match=match) as info:
        fn(*args, **kwargs)
    assert isinstance(info.value, okv.CacheError)
    assert snapshot(cc) == before
    return info.value


def test_prefix_fork_shares_cells_and_masks_by_position():
    cc = okv.CellCache(cfg(), 16, n_seq_max=4)
    b, pl = cc.control(), cc.planner()
    s = b.seq_new()
    b.begin_step([s] * 4, [0, 1, 2, 3])
    assert cc.free_cells == 12
    t = b.seq_clone(s)  # shares every cell: no new cells
    assert cc.free_cells == 12 and b.seq_len(t) == 4 and b.next_pos(t) == 4
    b.begin_step([s, t], [4, 4])
    flat = pl.plan(1)
    assert flat.cells.dtype == np.int32 and len(set(flat.cells.tolist())) == 2
    m = flat.mask
    assert m.dtype == np.bool_ and m.shape == (2, flat.read_len)
    # Each token sees the 4 shared cells plus its own, never the other fork's.
    assert m.sum(axis=1).tolist() == [5, 5]
    assert not m[0, flat.cells[1]] and not m[1, flat.cells[0]]
    ring = pl.plan(0)
    assert ring.window == 4 and ring.mask.sum(axis=1).tolist() == [4, 4]
    runs = ring.visible(0)
    assert sum(n for _, n in runs) == 4


def test_gap_under_a_window_is_masked_by_position():
    cc = okv.CellCache(cfg(window=2), 8)
    b = cc.control()
    s = b.seq_new()
    b.begin_step([s], [0])
    b.begin_step([s], [5])  # a gap: cells hold positions 0 and 5
    p = cc.planner().plan(0)
    # Position 0 is outside the window of 2 around position 5.
    assert p.mask.sum() == 1 and p.visible(0) == [(int(p.cells[0]), 1)]


def test_refusals_change_nothing():
    cc = okv.CellCache(cfg(), 8, n_seq_max=2)
    b, pl = cc.control(), cc.planner()
    refused(cc, okv.StepError, pl.plan, 0, match="no open step")
    s = b.seq_new()
    other = okv.CellCache(cfg(), 8).control()
    foreign = other.seq_new() + 1  # an id that cache never handed out here
    for verb, args in [
        (b.seq_free, (7,)),
        (b.next_pos, (7,)),
        (b.seq_len, (7,)),
        (b.seq_rm, (7,)),
        (b.seq_clone, (7,)),
        (b.begin_step, ([7], [0])),
        (b.seq_free, (foreign,)),
        (b.seq_free, (2**40,)),
    ]:
        refused(cc, okv.UnknownSequenceError, verb, *args)
    refused(cc, okv.InvalidArgumentError, b.seq_rm, -1)
    refused(cc, TypeError, b.begin_step, "ab", [0, 1])
    refused(cc, okv.InvalidArgumentError, b.begin_step, [s, s], [1, 0])
    refused(cc, okv.InvalidArgumentError, b.begin_step, [s], [0, 1])
    refused(cc, okv.InvalidArgumentError, b.begin_step, [], [])
    refused(cc, okv.InvalidArgumentError, b.begin_step, [s] * 5, list(range(5)), match="5")
    refused(cc, okv.InvalidArgumentError, b.seq_rm, s, 3, 1)
    b.begin_step([s] * 4, [0, 1, 2, 3])
    b.begin_step([s] * 4, [4, 5, 6, 7])
    refused(cc, okv.CapacityError, b.begin_step, [s], [8])
    refused(cc, okv.InvalidArgumentError, pl.plan, 2, match="layer 2")
    b.seq_new()
    refused(cc, okv.CapacityError, b.seq_new)
    b.seq_rm(s, 6)  # closes the step, frees two cells
    refused(cc, okv.StepError, pl.plan, 0)
    # A rewrite of a held position is refused, and the corrected step is accepted.
    refused(cc, okv.StepError, b.begin_step, [s], [5], match="5")
    b.begin_step([s], [6])
    b.seq_free(s)
    refused(cc, okv.UnknownSequenceError, b.seq_len, s)
    b.clear()
    assert cc.free_cells == 8 and cc.live_seqs == []


def test_stale_plan_objects_raise():
    cc = okv.CellCache(cfg(), 8)
    b = cc.control()
    s = b.seq_new()
    b.begin_step([s], [0])
    p = cc.planner().plan(1)
    b.seq_clone(s)
    with pytest.raises(okv.StepError, match="closed"):
        _ = p.mask
    with pytest.raises(okv.StepError):
        p.visible(0)
    assert p.cells.tolist() == [0]  # the snapshot stays readable
