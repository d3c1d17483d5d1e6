"""Which tokens a step carries, and which sequences hold them: :class:`Scheduler`.

A scheduling change lives here; the model's forward (:mod:`.model_step`) and sampling
(:mod:`.sampling`) do not see it.

* **The step.** At most ``max_batch_tokens`` tokens: first one token for every decoding
  request, then prompt chunks of requests already prefilling (oldest first; at most half a step
  each while a request that could start is waiting), then new requests (first come, first
  served). While any request decodes, the prompt tokens of a step are at most
  ``max_prefill_tokens`` (chunked prefill), and so are new requests' while any runs (on an idle
  cache the first takes the whole step): a long prompt then delays the running streams by a
  bounded amount per step, and requests arriving together start steps apart instead of all
  after one long step, which keeps their later arrivals apart too. With that bound below
  ``max_batch_tokens``, a step starts a second new request only when its prompt rest (beyond
  the longest held prefix) is at most the step's decode tokens: every request in a step waits
  for the whole step, so starting a prompt a step later costs it about one step's decode work
  while starting it now costs each request already in the step its whole prefill; one prompt a
  step gives the lower mean time to first token unless the prompt is that short.
* **Admission.** A request is admitted only when the free cells, minus what admitted requests
  may still write (prompt rest plus ``max_new_tokens - 1`` each), cover everything it may
  write: an admitted request always finishes. With nothing running, the first waiting request
  always starts. A fork that does not fit once the cached sequences are evicted (its source
  among them: it then owns the cells it shared, up to a ring's depth on an all-sliding model)
  gives way to a fresh prefill; with every sequence id taken (``n_seq_max``) and the only
  cached sequence being the request's own fork source, the request takes that sequence over,
  cut back to the shared prefix.
* **Prefix sharing.** A new request forks (``seq_clone(src, upto=L)``) the held sequence with
  the longest prefix of its prompt (at most ``len(prompt) - 1`` tokens: the last prompt token
  is always fed, it produces the first logits), found through a radix tree over the held
  sequences' tokens (:class:`~offgraph_kv.prefix_index.PrefixIndex`). A request whose prompt
  shares a longer prefix with a prompt still being prefilled waits for that prefill rather than
  computing the same prefix again. The ring table may refuse a fork whose next step needs keys
  its source dropped: the next source is tried, else a fresh prefill. A host tier
  (:class:`~offgraph_kv.store.HostTier`) and then a prefix store, when given, serve a longer
  prefix than any held sequence.
* **Eviction.** Finished sequences stay cached (``prefix_cache=True``) and are freed least
  recently used first when cells or sequence ids are needed; a fork source counts as used. An
  evicted sequence's chunks go to the host tier, when given, before its cells are freed.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any

from .. import _native as _okv
from .._errors import CacheError
from ..prefix_index import PrefixIndex
from .requests import Request

__all__ = ["Plan", "Scheduler"]

Plan = list[tuple[Request, int]]
"""A step's ``(request, tokens it feeds)``, in the order their tokens are laid out."""

_WAIT_GAIN = 16  # prefix tokens a prefill in flight must add for a request to wait for it
_FORK_TRIES = 8  # sources tried (longest prefix first) before a request prefills afresh


class Scheduler:
    """The waiting queue, the running requests and the cached finished sequences of one
    :class:`~offgraph_kv.KvCellCache`; plans each step and gives requests their sequences.

    Args:
        kc: the cache (its sequences are this scheduler's to create, fork and free).
        layers: the cache's layer configs (what one sequence may hold in cells).
        max_batch_tokens: most tokens one step carries.
        prefix_cache: keep finished sequences as prefix cache until cells or ids are needed.
        store: a prefix store as the generator uses it (``admit(prompt, live) -> (seq, n)``,
            ``prefilled([(seq, prompt, before, after), ...])``), or ``None``.
        host: a host tier (``evicted(kc, seq, tokens)``, ``admit(kc, prompt, live)``), or
            ``None``.
        max_prefill_tokens: most prompt tokens one step carries while a request decodes
            (``None``: ``max_batch_tokens``).
    """

    def __init__(
        self,
        kc: _okv.KvCellCache,
        layers: Sequence[_okv.LayerConfig],
        max_batch_tokens: int,
        prefix_cache: bool = True,
        store: Any = None,
        host: Any = None,
        max_prefill_tokens: int | None = None,
    ):
        self.kc = kc
        self.max_prefill_tokens = max_prefill_tokens or max_batch_tokens
        self.host = host
        self.max_batch_tokens = max_batch_tokens
        self.prefix_cache = prefix_cache
        self.store = store
        self.has_flat = any(isinstance(lc.policy, _okv.Flat) for lc in layers)
        windows = [lc.policy.window for lc in layers if isinstance(lc.policy, _okv.Ring)]
        # What one sequence holds in the ring table at most (the cache's bound).
        self.ring_depth = (max(windows) + max_batch_tokens - 1) if windows else None
        self.waiting: list[Request] = []
        self.running: list[Request] = []  # admitted, in admission order
        self.cached: OrderedDict[int, int] = OrderedDict()  # seq -> tokens held, LRU first
        self._held = PrefixIndex()  # seq -> tokens it holds, for every running and cached seq
        self._prefilling = PrefixIndex()  # request -> prompt, for requests still prefilling
        self.counters = {"prefix_tokens_reused": 0, "forks": 0, "evictions": 0}

    def cells_needed(self, n: int) -> int:
        """Free cells ``n`` more written tokens of one sequence may take."""
        if not self.has_flat and self.ring_depth is not None:
            return min(n, self.ring_depth)
        return n

    def occupancy(self) -> dict[str, int]:
        """Cells held without sharing, and the request and sequence counts."""
        held = sum(r.fed for r in self.running) + sum(self.cached.values())
        return {
            "cells_unshared": held,
            "running": len(self.running),
            "waiting": len(self.waiting),
            "cached_sequences": len(self.cached),
        }

    # -- the step ---------------------------------------------------------------------------------

    def plan(self) -> Plan:
        """This step's ``(request, tokens)``: decoders, prefill chunks, then admissions."""
        budget = self.max_batch_tokens
        plan: Plan = []
        decoders = [r for r in self.running if len(r.tokens) - r.fed == 1]
        prefill = [r for r in self.running if len(r.tokens) - r.fed > 1]
        for req in decoders[:budget]:
            plan.append((req, 1))
        n_decode = len(plan)
        budget -= n_decode
        # While requests decode, the prompt tokens of the step are bounded (chunked prefill).
        limit = self.max_prefill_tokens if plan else self.max_batch_tokens
        budget = min(budget, limit)
        # While a request that could start now waits, a prefill takes at most half a step, so the
        # request starts within a step or two instead of after the whole prefill.
        starters = bool(prefill) and any(
            not self._worth_waiting(r, self._best_upto(r)) for r in self.waiting
        )
        cap = max(1, limit // 2) if starters else budget
        for req in prefill:
            if budget == 0:
                break
            n = min(len(req.tokens) - req.fed, budget, cap)
            plan.append((req, n))
            budget -= n
        # New requests: with others running, at most max_prefill_tokens of prompt this step, so
        # requests arriving together start a step apart; on an idle cache the first takes it all.
        admit = budget if not self.running else min(budget, self.max_prefill_tokens)
        most = None  # the longest prompt rest a further new request may have this step
        while admit > 0 and self.waiting:
            req = self._admit_next(most)
            if req is None:
                break
            if self.max_prefill_tokens < self.max_batch_tokens:
                most = n_decode  # a second prompt waits unless shorter than the decode work
            n = min(len(req.tokens) - req.fed, admit)
            plan.append((req, n))
            budget -= n
            admit = min(admit - n, self.max_prefill_tokens)
        return plan

    def fed(self, plan: Plan) -> tuple[int, int]:
        """The step's forward ran: its tokens are held. Returns ``(prefill, decode)`` tokens."""
        prefill = decode = 0
        for req, n in plan:
            if req.fed < len(req.prompt):
                prefill += n
                if req.fed + n >= len(req.prompt):
                    self._prefilling.remove(req)
            else:
                decode += n
            self._held.extend(req.seq, req.tokens[req.fed : req.fed + n])
            req.fed += n
        if self.store is not None:
            self.store.prefilled([(r.seq, r.prompt, r.fed - n, r.fed) for r, n in plan])
        return prefill, decode

    def held(self, req: Request, tokens: list[int]) -> None:
        """``req``'s sequence also holds ``tokens`` after what it was fed (speculative drafts
        its step accepted; they are the next of ``req.tokens``)."""
        if tokens:
            self._held.extend(req.seq, tokens)
            req.fed += len(tokens)

    def unfed(self, plan: Plan) -> None:
        """The step's forward failed: its tokens are not held, each sequence is cut back."""
        for req, _ in plan:
            try:
                self.kc.seq_rm(req.seq, req.fed)
            except CacheError:
                pass

    # -- requests leaving -------------------------------------------------------------------------

    def finish(self, req: Request) -> None:
        """``req`` is done: its sequence stays as prefix cache (or is freed)."""
        self.running.remove(req)
        assert req.seq is not None
        if self.prefix_cache:
            self.cached[req.seq] = req.fed
        else:
            self._held.remove(req.seq)
            self.kc.seq_free(req.seq)
        req.seq = None

    def drop(self, req: Request) -> None:
        """``req`` is cancelled: a waiting one leaves the queue, a running one's sequence is
        freed (cells shared with other sequences stay with them)."""
        if req.seq is None:
            self.waiting.remove(req)
            return
        self.running.remove(req)
        self.kc.seq_free(req.seq)
        self._held.remove(req.seq)
        self._prefilling.remove(req)
        req.seq = None

    def clear_cache(self) -> None:
        """Free every cached finished sequence."""
        while self._evict_one():
            pass

    # -- admission --------------------------------------------------------------------------------

    def _free_for_admission(self) -> int:
        return self.kc.free_cells - sum(self.cells_needed(r.outstanding) for r in self.running)

    def _admit_next(self, most: int | None = None) -> Request | None:
        """Admit the first waiting request that should start now, or ``None`` (also when its
        prompt rest beyond the longest held prefix exceeds ``most``)."""
        for i, req in enumerate(self.waiting):
            upto = self._best_upto(req)
            if self._worth_waiting(req, upto):
                continue
            if most is not None and len(req.prompt) - upto > most:
                return None  # first come, first served: it starts next step
            if not self._admit(req):
                return None  # first come, first served: nothing behind it jumps the queue
            del self.waiting[i]
            self.running.append(req)
            return req
        return None

    def _sources(self, req: Request) -> Iterator[tuple[int, int]]:
        """``(seq, upto)`` of the held sequences sharing a prefix of ``req``'s prompt (at most
        all but its last token), longest first: one walk of the prompt through the index."""
        return self._held.longest(req.prompt, len(req.prompt) - 1)

    def _best_upto(self, req: Request) -> int:
        return next(self._sources(req), (None, 0))[1]

    def _worth_waiting(self, req: Request, held: int) -> bool:
        """Whether a prompt still being prefilled will soon hold a longer prefix of ``req``."""
        for other, n in self._prefilling.longest(req.prompt, len(req.prompt) - 1):
            if n - held < _WAIT_GAIN:
                return False  # longest first: no later prompt gains enough either
            if n - max(held, other.fed) >= _WAIT_GAIN:
                return True
        return False

    def _evict_one(self, keep: int | None = None) -> bool:
        for seq in self.cached:
            if seq != keep:
                self._evict(seq)
                return True
        return False

    def _evict(self, seq: int) -> None:
        del self.cached[seq]
        if self.host is not None:
            self.host.evicted(self.kc, seq, self._held.tokens(seq))
        self._held.remove(seq)
        self.kc.seq_free(seq)
        self.counters["evictions"] += 1

    def _admit(self, req: Request) -> bool:
        """Give ``req`` a sequence (a fork when a source holds its prefix) if it fits."""
        if len(self._held) >= self.kc.n_seq_max:
            best, upto = next(self._sources(req), (None, 0))
            if not self._evict_one(keep=best):
                if best not in self.cached:
                    return False  # every id is running: wait for one to finish
                seq, upto = self._take_over(best, upto)  # the only way forward
                return self._place(req, seq, upto, None)
        return self._place(req, *self._fork(req))

    def _fork(self, req: Request) -> tuple[int, int, int | None]:
        """``(seq, upto, source)``: a fork of the longest held prefix the cache allows, else a
        fresh sequence."""
        # What the held sequences already give: the tier and the store must beat it (the walk
        # runs only for them; the forks below walk the index themselves).
        best = self._best_upto(req) if self.host is not None or self.store is not None else 0
        if self.host is not None and self.host.peek(self.kc, req.prompt, best):
            # In process, asked before the store. The restore takes cells: make the room the
            # whole request needs first (evictions go to the tier, so ask it again after).
            need = self.cells_needed(req.total)
            while self._free_for_admission() < need and self._evict_one():
                pass
            best = self._best_upto(req)
            seq, upto = self.host.admit(self.kc, req.prompt, best)
            if seq is not None:
                return seq, upto, None  # the tier holds more of the prompt than any sequence
        if self.store is not None:
            seq, upto = self.store.admit(req.prompt, best)
            if seq is not None:
                return seq, upto, None  # the store holds more of the prompt than any sequence
        for src, n in itertools.islice(self._sources(req), _FORK_TRIES):
            try:
                return self.kc.seq_clone(src, upto=n), n, src
            except CacheError:
                continue  # a ring layer no longer holds what the fork's next step needs
        return self.kc.seq_new(), 0, None

    def _take_over(self, seq: int, upto: int) -> tuple[int, int]:
        """The cached ``seq`` cut back to its first ``upto`` tokens for a new request; freed for
        a fresh sequence when the ring refuses the cut."""
        del self.cached[seq]
        if self.host is not None:  # what lies beyond the cut leaves the pool
            self.host.evicted(self.kc, seq, self._held.tokens(seq))
        self._held.remove(seq)
        try:
            self.kc.seq_rm(seq, upto)
        except CacheError:
            self.kc.seq_free(seq)
            self.counters["evictions"] += 1
            return self.kc.seq_new(), 0
        return seq, upto

    def _place(self, req: Request, seq: int, upto: int, src: int | None) -> bool:
        """Start ``req`` on ``seq`` (holding its first ``upto`` prompt tokens) if it fits,
        evicting cached sequences as needed. Once its sources are evicted, a fork owns the cells
        it shared: on an all-sliding model it then holds up to a ring's depth of cells that a
        fresh prefill would not, so a fork that does not fit gives way to a fresh sequence."""
        if not self._room_for(req, upto):
            self.kc.seq_free(seq)
            if not upto:
                return False
            seq, upto, src = self.kc.seq_new(), 0, None
            if not self._room_for(req, 0):
                self.kc.seq_free(seq)
                return False
        if src is not None:
            self.counters["forks"] += 1
            if src in self.cached:
                self.cached.move_to_end(src)  # a fork source counts as used
        self._start(req, seq, upto)
        return True

    def _room_for(self, req: Request, upto: int) -> bool:
        """Whether ``req`` forked at ``upto`` fits, evicting cached sequences as needed."""
        need = self.cells_needed(req.total - upto)
        while self._free_for_admission() < need and self._evict_one():
            pass
        return self._free_for_admission() >= need

    def _start(self, req: Request, seq: int, upto: int) -> None:
        if upto:
            self.counters["prefix_tokens_reused"] += upto
        req.seq, req.fed, req.reused = seq, upto, upto
        self._held.insert(seq, req.prompt[:upto])
        if upto < len(req.prompt):
            self._prefilling.insert(req, req.prompt)
