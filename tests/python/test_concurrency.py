"""Threads: a cache shared between Python threads, and the registry.

The behaviour under test (documented on SequenceCache and CellCache): every
method runs whole with the GIL held, so calls never interleave inside a
cache. `attend` releases the GIL and keeps a shared borrow of the cache while
it computes: reads proceed, and a mutation from another thread is refused
with `StepError` ("the cache is in use") and changes nothing. Nothing here
asserts on timing: the loops run until the conflict is observed (a deadline
only guards against a hang).
"""

from __future__ import annotations

import threading
import time

import numpy as np
import offgraph_kv as okv
import pytest

DEADLINE = 60.0  # seconds; a hang guard, not a timing assertion
H, D = 4, 64


def big_seq():
    cfg = okv.CacheConfig(4096, 1, okv.LayerConfig(okv.Flat(), H, D), max_step=512)
    c = okv.KvSequenceCache(cfg)
    rng = np.random.default_rng(0)
    for _ in range(6):
        c.begin_step(512)
        c.update(0, *(rng.standard_normal((2, H, 512, D), dtype=np.float32)))
    c.begin_step(1)
    spec = c.update(0, *(rng.standard_normal((2, H, 1, D), dtype=np.float32)))
    q = rng.standard_normal((2 * H, 1, D), dtype=np.float32)
    return c, spec, q


def big_cells():
    cfg = okv.CacheConfig(4096, 1, okv.LayerConfig(okv.Flat(), H, D), max_step=512)
    c = okv.KvCellCache(cfg, 4096)
    s = c.seq_new()
    rng = np.random.default_rng(1)
    for i in range(6):
        c.begin_step([s] * 512, list(range(512 * i, 512 * (i + 1))))
        c.update(0, *(rng.standard_normal((2, H, 512, D), dtype=np.float32)))
    c.begin_step([s], [3072])
    spec = c.update(0, *(rng.standard_normal((2, H, 1, D), dtype=np.float32)))
    q = rng.standard_normal((2 * H, 1, D), dtype=np.float32)
    return c, spec, q


def seq_state(c):
    return (repr(c), c.length, c.high_water, c.step_open, repr(c.plan(0)))


def cell_state(c):
    p = c.planner().plan(0)
    return (repr(c), c.free_cells, p.cells.tolist(), p.read_len)


CASES = {
    # name: (build, a refused-anyway mutation, a read, a state snapshot)
    "seq": (big_seq, lambda c: c.rewind(c.length + 1), lambda c: c.plan(0), seq_state),
    "seq face": (
        big_seq,
        lambda c: c.control().rewind(c.length + 1),
        lambda c: c.planner().plan(0),
        seq_state,
    ),
    # ids are unique in the process: address the one live sequence by its id
    "cells": (
        big_cells,
        lambda c: c.seq_rm(c.live_seqs[0], 5, 1),
        lambda c: c.seq_len(c.live_seqs[0]),
        cell_state,
    ),
    "cells face": (
        big_cells,
        lambda c: c.control().seq_free(7),
        lambda c: c.control().next_pos(c.live_seqs[0]),
        cell_state,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_mutation_during_attend_is_refused_with_step_error(case):
    build, mutate, read, state = CASES[case]
    c, spec, q = build()
    ref = okv.attend(q, spec, threads=1)
    before = state(c)
    stop = threading.Event()
    outs, errors = [], []

    def attender():
        try:
            while not stop.is_set():
                outs.append(okv.attend(q, spec, threads=1))
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    th = threading.Thread(target=attender)
    th.start()
    busy, refused_normally, t0 = 0, 0, time.monotonic()
    try:
        while busy < 3 and time.monotonic() - t0 < DEADLINE:
            read(c)  # reads always proceed, attend running or not
            try:
                mutate(c)
            except okv.StepError as e:
                assert "in use" in str(e), e
                busy += 1
            except okv.CacheError as e:
                # the borrow was free: the call ran and refused on its merits
                assert type(e).__name__ != "PanicException"
                refused_normally += 1
    finally:
        stop.set()
        th.join(DEADLINE)
    assert not th.is_alive(), "attend thread hung"
    assert not errors, errors
    assert busy >= 3, "never observed a mutation while attend ran"
    assert state(c) == before  # nothing was half-done
    assert outs and all(np.array_equal(o, ref) for o in outs)


def test_successful_mutation_after_attend_returns():
    c, spec, q = big_seq()
    okv.attend(q, spec)
    c.rewind(c.length - 1)  # the borrow was released
    assert not spec.is_current


def test_reentrant_callbacks_are_serialized_not_panics():
    """Regression: an iterator that re-entered the cache through a face while
    begin_step held it raised PanicException (RuntimeError through the class).
    Arguments are now converted before the cache is borrowed."""
    cfg = okv.CacheConfig(64, 1, okv.LayerConfig(okv.Flat(), 1, 4), max_step=4)
    c = okv.CellCache(cfg, 16)
    s = c.seq_new()

    def ids():
        c.control().seq_new()  # re-enters the cache
        yield s

    c.control().begin_step(ids(), [0])
    assert len(c.live_seqs) == 2 and s in c.live_seqs and c.seq_len(s) == 1

    class Index:
        def __index__(self):
            return c.control().can_extend(1) and 1

    kv = okv.KvSequenceCache(cfg)
    kv.control().begin_step(Index())
    assert kv.length == 1


def test_two_threads_attending_one_cache_both_succeed():
    c, spec, q = big_seq()
    ref = okv.attend(q, spec)
    outs, errors = [], []

    def run():
        try:
            for _ in range(5):
                outs.append(okv.attend(q, spec, threads=1))
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    ths = [threading.Thread(target=run) for _ in range(2)]
    for th in ths:
        th.start()
    for th in ths:
        th.join(DEADLINE)
    assert not any(th.is_alive() for th in ths)
    assert not errors and len(outs) == 10
    assert all(np.array_equal(o, ref) for o in outs)


def test_registry_hammered_by_eight_threads():
    reg = okv.registry
    n_threads, n_iter = 8, 300
    keys = [[] for _ in range(n_threads)]
    kept = [{} for _ in range(n_threads)]
    errors = []
    barrier = threading.Barrier(n_threads)

    def worker(i):
        try:
            barrier.wait(DEADLINE)
            for j in range(n_iter):
                k = reg.unique_key(f"hammer-{i}-")
                keys[i].append(k)
                obj = object()
                reg.install(k, obj)
                assert reg.get(k) is obj
                assert reg.contains(k)
                with pytest.raises(okv.KeyExistsError):
                    reg.install(k, object())
                if j % 3 == 0:
                    kept[i][k] = obj  # stays installed
                else:
                    reg.erase(k)
                    assert not reg.contains(k)
                    with pytest.raises(okv.NotFoundError):
                        reg.get(k)
                if j % 50 == 0:
                    reg.keys()
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    ths = [threading.Thread(target=worker, args=(i,)) for i in range(n_threads)]
    for th in ths:
        th.start()
    for th in ths:
        th.join(DEADLINE)
    assert not any(th.is_alive() for th in ths), "deadlock"
    assert not errors, errors[:3]
    flat = [k for ks in keys for k in ks]
    assert len(flat) == len(set(flat)) == n_threads * n_iter  # no duplicate key
    installed = set(reg.keys())
    for i in range(n_threads):
        for k, obj in kept[i].items():
            assert k in installed and reg.get(k) is obj  # no key lost
            reg.erase(k)
    for k in flat:
        assert not reg.contains(k)
