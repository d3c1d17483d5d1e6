"""Random API sequences (hypothesis stateful testing) against naive models.

- Sequence caches: length, high water, the ring rewind bound
  (high_water - max_step once high_water exceeds a ring layer's depth), the
  step protocol, and every plan's write/read runs against a slot = position
  mod depth model; the byte layer's rows read over the spec equal the history.
- Cell caches: per sequence the positions it holds, per table the cell each
  (sequence, position) lives in; visible(i) and the mask against the naive
  set in position space (token i sees cell j iff seq(i) owns j,
  pos(j) <= pos(i), and for a ring layer pos(j) > pos(i) - window); the byte
  layer's rows in every visible cell equal the owner's history.

Runs use a fixed seed per machine and the example database committed in
tests/python/hypothesis-db. 4 machines x 500 examples = 2,000 per run.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import offgraph_kv as okv
from hypothesis import HealthCheck, seed, settings
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

DB = DirectoryBasedExampleDatabase(str(Path(__file__).parent / "hypothesis-db"))
EXAMPLES = 500
SETTINGS = settings(
    max_examples=EXAMPLES,
    stateful_step_count=20,
    database=DB,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

H, D = 2, 4
WINDOW, MAX_STEP, CAP = 3, 3, 24


def config():
    ring = okv.LayerConfig(okv.Ring(window=WINDOW), H, D)
    flat = okv.LayerConfig(okv.Flat(), H, D)
    return okv.CacheConfig(CAP, 2, [ring, flat], initial_capacity=2, max_step=MAX_STEP)


RING_DEPTH = WINDOW + MAX_STEP - 1


def runs_to_list(runs):
    return [s + i for s, n in runs for i in range(n)]


def rows(seed, t):
    return np.random.default_rng(seed).standard_normal((2, H, t, D)).astype(np.float32)


# --- sequence caches ----------------------------------------------------------


class SequenceMachine(RuleBasedStateMachine):
    cls = okv.SequenceCache

    @initialize()
    def setup(self):
        self.c = self.cls(config())
        self.length = self.hw = 0
        self.step = None  # (position, n_tokens) of the open step
        self.hist = [dict(), dict()]  # per layer: position -> (k row, v row)
        self.written = set()

    def min_rewind(self):
        lo = self.hw - MAX_STEP if self.hw > RING_DEPTH else 0
        return min(lo, self.length)

    @rule(n=st.integers(0, MAX_STEP + 1), seed=st.integers(0, 2**16))
    def begin_step(self, n, seed):
        ok = 1 <= n <= MAX_STEP and self.length + n <= CAP
        assert self.c.can_extend(max(n, 1)) == (self.length + max(n, 1) <= CAP)
        if not ok:
            try:
                self.c.begin_step(n)
            except okv.InvalidArgumentError:
                pass
            except okv.CapacityError:
                assert self.length + n > CAP
            else:
                raise AssertionError("begin_step accepted a bad n")
            return
        assert self.c.begin_step(n) == self.length
        self.step = (self.length, n)
        self.length += n
        self.hw = max(self.hw, self.length)
        self.written = set()
        if hasattr(self.c, "update"):
            for layer in range(2):
                k, v = rows(seed + layer, n)
                spec = self.c.update(layer, k, v)
                for t in range(n):
                    self.hist[layer][self.step[0] + t] = (k[:, t].copy(), v[:, t].copy())
                self.check_spec(layer, spec)

    @rule(data=st.data())
    def rewind(self, data):
        new_len = data.draw(st.integers(0, CAP + 1))
        ok = self.min_rewind() <= new_len <= self.length
        if not ok:
            try:
                self.c.rewind(new_len)
            except okv.InvalidArgumentError:
                return
            raise AssertionError(f"rewind({new_len}) accepted, bound {self.min_rewind()}")
        self.c.rewind(new_len)
        self.length = new_len
        self.step = None
        for h in self.hist:
            for p in [p for p in h if p >= new_len]:
                del h[p]

    @rule()
    def clear(self):
        self.c.clear()
        self.length = self.hw = 0
        self.step = None
        self.hist = [dict(), dict()]

    @invariant()
    def observables(self):
        c = self.c
        assert (c.length, c.high_water, c.step_open) == (
            self.length,
            self.hw,
            self.step is not None,
        )
        assert c.min_rewind == self.min_rewind()

    @invariant()
    def plans(self):
        for layer in range(2):
            if self.step is None:
                try:
                    self.c.plan(layer)
                except okv.StepError:
                    continue
                raise AssertionError("plan served with no open step")
            pos, n = self.step
            p = self.c.plan(layer)
            assert p == self.c.planner().plan(layer)  # pure
            assert (p.position, p.n_tokens) == (pos, n)
            depth = RING_DEPTH if layer == 0 else CAP
            assert p.depth == depth
            assert runs_to_list(p.write) == [q % depth for q in range(pos, pos + n)]
            assert len(p.write) <= 2 and len(p.read) <= 2
            base = p.read_base_pos
            assert runs_to_list(p.read) == [q % depth for q in range(base, self.length)]
            if layer == 0:
                assert p.window == WINDOW and p.mask_kind in ("none", "causal", "window")
                assert base <= max(0, pos - WINDOW + 1)  # every key the step needs
                assert base >= self.length - depth  # never more than the pool holds
            else:
                assert p.window is None and base == 0

    def check_spec(self, layer, spec):
        base = spec.read_base_pos
        slots = runs_to_list(spec.read)
        k, v = spec.k, spec.v
        for q, slot in zip(range(base, self.length), slots):
            hk, hv = self.hist[layer][q]
            assert np.array_equal(k[:, slot], hk) and np.array_equal(v[:, slot], hv)
        assert len(slots) == self.length - base


class KvSequenceMachine(SequenceMachine):
    cls = okv.KvSequenceCache


# --- cell caches ----------------------------------------------------------------

N_CELLS, N_SEQ = 40, 4


class CellMachine(RuleBasedStateMachine):
    cls = okv.CellCache

    @initialize()
    def setup(self):
        self.c = self.cls(config(), N_CELLS, n_seq_max=N_SEQ)
        self.reset()

    def reset(self):
        self.held = {}  # seq -> {position: {table: cell}}
        self.hist = {}  # seq -> {position: rows per layer}
        self.step = None  # (seq_ids, positions)

    def live(self):
        return sorted(self.held)

    def ids(self):
        return self.live() + [N_SEQ + 10**6]  # live ids and one never handed out

    @rule()
    def seq_new(self):
        if len(self.held) >= N_SEQ:
            try:
                self.c.seq_new()
            except okv.CapacityError:
                return
            raise AssertionError("seq_new past n_seq_max")
        s = self.c.seq_new()
        assert s not in self.held
        self.held[s] = {}
        self.hist[s] = {}

    @rule(data=st.data())
    def seq_clone(self, data):
        src = data.draw(st.sampled_from(self.ids()))
        upto = data.draw(st.none() | st.integers(0, 12))
        before = self.snapshot()
        try:
            t = self.c.seq_clone(src, upto)
        except okv.CacheError as e:
            assert (
                src not in self.held
                or len(self.held) >= N_SEQ
                or isinstance(e, (okv.InvalidArgumentError, okv.StepError))
            ), e
            assert self.snapshot() == before
            return
        assert src in self.held and t not in self.held
        keep = {p: c for p, c in self.held[src].items() if upto is None or p < upto}
        self.held[t] = dict(keep)
        self.hist[t] = {p: self.hist[src][p] for p in keep if p in self.hist[src]}
        self.step = None

    @rule(data=st.data())
    def seq_rm(self, data):
        s = data.draw(st.sampled_from(self.ids()))
        p0 = data.draw(st.integers(0, 12))
        p1 = data.draw(st.none() | st.integers(0, 14))
        before = self.snapshot()
        try:
            self.c.seq_rm(s, p0, p1)
        except okv.CacheError:
            # unknown id, p1 < p0, or a removal the ring layers cannot serve
            assert self.snapshot() == before
            return
        assert s in self.held and (p1 is None or p1 >= p0)
        for p in [p for p in self.held[s] if p >= p0 and (p1 is None or p < p1)]:
            del self.held[s][p]
            self.hist[s].pop(p, None)
        self.step = None

    @rule(data=st.data())
    def seq_free(self, data):
        s = data.draw(st.sampled_from(self.ids()))
        if s not in self.held:
            try:
                self.c.seq_free(s)
            except okv.UnknownSequenceError:
                return
            raise AssertionError("freed an unknown id")
        self.c.seq_free(s)
        del self.held[s]
        del self.hist[s]
        self.step = None

    @rule()
    def clear(self):
        self.c.clear()
        self.reset()

    @precondition(lambda self: self.held)
    @rule(data=st.data(), seed=st.integers(0, 2**16))
    def begin_step(self, data, seed):
        seqs = self.live()
        n = data.draw(st.integers(1, MAX_STEP))
        ids = data.draw(st.lists(st.sampled_from(seqs), min_size=n, max_size=n))
        bad = data.draw(st.booleans()) and data.draw(st.integers(0, 3))
        nxt = {s: max(self.held[s], default=-1) + 1 for s in seqs}
        pos = []
        for s in ids:
            pos.append(nxt[s] + data.draw(st.integers(0, 1)))  # may leave a gap
            nxt[s] = pos[-1] + 1
        if bad == 1:
            pos[0] = max(0, pos[0] - 2)  # rewrites or reorders
        before = self.snapshot()
        try:
            self.c.begin_step(ids, pos)
        except okv.CacheError as e:
            assert self.snapshot() == before
            valid = bad != 1 or self.valid(ids, pos)
            assert not valid or isinstance(e, okv.CapacityError), e
            return
        assert self.valid(ids, pos), (ids, pos)
        pl = self.c.planner()
        for layer in range(2):
            p = pl.plan(layer)
            assert p.seq_ids == ids and p.positions == pos
            for i, (s, q) in enumerate(zip(ids, pos)):
                self.held[s].setdefault(q, {})[layer] = int(p.cells[i])
        self.step = (ids, pos)
        if hasattr(self.c, "update"):
            for layer in range(2):
                k, v = rows(seed + layer, n)
                for i, (s, q) in enumerate(zip(ids, pos)):
                    r = self.hist[s].setdefault(q, {})
                    r[layer] = (k[:, i].copy(), v[:, i].copy())
                self.c.update(layer, k, v)
            for layer in range(2):
                self.check_bytes(layer)

    def valid(self, ids, pos):
        last = {s: max(self.held[s], default=-1) for s in self.held}
        for s, q in zip(ids, pos):
            if s not in last or q <= last[s]:
                return False
            last[s] = q
        return True

    def snapshot(self):
        c = self.c
        return (
            sorted(c.live_seqs),
            c.free_cells,
            [(c.next_pos(s), c.seq_len(s)) for s in c.live_seqs],
        )

    @invariant()
    def sequences(self):
        c = self.c
        assert sorted(c.live_seqs) == self.live()
        for s, ps in self.held.items():
            assert c.seq_len(s) == len(ps)
            assert c.next_pos(s) == max(ps, default=-1) + 1

    def expected_visible(self, layer, i):
        ids, pos = self.step
        s, p = ids[i], pos[i]
        out = set()
        for q, cells in self.held[s].items():
            if q <= p and (layer == 1 or q > p - WINDOW):
                out.add(cells[layer])
        return out

    @invariant()
    def masks(self):
        pl = self.c.planner()
        if self.step is None:
            for layer in range(2):
                try:
                    pl.plan(layer)
                except okv.StepError:
                    continue
                raise AssertionError("plan served after the step closed")
            return
        ids, _ = self.step
        for layer in range(2):
            p = pl.plan(layer)
            m = p.mask
            assert m.shape == (len(ids), p.read_len)
            for i in range(len(ids)):
                want = self.expected_visible(layer, i)
                got = runs_to_list(p.visible(i))
                assert got == sorted(got) and set(got) == want, (layer, i, got, want)
                assert set(np.flatnonzero(m[i]).tolist()) == want

    def check_bytes(self, layer):
        spec = self.c.spec(layer)
        k, v = spec.k, spec.v
        ids, pos = self.step
        for i in range(len(ids)):
            s, p = ids[i], pos[i]
            for q, cells in self.held[s].items():
                if q <= p and (layer == 1 or q > p - WINDOW):
                    hk, hv = self.hist[s][q][layer]
                    cell = cells[layer]
                    assert np.array_equal(k[:, cell], hk) and np.array_equal(v[:, cell], hv)


class KvCellMachine(CellMachine):
    cls = okv.KvCellCache


# A fixed seed per machine (plus the committed database) makes every run the same.
for _i, _m in enumerate((SequenceMachine, KvSequenceMachine, CellMachine, KvCellMachine)):
    seed(20240 + _i)(_m)
    _m.TestCase.settings = SETTINGS

TestSequence = SequenceMachine.TestCase
TestKvSequence = KvSequenceMachine.TestCase
TestCell = CellMachine.TestCase
TestKvCell = KvCellMachine.TestCase
