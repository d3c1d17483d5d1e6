"""KvSequenceCache from Python: writes land where plans say, views are
zero-copy and read-only and never dangle, and bad rows write nothing."""

import gc

import numpy as np
import offgraph_kv as okv
import pytest
from conftest import gemma_like


def rows(rng, heads, t, dim, dtype=np.float32):
    return rng.standard_normal((heads, t, dim)).astype(dtype)


def read_rows(spec):
    """The pool rows over the spec's read runs: [heads, valid, dim]."""
    k = np.concatenate([spec.k[:, s : s + n] for s, n in spec.read], axis=1)
    v = np.concatenate([spec.v[:, s : s + n] for s, n in spec.read], axis=1)
    return k, v


def test_history_matches_naive_model_across_doublings():
    rng = np.random.default_rng(0)
    cfg = gemma_like(capacity=80, max_step=8, window=16, heads=2, dim=4)
    kv = okv.KvSequenceCache(cfg)
    hist = [[np.zeros((2, 0, 4), np.float32)] * 2 for _ in range(3)]
    slots_seen = set()
    for n in [7, 5, 5] + [1] * 40 + [8, 3, 8]:
        pos = kv.control().begin_step(n)
        for layer in range(3):
            k, v = rows(rng, 2, n, 4), rows(rng, 2, n, 4)
            hist[layer][0] = np.concatenate([hist[layer][0][:, :pos], k], axis=1)
            hist[layer][1] = np.concatenate([hist[layer][1][:, :pos], v], axis=1)
            spec = kv.update(layer, k, v)
            assert spec.positions == list(range(pos, pos + n))
            got_k, got_v = read_rows(spec)
            lo = spec.read_base_pos
            np.testing.assert_array_equal(got_k, hist[layer][0][:, lo : pos + n])
            np.testing.assert_array_equal(got_v, hist[layer][1][:, lo : pos + n])
            # nbytes: the rows written since the last clear (K and V, 2 heads, 4 floats)
            assert kv.nbytes(layer) == 2 * 2 * min(pos + n, cfg.depth(layer)) * 4 * 4
            assert kv.pool_slots(layer) <= cfg.depth(layer)
            slots_seen.add(kv.pool_slots(2))
    if kv.pool_memory == "reserve":
        assert slots_seen == {cfg.depth(2)}  # the stride is the depth from the start
    else:
        assert len(slots_seen) >= 5  # the flat pool doubled at least four times
    assert kv.nbytes() == sum(kv.nbytes(i) for i in range(3))
    assert kv.pool_slots(0) == cfg.depth(0)  # the ring never exceeds its depth


def test_views_are_zero_copy_and_read_only():
    kv = okv.KvSequenceCache(gemma_like(heads=2, dim=4))
    kv.begin_step(1)
    spec = kv.update(2, np.ones((2, 1, 4), np.float32), np.zeros((2, 1, 4), np.float32))
    slots = spec.slots
    assert slots == kv.pool_slots(2) and spec.k.shape == (2, slots, 4)
    k1, k2 = spec.k, spec.k
    assert np.shares_memory(k1, k2)
    assert not k1.flags.writeable
    with pytest.raises(ValueError):
        k1[0, 0, 0] = 5.0
    kv.begin_step(1)
    kv.update(2, np.full((2, 1, 4), 7, np.float32), np.zeros((2, 1, 4), np.float32))
    # Same buffer (no growth): the view sees the row written in place.
    assert kv.pool_slots(2) == slots
    assert k1[0, 1, 0] == 7.0


def test_views_survive_growth_clear_and_drop():
    cfg = gemma_like(capacity=64, max_step=4, heads=2, dim=4)
    kv = okv.KvSequenceCache(cfg)
    kv.begin_step(2)
    first = np.arange(16, dtype=np.float32).reshape(2, 2, 4)
    spec = kv.update(2, first, first + 100)
    k_view, v_view = spec.k, spec.v
    for _ in range(15):  # many doublings of a pool that grows by copying
        kv.begin_step(4)
        kv.update(2, np.full((2, 4, 4), -1, np.float32), np.full((2, 4, 4), -1, np.float32))
    np.testing.assert_array_equal(k_view[:, :2], first)
    np.testing.assert_array_equal(v_view[:, :2], first + 100)
    kv.rewind(kv.length - 1)
    kv.clear()
    del kv, spec
    gc.collect()
    # Still readable after clear and the cache's end: the base owns the memory
    # (a reservation's pages were given back and read as zeros).
    assert np.isfinite(np.asarray(k_view)).all() and np.isfinite(np.asarray(v_view)).all()


def test_bad_rows_are_refused_and_write_nothing():
    kv = okv.KvSequenceCache(gemma_like(heads=2, dim=4))
    kv.begin_step(2)
    good = np.ones((2, 2, 4), np.float32)
    kv.update(0, good, good)
    before = kv.spec(0).k.copy()

    cases = [
        (okv.DTypeError, "float32, float16 or bfloat16, got float64", good.astype(np.float64)),
        (okv.DTypeError, "got uint16", good.astype(np.uint16)),
        (okv.DTypeError, "got int32", good.astype(np.int32)),
        (okv.DTypeError, "got list", good.tolist()),
        (okv.ShapeError, r"\[2, 2, 4\], got \[2, 2, 5\]", np.ones((2, 2, 5), np.float32)),
        (okv.ShapeError, r"got \[3, 2, 4\]", np.ones((3, 2, 4), np.float32)),
        (okv.ShapeError, r"got \[2, 3, 4\]", np.ones((2, 3, 4), np.float32)),
        (okv.ShapeError, "got \\[8\\]", np.ones(8, np.float32)),
        (okv.ShapeError, r"got \[2, 2, 2, 4\]", np.ones((2, 2, 2, 4), np.float32)),
        (okv.ShapeError, r"got \[2, 0, 4\]", np.ones((2, 0, 4), np.float32)),
    ]
    for exc, msg, bad in cases:
        with pytest.raises(exc, match=msg):
            kv.update(0, bad, good)
        with pytest.raises(exc, match=msg):
            kv.update(0, good, bad)
        np.testing.assert_array_equal(kv.spec(0).k, before)
    with pytest.raises(okv.InvalidArgumentError, match="layer 7"):
        kv.update(7, good, good)
    np.testing.assert_array_equal(kv.spec(0).k, before)


def test_batch_axis_and_non_contiguous_input():
    kv = okv.KvSequenceCache(gemma_like(heads=2, dim=4))
    kv.begin_step(3)
    base = np.arange(2 * 3 * 4 * 2, dtype=np.float32).reshape(2, 3, 8)
    strided = base[:, :, ::2]  # non-contiguous
    assert not strided.flags.c_contiguous
    spec = kv.update(2, strided[None], strided[:, ::-1][:, ::-1])  # batch of 1; negative strides
    np.testing.assert_array_equal(spec.k[:, :3], strided)
    np.testing.assert_array_equal(spec.v[:, :3], strided)


def test_update_needs_an_open_step():
    kv = okv.KvSequenceCache(gemma_like(heads=2, dim=4))
    with pytest.raises(okv.StepError):
        kv.update(0, np.ones((2, 1, 4), np.float32), np.ones((2, 1, 4), np.float32))
    assert kv.length == 0


def test_a_pool_the_allocator_refuses_raises_capacity_error():
    huge = okv.CacheConfig(
        2**31, 1, okv.LayerConfig(okv.Flat(), 4096, 65536), initial_capacity=2**31
    )
    huge.validate()
    with pytest.raises(okv.CapacityError, match="cannot allocate"):
        okv.KvSequenceCache(huge)
    with pytest.raises(okv.CapacityError, match="cannot allocate"):
        okv.KvCellCache(huge, 2**20, n_seq_max=1)


def test_rows_may_be_a_view_of_the_pool_they_are_written_into():
    cfg = okv.CacheConfig(16, 1, okv.LayerConfig(okv.Flat(), 1, 4), initial_capacity=16, max_step=4)
    kv = okv.KvSequenceCache(cfg)
    kv.begin_step(4)
    rows = np.arange(16, dtype=np.float32).reshape(1, 4, 4)
    spec = kv.update(0, rows, rows + 1)
    kv.begin_step(3)
    k_in, v_in = spec.k[:, 2:5], spec.v[:, 2:5]  # pool views overlapping the target slots
    assert k_in.flags.c_contiguous
    want_k, want_v = k_in.copy(), v_in.copy()
    spec = kv.update(0, k_in, v_in)  # writes slots 4..6 from slots 2..4
    np.testing.assert_array_equal(spec.k[:, 4:7], want_k)
    np.testing.assert_array_equal(spec.v[:, 4:7], want_v)


def test_ring_window_above_capacity_is_a_full_layer_and_initial_capacity_clamps():
    # The upstream suite's edge: Ring(64) in a 32-token cache, initial_capacity 512.
    ring = okv.LayerConfig(okv.Ring(window=64), 2, 8)
    flat = okv.LayerConfig(okv.Flat(), 2, 8)
    kr = okv.KvSequenceCache(okv.CacheConfig(32, 1, [ring], initial_capacity=512, max_step=4))
    kf = okv.KvSequenceCache(okv.CacheConfig(32, 1, [flat], initial_capacity=512, max_step=4))
    rng = np.random.default_rng(0)
    for _ in range(8):
        k = rng.standard_normal((2, 4, 8), dtype=np.float32)
        v = rng.standard_normal((2, 4, 8), dtype=np.float32)
        q = rng.standard_normal((4, 4, 8), dtype=np.float32)
        kr.begin_step(4)
        kf.begin_step(4)
        sr, sf = kr.update(0, k, v), kf.update(0, k, v)
        assert sr.k.shape[1] == 32  # clamped to the depth, which the capacity bounds
        assert sr.read_base_pos == 0 and sr.mask_kind != "window"
        np.testing.assert_array_equal(okv.attend(q, sr), okv.attend(q, sf))
    kr.rewind(0)  # a ring that never wraps never bounds a rewind
    assert kr.length == 0


def test_held_runs_answer_with_no_step_open_and_refuse_what_is_not_held():
    """gemma_like: ring window 8, max_step 4, depth 11. After 40 tokens and a rewind deeper than
    the last step, the ring still holds [29, 36) in two runs; the pool rows there are the rows
    written at those positions."""
    kv = okv.KvSequenceCache(gemma_like())
    for step in range(10):
        kv.begin_step(4)
        pos = np.arange(4 * step, 4 * step + 4, dtype=np.float32)
        k = np.zeros((2, 4, 16), np.float32) + pos[:, None]  # every row holds its position
        ring = kv.update(0, k, -k)
        kv.update(1, k, -k)
        spec = kv.update(2, k, -k)  # flat
    kv.rewind(36)
    assert not kv.step_open
    assert kv.held_range(0) == (29, 36) and kv.held_range(2) == (0, 36)
    assert kv.held_runs(0, 29, 36) == [(7, 4), (0, 3)]
    assert kv.held_runs(2, 0, 36) == [(0, 36)]
    np.testing.assert_array_equal(spec.k[0, :36, 0], np.arange(36, dtype=np.float32))
    held = np.concatenate([ring.k[1, s : s + n, 0] for s, n in kv.held_runs(0, 29, 36)])
    np.testing.assert_array_equal(held, np.arange(29, 36, dtype=np.float32))
    before = (kv.length, kv.high_water, kv.held_range(0), kv.held_range(2), kv.step_open)
    for layer, lo, hi in [(0, 28, 36), (0, 29, 37), (0, 33, 31), (2, 0, 37), (3, 0, 1)]:
        with pytest.raises(okv.InvalidArgumentError):
            kv.held_runs(layer, lo, hi)
        assert (
            kv.length,
            kv.high_water,
            kv.held_range(0),
            kv.held_range(2),
            kv.step_open,
        ) == before
    with pytest.raises(okv.InvalidArgumentError):
        kv.held_range(3)
    kv.clear()
    assert kv.held_range(0) == (0, 0) and kv.held_runs(0, 0, 0) == []
