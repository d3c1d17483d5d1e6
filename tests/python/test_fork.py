"""attend after fork: once a threaded attend started the worker pool, a child forked by
multiprocessing (the "fork" start method, as pre-forking servers do) attends with threads=2 on
workers of its own, returning what the parent computes, instead of waiting forever on the
parent's workers (which do not exist in the child). Every wait is bounded."""

import multiprocessing as mp
import queue
import sys

import numpy as np
import offgraph_kv as okv
import pytest

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="no fork on Windows")

LIMIT = 60.0  # seconds a child may take; a hang fails the test instead of the run


def _child(spec, q, out):
    try:
        out.put(("ok", okv.attend(q, spec, threads=2)))
    except BaseException as e:  # reported to the parent, which fails the test
        out.put(("error", repr(e)))


def _run_forked(spec, q):
    """The child's 2-thread attend of ``q`` over ``spec``, or a failure naming why."""
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    p = ctx.Process(target=_child, args=(spec, q, out), daemon=True)
    p.start()
    try:
        kind, res = out.get(timeout=LIMIT)
    except queue.Empty:
        p.kill()
        p.join(10)
        pytest.fail(f"the forked child's threads=2 attend did not answer within {LIMIT} s")
    p.join(LIMIT)
    assert p.exitcode == 0, f"child exit code {p.exitcode}"
    assert kind == "ok", res
    return res


def test_a_forked_child_attends_with_threads_after_the_parent_did():
    rng = np.random.default_rng(3)
    heads, dim, t = 2, 64, 64
    cfg = okv.CacheConfig(256, 1, okv.LayerConfig(okv.Flat(), heads, dim), max_step=t)
    kv = okv.KvSequenceCache(cfg)
    kv.begin_step(t)
    k, v = rng.standard_normal((2, heads, t, dim)).astype(np.float32)
    spec = kv.update(0, k, v)
    q = rng.standard_normal((heads * 2, t, dim)).astype(np.float32)
    one = okv.attend(q, spec, threads=1)
    two = okv.attend(q, spec, threads=2)  # starts the worker pool in this process
    np.testing.assert_array_equal(two, one)
    for _ in range(2):  # a second child forks from a parent that already forked once
        np.testing.assert_array_equal(_run_forked(spec, q), one)
    np.testing.assert_array_equal(okv.attend(q, spec, threads=2), one)
