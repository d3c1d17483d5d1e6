"""attend() against a float64 numpy reference over flat, ring (two read runs)
and cell steps, both backends; dead rows poisoned with NaN; refusals."""

import sys
import threading

import numpy as np
import offgraph_kv as okv
import pytest

BACKENDS = ["native", "xnnpack", "auto"]


def reference(q, keys, vals, visible, scale):
    """q [H, T, D]; keys/vals [Hkv, N, D]; visible [T, N] bool."""
    q, keys, vals = (x.astype(np.float64) for x in (q, keys, vals))
    group = q.shape[0] // keys.shape[0]
    out = np.zeros_like(q)
    for h in range(q.shape[0]):
        kh = h // group
        s = q[h] @ keys[kh].T * scale
        s = np.where(visible, s, -np.inf)
        m = s.max(axis=1, keepdims=True)
        p = np.where(visible, np.exp(s - np.where(np.isfinite(m), m, 0)), 0)
        den = p.sum(axis=1, keepdims=True)
        out[h] = np.where(den > 0, (p @ vals[kh]) / np.where(den > 0, den, 1), 0)
    return out


def check(out, ref):
    scale = max(1.0, float(np.abs(ref).max()))
    assert np.abs(out - ref).max() <= 1e-5 * scale


def seq_visible(spec):
    """Rows of the spec's read runs and the analytic mask over them."""
    rows = [s + i for s, n in spec.read for i in range(n)]
    pos = [spec.read_base_pos + r for r in range(len(rows))]
    vis = np.zeros((len(spec.positions), len(rows)), bool)
    for t, q in enumerate(spec.positions):
        for r, p in enumerate(pos):
            ok = p <= q if spec.mask_kind != "none" else True
            if spec.window is not None:
                ok = ok and p > q - spec.window
            vis[t, r] = ok
    return rows, vis


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("group", [1, 2, 4, 8])
def test_sequence_steps_match_reference(backend, group):
    rng = np.random.default_rng(group)
    heads, dim = 2, 24
    ring = okv.LayerConfig(okv.Ring(window=9), heads, dim)
    flat = okv.LayerConfig(okv.Flat(), heads, dim)
    cfg = okv.CacheConfig(200, 2, [ring, flat], initial_capacity=4, max_step=17)
    kv = okv.KvSequenceCache(cfg)
    two_runs = 0
    for t in [17, 3, 1, 1, 17, 1]:
        kv.begin_step(t)
        for layer in (0, 1):
            k = rng.standard_normal((heads, t, dim)).astype(np.float32)
            v = rng.standard_normal((heads, t, dim)).astype(np.float32)
            spec = kv.update(layer, k, v)
            q = rng.standard_normal((heads * group, t, dim)).astype(np.float32)
            two_runs += len(spec.read) == 2
            rows, vis = seq_visible(spec)
            ref = reference(q, spec.k[:, rows], spec.v[:, rows], vis, dim**-0.5)
            check(okv.attend(q, spec, backend=backend, threads=1 + (t % 2)), ref)
    assert two_runs > 0  # the ring wrapped: reads over two runs were checked


@pytest.mark.parametrize("backend", BACKENDS)
def test_cell_steps_match_reference(backend):
    rng = np.random.default_rng(7)
    heads, dim = 2, 16
    cfg = okv.CacheConfig(
        256,
        2,
        [okv.LayerConfig(okv.Ring(window=5), heads, dim), okv.LayerConfig(okv.Flat(), heads, dim)],
        max_step=8,
    )
    kc = okv.KvCellCache(cfg, 64, n_seq_max=8)
    b = kc.control()
    s = b.seq_new()
    b.begin_step([s] * 6, list(range(6)))
    for layer in (0, 1):
        kc.update(layer, *(rng.standard_normal((2, heads, 6, dim)).astype(np.float32)))
    t = b.seq_clone(s)
    u = b.seq_clone(s, upto=3)
    for _ in range(4):
        ids = [s, t, u, u]
        pos = [b.next_pos(s), b.next_pos(t) + 1, b.next_pos(u), b.next_pos(u) + 1]
        b.begin_step(ids, pos)
        for layer in (0, 1):
            k, v = rng.standard_normal((2, heads, 4, dim)).astype(np.float32)
            spec = kc.update(layer, k, v)
            q = rng.standard_normal((heads * 4, 4, dim)).astype(np.float32)
            n = spec.mask.shape[1]
            ref = reference(q, spec.k[:, :n], spec.v[:, :n], spec.mask, 0.3)
            check(okv.attend(q, spec, scale=0.3, backend=backend), ref)


def test_dead_rows_never_reach_the_output():
    heads, dim = 1, 8
    cfg = okv.CacheConfig(64, 1, okv.LayerConfig(okv.Ring(window=3), heads, dim), max_step=2)
    kv = okv.KvSequenceCache(cfg)
    rng = np.random.default_rng(1)
    nan = np.full((heads, 2, dim), np.nan, np.float32)
    for _ in range(10):
        kv.begin_step(2)
        kv.update(
            0,
            rng.standard_normal((heads, 2, dim)).astype(np.float32),
            rng.standard_normal((heads, 2, dim)).astype(np.float32),
        )
    # Poison the rows the ring no longer reads by writing NaN steps and rewinding.
    kv.begin_step(2)
    kv.update(0, nan, nan)
    kv.rewind(kv.length - 2)
    kv.begin_step(1)
    spec = kv.update(0, np.ones((heads, 1, dim), np.float32), np.ones((heads, 1, dim), np.float32))
    assert np.isnan(spec.k).any()  # poison is in the pool, outside the read runs
    for backend in ("native", "xnnpack"):
        out = okv.attend(np.ones((heads, 1, dim), np.float32), spec, backend=backend)
        assert np.isfinite(out).all()


def test_refusals():
    cfg = okv.CacheConfig(16, 1, okv.LayerConfig(okv.Flat(), 2, 8))
    kv = okv.KvSequenceCache(cfg)
    kv.begin_step(1)
    spec = kv.update(0, np.ones((2, 1, 8), np.float32), np.ones((2, 1, 8), np.float32))
    good = np.ones((4, 1, 8), np.float32)
    okv.attend(good, spec)
    with pytest.raises(okv.DTypeError, match="float64"):
        okv.attend(good.astype(np.float64), spec)
    with pytest.raises(okv.DTypeError):
        okv.attend(good.tolist(), spec)
    with pytest.raises(okv.ShapeError):
        okv.attend(np.ones((4, 8), np.float32), spec)
    with pytest.raises(okv.ShapeError, match="head_dim|8"):
        okv.attend(np.ones((4, 1, 7), np.float32), spec)
    with pytest.raises(okv.ShapeError, match="multiple"):
        okv.attend(np.ones((3, 1, 8), np.float32), spec)
    with pytest.raises(okv.InvalidArgumentError, match="backend"):
        okv.attend(good, spec, backend="gpu")
    with pytest.raises(okv.InvalidArgumentError, match="threads"):
        okv.attend(good, spec, threads=0)
    kv.begin_step(1)  # closes the step the spec was made for
    with pytest.raises(okv.StepError, match="closed"):
        okv.attend(good, spec)
    assert not spec.is_current


def test_attend_releases_the_gil():
    """A pure-Python counter thread keeps running while attend computes: with
    the GIL held it could only run between switch intervals."""
    import time

    heads, dim, ctx = 8, 128, 4096
    cfg = okv.CacheConfig(ctx, 1, okv.LayerConfig(okv.Flat(), heads, dim), max_step=512)
    kv = okv.KvSequenceCache(cfg)
    rows = np.ones((heads, 512, dim), np.float32)
    for _ in range(ctx // 512 - 1):
        kv.begin_step(512)
        kv.update(0, rows, rows)
    kv.begin_step(128)
    spec = kv.update(0, rows[:, :128], rows[:, :128])
    q = np.ones((heads * 4, 128, dim), np.float32)
    ticks = [0]
    done = threading.Event()

    def count():
        while not done.is_set():
            ticks[0] += 1

    counter = threading.Thread(target=count, daemon=True)
    counter.start()
    try:
        time.sleep(0.2)  # the counter runs alone: calibrate its rate
        rate = ticks[0] / 0.2
        before, t0 = ticks[0], time.perf_counter()
        okv.attend(q, spec, threads=1)
        elapsed, during = time.perf_counter() - t0, ticks[0] - before
    finally:
        done.set()
        counter.join()
    # Held GIL: the counter would get ~2 switch intervals (10 ms) of the call.
    held_bound = rate * 2 * sys.getswitchinterval() * 2
    assert elapsed > 8 * sys.getswitchinterval(), "the call is too short to tell"
    assert during > max(held_bound, 0.25 * rate * elapsed)
