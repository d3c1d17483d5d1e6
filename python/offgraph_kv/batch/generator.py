"""Continuous batching over one :class:`~offgraph_kv.KvCellCache`: :class:`BatchGenerator`.

The generator ties the parts together and owns the threading: the scheduler
(:mod:`.scheduler`) plans each step, the model step (:mod:`.model_step`) runs its forward, the
sampler (:mod:`.sampling`) picks the tokens, the request table (:mod:`.requests`) keeps every
request by id.

* **Cancelling and threads.** ``cancel(rid)`` drops a waiting request at once and frees a
  running one's sequence at once, or right after the forward in flight when another thread is
  stepping: ``step`` holds the generator's lock while it schedules and while it takes the
  forward's results, never during the forward, so a server's event loop can ``add``,
  ``cancel`` and read ``stats``/``request_info`` while its engine thread steps. One thread steps.
* **Stopping.** A request stops at ``max_new_tokens`` or at one of its ``eos_token_id`` tokens,
  which ends its output (as ``generate``'s outputs do).
* **Logprobs.** A request added with ``logprobs=k`` (0 to 20) records, for each token it
  generates, the token's logprob and the ``k`` most likely tokens under ``log_softmax`` of the
  raw logits row it was sampled from (the model's distribution, before temperature and top-p:
  what OpenAI's API and vLLM report); :meth:`BatchGenerator.take_logprobs` hands over the
  entries since the last call, so a server thread collects them per token and nothing grows.
  Requests without logprobs cost nothing.
* **Bias and penalties.** A request added with ``logit_bias`` (token id -> bias in
  [-100, 100]) or ``frequency_penalty`` / ``presence_penalty`` (in [-2, 2]) has a copy of its
  logits row adjusted by OpenAI's formula before it is sampled (greedy too; see
  :func:`~offgraph_kv.batch.sampling.adjusted`); its logprobs stay the model's. Requests
  without them cost nothing.
* **Constraints.** A request added with ``constraint`` (a
  :class:`~offgraph_kv.batch.Constraint`: a JSON schema, any JSON object, a regex or a Lark
  grammar) generates only what the grammar allows: its row (a copy) is masked before it is
  sampled, the mask computed on a thread while the forward runs, and it stops
  (``"stop"``) once the grammar is complete. Grammars compile against the generator's
  ``tokenizer`` (the native engine's own by default), built on the first constrained request.
  Free requests in the same batch are untouched (see :mod:`.guide`).
* **Speculation.** With ``speculative`` (``"ngram"``: prompt lookup; a draft model or a
  ``.gguf`` path; a :class:`~offgraph_kv.batch.speculative.Speculation`), a decoding request
  feeds drafted tokens after its last one and keeps, in the same step, the longest prefix its
  own sampling produces plus one token (see :mod:`.speculative`): greedy output is unchanged.
  Constrained requests and requests added with ``speculative=False`` do not speculate; a full
  batch does not either (``Speculation.step_tokens``).
"""

from __future__ import annotations

import itertools
import operator
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .. import _native as _okv
from .._errors import CapacityError, InvalidArgumentError
from .constraint import Constraint
from .draft_length import PROBE_EVERY, Acceptance, StepCost, best_positive, choose
from .guide import Guide, StepMasks, grammar_tokenizer, masked
from .model_step import CellsModel, ModelStep, model_step
from .requests import Request, RequestLimits, RequestTable, new_request
from .sampling import LogprobEntry, adjusted, logprob_entry, sample
from .scheduler import Plan, Scheduler
from .speculative import PromptLookup, Speculation, accept, speculation

if TYPE_CHECKING:  # annotations only: the native engine's path never imports torch
    import torch

__all__ = ["BatchGenerator"]


def _host_tier(spec: Any, model: Any) -> Any:
    """The host tier ``host_cache_bytes`` asks for (``None`` when off), bound to ``model``."""
    if spec is None:
        return None
    from ..store.host import HostTier

    if not isinstance(spec, HostTier):
        if isinstance(spec, bool) or not isinstance(spec, int):
            raise InvalidArgumentError(
                f"host_cache_bytes: expected an int or a HostTier, got {type(spec).__name__}"
            )
        if spec == 0:
            return None
        spec = HostTier(spec)
    spec.bind(model)
    return spec


class BatchGenerator:
    """Continuous batching of many requests over one KvCellCache (see :mod:`offgraph_kv.batch`).

    Args:
        model: a transformers causal LM on the CPU (Llama family, Gemma 3, ...), or any model
            object with ``forward_cells`` (the native engine's model; see
            :class:`~offgraph_kv.batch.ModelStep`).
        n_cells: cells of the cache (each holds one position's K/V for every layer).
        n_seq_max: most sequences held at once (running plus cached finished ones).
        max_batch_tokens: most tokens one step carries (also the cache's ``max_step``).
        kv_dtype: storage dtype of the pools (``None``: float32).
        prefix_cache: keep finished sequences' cells as prefix cache until cells are needed.
        store: a :class:`~offgraph_kv.store.PrefixStore` (bound to ``model`` here if it is not
            bound yet): admission loads the longest stored prefix no live sequence beats, and
            prefill saves each chunk as it passes the chunk's end.
        max_prefill_tokens: most prompt tokens one step carries while requests decode (chunked
            prefill: bounds what a long prompt adds to the running streams' step, and staggers
            requests that arrive together: below ``max_batch_tokens``, a step starts a second
            new prompt only when it is no longer than the step's decode tokens);
            ``None``: ``max_batch_tokens``.
        host_cache_bytes: bytes of the host tier (:class:`~offgraph_kv.store.HostTier`) that
            keeps evicted cached sequences' chunks in process memory, deduplicated, for later
            prompts sharing their prefix (asked before ``store``); ``None`` or 0: off. A
            ``HostTier`` is used as given.
        tokenizer: what constrained requests' grammars compile against (a GGUF tokenizer or a
            fast Hugging Face one); ``None``: the model's ``tokenizer`` attribute, if it has
            one (a :class:`~offgraph_kv.GgufModel` has).
        speculative: speculative decoding (see :mod:`.speculative`): ``None`` (off),
            ``"ngram"`` (prompt lookup over each request's own tokens), a draft model of the
            same vocabulary (an object with ``forward_cells``, or a ``.gguf`` path opened on the
            native engine; it runs on its own cache), or a
            :class:`~offgraph_kv.batch.speculative.Speculation` (source, ``max_draft``,
            ``step_tokens``). A draft model of another vocabulary is refused
            (``InvalidArgumentError``).

    With a transformers model, ``step`` switches ``model.config._attn_implementation`` to
    ``CELL_ATTN_NAME`` for the duration of its forward and restores it after: do not run the
    same model from another thread while a step runs.
    """

    def __init__(
        self,
        model: Any,
        n_cells: int,
        n_seq_max: int = 256,
        max_batch_tokens: int = 512,
        kv_dtype: str | None = None,
        prefix_cache: bool = True,
        store: Any = None,
        host_cache_bytes: Any = None,
        max_prefill_tokens: int | None = None,
        tokenizer: Any = None,
        speculative: Any = None,
    ):
        spec = speculation(speculative)  # checked before anything is built
        if isinstance(max_batch_tokens, bool) or int(max_batch_tokens) < 1:
            raise InvalidArgumentError(f"max_batch_tokens: expected >= 1, got {max_batch_tokens}")
        if max_prefill_tokens is not None and (
            isinstance(max_prefill_tokens, bool)
            or not isinstance(max_prefill_tokens, int)
            or max_prefill_tokens < 1
        ):
            raise InvalidArgumentError(
                f"max_prefill_tokens: expected an int >= 1 or None, got {max_prefill_tokens!r}"
            )
        self.model = model
        self.model_step: ModelStep = model_step(model)
        layers = self.model_step.layer_configs()
        self.n_layers = len(layers)
        self.max_batch_tokens = int(max_batch_tokens)
        self.max_positions = int(self.model_step.max_positions)
        self.vocab_size = int(self.model_step.vocab_size)
        self.eos_token_ids = list(self.model_step.eos_token_ids)
        kw: dict[str, Any] = {}
        if kv_dtype not in (None, "float32"):
            kw["dtype"] = kv_dtype
        try:
            cfg = _okv.CacheConfig(
                self.max_positions,
                self.n_layers,
                layers,
                initial_capacity=min(int(n_cells), 256) if int(n_cells) > 0 else 1,
                max_step=self.max_batch_tokens,
                **kw,
            )
        except TypeError as e:
            raise InvalidArgumentError(f"kv_dtype {kv_dtype!r} is not supported here: {e}") from e
        self.kc = _okv.KvCellCache(cfg, n_cells, n_seq_max=n_seq_max)
        self.n_cells = self.kc.capacity
        self.n_seq_max = self.kc.n_seq_max
        self.prefix_cache = bool(prefix_cache)
        self._store: Any = None
        if store is not None:  # the store's cell side, imported only when a store is given
            from ..store.cells import GeneratorStore

            self._store = GeneratorStore(store, model, self.kc)
        self.host_cache = _host_tier(host_cache_bytes, model)
        self.max_prefill_tokens = min(
            max_prefill_tokens or self.max_batch_tokens, self.max_batch_tokens
        )
        self._sched = Scheduler(
            self.kc,
            layers,
            self.max_batch_tokens,
            self.prefix_cache,
            self._store,
            self.host_cache,
            max_prefill_tokens=self.max_prefill_tokens,
        )
        self.has_flat = self._sched.has_flat
        self.ring_depth = self._sched.ring_depth
        self._limits = RequestLimits(
            self.vocab_size,
            self.max_positions,
            self.n_cells,
            self._sched.cells_needed,
            numpy_sampler=isinstance(self.model_step, CellsModel),
        )
        self._ids = itertools.count()
        self._table = RequestTable()
        # `step` holds the lock while it schedules and while it takes the forward's results, not
        # during the forward: `add`/`cancel`/`stats` from another thread never wait on a forward.
        self._lock = threading.RLock()
        self._stepping = False  # a forward is in flight: cancelling a running request waits
        self._cancels: list[Request] = []  # running requests cancelled during the forward
        self._tokenizer = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
        self._ll_tokenizer: Any = None  # llguidance's, built on the first constraint
        self._ll_lock = threading.Lock()
        self.masks = StepMasks(self.vocab_size)
        """The constrained requests' masks; ``masks.overlap = False`` computes them after the
        forward instead of during it (a benchmark's comparison)."""
        self._counts = {
            "steps": 0,
            "forward_tokens": 0,
            "prefill_tokens": 0,
            "decode_tokens": 0,
            "generated_tokens": 0,
            "spec_steps": 0,
            "spec_drafted_tokens": 0,
            "spec_accepted_tokens": 0,
        }
        self.speculation: Speculation | None = spec
        self._drafter: Any = None if spec is None else self._make_drafter(spec, kv_dtype)
        # What a forward costs by its token count, for the draft lengths (measured unless
        # fixed); None when the generator does not speculate (nothing to time).
        self.step_cost = None if spec is None else StepCost(spec.step_cost)

    def _make_drafter(self, spec: Speculation, kv_dtype: str | None) -> Any:
        if spec.source == "ngram":
            return PromptLookup()
        from .draft_model import DraftModel, open_draft

        return DraftModel(
            open_draft(spec.source, getattr(self.model, "threads", None)),
            self.model,
            self.vocab_size,
            n_cells=spec.draft_cells or self.n_cells,
            n_seq_max=self.n_seq_max,
            max_step=self.max_batch_tokens,
            kv_dtype=kv_dtype,
        )

    # The scheduler's and the table's collections, under the names the generator always had
    # (tests inspect them).
    @property
    def _waiting(self) -> list[Request]:
        return self._sched.waiting

    @property
    def _running(self) -> list[Request]:
        return self._sched.running

    @property
    def _cached(self) -> OrderedDict[int, int]:
        return self._sched.cached

    @property
    def _finished(self) -> dict[int, Request]:
        return self._table.finished

    def cells_needed(self, n: int) -> int:
        """Free cells a request writing ``n`` tokens may take (on an all-sliding model, at most
        a ring's depth): a request with more than :attr:`n_cells` can never run."""
        return self._sched.cells_needed(n)

    def forget_finished(self, rid: int) -> bool:
        """Drop the record of finished (or cancelled) ``rid``, which :meth:`run` /
        :meth:`pop_finished` would report; returns whether there was one. A server that
        collects each request's tokens as they come calls it to keep the record small."""
        with self._lock:
            return self._table.finished.pop(rid, None) is not None

    # -- requests ---------------------------------------------------------------------------------

    def add(
        self,
        prompt_ids: Sequence[int] | torch.Tensor,
        max_new_tokens: int,
        eos_token_id: int | Sequence[int] | None = None,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int | None = None,
        logprobs: int | None = None,
        logit_bias: Mapping[int, float] | None = None,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        constraint: Constraint | None = None,
        speculative: bool = True,
    ) -> int:
        """Queue a request; returns its id. It joins the batch at the next step it fits.

        ``logprobs``: ``None`` (no logprobs) or ``k`` in ``[0, 20]``: record each generated
        token's logprob and its step's top ``k`` (see :meth:`take_logprobs`).
        ``logit_bias``: token id -> bias in ``[-100, 100]`` added to its logit (-100 bans it,
        +100 all but forces it); ``frequency_penalty`` / ``presence_penalty`` in ``[-2, 2]``:
        subtracted from a token's logit per time it was generated / once it was (OpenAI's
        semantics, the prompt not counted). ``constraint``: a
        :class:`~offgraph_kv.batch.Constraint` its output must match (it stops with ``"stop"``
        once the grammar is complete); ``max_new_tokens`` still cuts it (``"length"``).
        ``speculative=False``: this request does not speculate (when the generator does)."""
        req = self._request(
            prompt_ids,
            max_new_tokens,
            eos_token_id,
            temperature,
            top_p,
            seed,
            logprobs,
            logit_bias=logit_bias,
            frequency_penalty=frequency_penalty,
            presence_penalty=presence_penalty,
            constraint=constraint,
            speculative=speculative,
        )
        with self._lock:
            self._queue([req])
        return req.rid

    def _request(
        self,
        prompt_ids: Any,
        max_new_tokens: int,
        *args: Any,
        constraint: Constraint | None = None,
        **kw: Any,
    ) -> Request:
        guide = None if constraint is None else self.guide(constraint)
        return new_request(
            self._ids, self._limits, prompt_ids, max_new_tokens, *args, guide=guide, **kw
        )

    def prepare_constraints(self) -> None:
        """Build the grammar tokenizer now rather than on the first constrained request (a
        server calls it off its stepping thread at start: ~0.4 s at 49K tokens, ~3 s at 262K).
        Raises what the first constraint would (no tokenizer, llguidance not installed)."""
        with self._ll_lock:
            if self._ll_tokenizer is None:
                self._ll_tokenizer = grammar_tokenizer(
                    self._tokenizer, self.vocab_size, self.eos_token_ids
                )

    def guide(self, constraint: Constraint) -> Guide:
        """A fresh matcher of ``constraint`` over this generator's vocabulary (the grammar
        tokenizer is built on the first call)."""
        if not isinstance(constraint, Constraint):
            raise InvalidArgumentError(
                f"constraint: expected a Constraint or None, got {type(constraint).__name__}"
            )
        self.prepare_constraints()
        return Guide(self._ll_tokenizer, constraint)

    def _queue(self, reqs: list[Request]) -> None:
        self._sched.waiting.extend(reqs)
        self._table.add(reqs)

    def cancel(self, rid: int) -> bool:
        """Drop a waiting or running request; returns whether it was waiting or running.

        A waiting request leaves the queue at once. A running one stops producing tokens and its
        sequence is freed (cells shared with other sequences stay with them) at once, or, when a
        step's forward is in flight in another thread, as soon as that forward returns; a token
        that forward produces for it is still in that step's output. Unknown, finished or
        already cancelled ids return ``False`` and change nothing. Safe to call from another
        thread than the one calling :meth:`step`. The request's partial output is what
        :meth:`run`/:meth:`pop_finished` report for it (``finish_reason`` ``"cancelled"``).
        """
        with self._lock:
            req = self._table.live.get(rid)
            if req is None:
                return False
            if req.seq is not None and self._stepping:
                if req not in self._cancels:
                    self._cancels.append(req)
            else:
                self._drop(req)
            return True

    def _drop(self, req: Request) -> None:
        """Cancel ``req`` now (waiting, or running with no forward in flight)."""
        if req.done:  # finished in the step that was in flight when it was cancelled
            return
        if self._drafter is not None:
            self._drafter.release(req)
        self._sched.drop(req)
        self._table.retire(req, "cancelled")

    def request_info(self, rid: int) -> dict[str, Any] | None:
        """What is known of a request: ``state`` (``"waiting"``, ``"running"``, ``"finished"``
        or ``"cancelled"``), ``prompt_tokens``, ``cached_tokens`` (prompt tokens served from
        shared cells rather than computed), ``generated_tokens`` and ``finish_reason``
        (``"stop"`` at an eos token, ``"length"``, ``"cancelled"``, ``None`` while live).
        ``None`` for an id never added, or finished and collected by :meth:`run` or
        :meth:`pop_finished`."""
        with self._lock:
            return self._table.info(rid)

    def take_logprobs(self, rid: int) -> list[LogprobEntry] | None:
        """The logprob entries of ``rid``'s tokens generated since the last call, oldest first,
        each a :class:`~offgraph_kv.batch.sampling.LogprobEntry` ``(token, logprob, top)`` with
        ``top`` the ``k`` most likely ``(token, logprob)`` of that step, most likely first.
        ``[]`` for a request added without ``logprobs`` (or nothing new); ``None`` for an id
        never added, or forgotten (:meth:`forget_finished`, :meth:`pop_finished`), whose
        entries are forgotten with it. A finished request's last entries stay until then."""
        if isinstance(rid, bool):  # True is not request 1
            return None
        try:
            key = operator.index(rid)
        except TypeError:
            return None  # not an id: no such request, as request_info answers
        with self._lock:
            req = self._table.live.get(key) or self._table.finished.get(key)
            if req is None:
                return None
            out, req.logprob_entries = req.logprob_entries, []
            return out

    @property
    def has_work(self) -> bool:
        """Whether a request is waiting or running."""
        return bool(self._table.live)

    @property
    def stats(self) -> dict[str, Any]:
        """Counters since construction plus the cache's current occupancy. Speculation:
        ``spec_steps`` (request-steps that verified drafts), ``spec_drafted_tokens``,
        ``spec_accepted_tokens`` and ``spec_acceptance_rate`` (accepted / drafted)."""
        with self._lock:
            occ = self._sched.occupancy()
            return {
                **self._counts,
                **self._sched.counters,
                **self._table.counters,
                "cells_used": self.n_cells - self.kc.free_cells,
                "cells_free": self.kc.free_cells,
                "cells_unshared": occ["cells_unshared"],
                "cells_total": self.n_cells,
                "running": occ["running"],
                "waiting": occ["waiting"],
                "cached_sequences": occ["cached_sequences"],
                **({} if self._store is None else self._store.stats()),
                **({} if self.host_cache is None else self.host_cache.stats()),
                "spec_acceptance_rate": (
                    self._counts["spec_accepted_tokens"] / self._counts["spec_drafted_tokens"]
                    if self._counts["spec_drafted_tokens"]
                    else 0.0
                ),
            }

    # -- the step ---------------------------------------------------------------------------------

    def step(self) -> list[tuple[int, int]]:
        """One forward over every active request; returns ``[(rid, token), ...]`` it produced.

        One thread steps; others may :meth:`add`, :meth:`cancel` and read :attr:`stats`
        meanwhile (the lock is not held during the forward)."""
        with self._lock:
            if not self.has_work:
                return []
            plan = self._sched.plan()
            if not plan:
                raise CapacityError(
                    "no request can make progress: the waiting requests do not fit the free cells"
                )
            drafts = self._drafts(plan)
            seq_ids: list[int] = []
            positions: list[int] = []
            tokens: list[int] = []
            rows: list[int] = []
            samplers: list[Request] = []
            for req, n in plan:
                assert req.seq is not None
                extra = drafts.get(req, ())  # verified in this step, after its last token
                seq_ids += [req.seq] * (n + len(extra))
                positions += range(req.fed, req.fed + n + len(extra))
                tokens += req.tokens[req.fed : req.fed + n]
                if req.fed + n == len(req.tokens):
                    rows.append(len(tokens) - 1)
                    samplers.append(req)
                    tokens += extra
                    rows += range(len(tokens) - len(extra), len(tokens))
            self.kc.begin_step(seq_ids, positions)
            self._stepping = True
            # The constrained samplers' masks, computed while the forward runs.
            self.masks.start([r.guide for r in samplers if r.guide is not None])
        try:
            t0 = time.perf_counter()
            logits = self._forward(tokens, positions, rows)
            if self.step_cost is not None:
                self.step_cost.record(len(tokens), time.perf_counter() - t0)
        except BaseException:
            self.masks.rows()  # the masks of a step that did not happen
            with self._lock:
                self._stepping = False
                self._sched.unfed(plan)  # the step's tokens are not held: drop them
                self._apply_cancels()
            raise
        masks = self.masks.rows()
        with self._lock:
            self._stepping = False
            out = self._take(plan, samplers, logits, len(tokens), masks, drafts)
            self._apply_cancels()
        return out

    def _drafts(self, plan: Plan) -> dict[Request, list[int]]:
        """The drafted tokens of the step's decoding requests that speculate: while the step
        holds at most ``step_tokens`` tokens, each request's best length by its acceptance and
        the measured step cost (:mod:`.draft_length`), never past its ``max_new_tokens``."""
        spec, cost = self.speculation, self.step_cost
        if spec is None or cost is None:
            return {}
        n_tokens = sum(n for _, n in plan)
        budget = min(spec.step_tokens, self.max_batch_tokens, self.kc.free_cells) - n_tokens
        in_step = n_tokens  # the step's tokens so far, drafts given to earlier requests included
        wants: list[tuple[Request, int]] = []
        for req, n in plan:
            if budget <= 0:
                break
            if n != 1 or req.fed + 1 != len(req.tokens) or not req.speculative:
                continue
            if req.guide is not None:  # constrained requests do not speculate
                continue
            room = req.max_new_tokens - len(req.generated) - 1  # one token beyond the drafts
            if room < 1:
                continue
            if req.acceptance is None:
                req.acceptance = Acceptance()
            acc = req.acceptance
            cap = min(spec.max_draft, room, budget)
            k = choose(cost, in_step, cap, acc.p)
            if k == 0:
                acc.idle += 1
                if acc.idle < PROBE_EVERY:
                    continue
                k = best_positive(cost, in_step, cap, acc.p)
            wants.append((req, k))
            budget -= k
            in_step += k
        if not wants:
            return {}
        got = self._drafter.draft(wants)
        drafts = {req: d for (req, _), d in zip(wants, got, strict=True) if d}
        for req in drafts:  # one that found no draft probes again next step
            req.acceptance.idle = 0
        return drafts

    def _forward(self, tokens: list[int], positions: list[int], rows: list[int]) -> Any:
        """The model step's logits ``[len(rows), vocab]`` for the open step."""
        return self.model_step.forward_cells(self.kc, tokens, positions, rows)

    def _take(
        self,
        plan: Plan,
        samplers: list[Request],
        logits: Any,
        n_tokens: int,
        masks: Any = None,
        drafts: Mapping[Request, list[int]] | None = None,
    ) -> list[tuple[int, int]]:
        """Account a step's forward: tokens held, the tokens sampled, requests finished."""
        prefill, decode = self._sched.fed(plan)
        self._counts["prefill_tokens"] += prefill
        self._counts["decode_tokens"] += decode
        self._counts["steps"] += 1
        self._counts["forward_tokens"] += n_tokens
        out: list[tuple[int, int]] = []
        guided = 0  # the next constrained sampler's row of `masks`
        at = 0  # the next sampler's first row of `logits`
        for req in samplers:
            i = at
            extra = drafts.get(req) if drafts else None
            if extra:
                at += len(extra) + 1
                self._verify(req, logits, i, extra, out)
                continue
            at += 1
            row = logits[i]
            if req.adjusts:  # only requests that asked pay for the copy
                row = adjusted(
                    row,
                    req.logit_bias,
                    req.counts,
                    req.frequency_penalty,
                    req.presence_penalty,
                )
            complete = False
            if req.guide is not None:
                mask = masks[guided]
                guided += 1
                if mask.any():
                    row = masked(row, mask)
                    tok = sample(row, req.temperature, req.top_p, req.generator)
                    complete = req.guide.advance(tok)
                else:  # a grammar that allows nothing (cannot be continued): end the output
                    tok, complete = min(req.eos or self.eos_token_ids or [0]), True
            else:
                tok = sample(row, req.temperature, req.top_p, req.generator)
            if req.logprobs is not None:  # only requests that asked pay for the softmax
                req.logprob_entries.append(logprob_entry(logits[i], tok, req.logprobs))
            if req.frequency_penalty or req.presence_penalty:
                req.counts[tok] = req.counts.get(tok, 0) + 1
            req.tokens.append(tok)
            out.append((req.rid, tok))
            self._counts["generated_tokens"] += 1
            if tok in req.eos or complete:
                self._finish(req, "stop")
            elif len(req.generated) >= req.max_new_tokens:
                self._finish(req, "length")
        return out

    def _verify(
        self, req: Request, logits: Any, first: int, draft: list[int], out: list[tuple[int, int]]
    ) -> None:
        """Take a speculating request's tokens from its ``len(draft) + 1`` rows at ``first``:
        the accepted drafts and one more token; its rejected drafts' cells are removed."""
        taken: list[int] = []
        accepted = 0
        stop = None
        left = req.max_new_tokens - len(req.generated)
        for j in range(len(draft) + 1):
            raw = logits[first + j]
            row = raw
            if req.adjusts:
                row = adjusted(
                    raw, req.logit_bias, req.counts, req.frequency_penalty, req.presence_penalty
                )
            d = draft[j] if j < len(draft) else None
            if d is None:
                tok = sample(row, req.temperature, req.top_p, req.generator)
            else:
                tok = accept(row, d, req.temperature, req.top_p, req.generator)
            if req.logprobs is not None:
                req.logprob_entries.append(logprob_entry(raw, tok, req.logprobs))
            if req.frequency_penalty or req.presence_penalty:
                req.counts[tok] = req.counts.get(tok, 0) + 1
            taken.append(tok)
            if tok == d:
                accepted += 1
            if tok in req.eos:
                stop = "stop"
            elif len(taken) >= left:
                stop = "length"
            if stop is not None or tok != d:
                break
        # The cells of the drafts not kept go; the kept ones are held like fed tokens.
        if accepted < len(draft):
            self.kc.seq_rm(req.seq, req.fed + accepted)
        self._sched.held(req, draft[:accepted])
        self._counts["spec_steps"] += 1
        self._counts["spec_drafted_tokens"] += len(draft)
        self._counts["spec_accepted_tokens"] += accepted
        self._counts["generated_tokens"] += len(taken)
        req.acceptance.record(len(draft), accepted)  # set when its drafts were asked for
        req.tokens += taken
        out.extend((req.rid, t) for t in taken)
        if stop is not None:
            self._finish(req, stop)
        else:
            self._drafter.verified(req)

    def _finish(self, req: Request, reason: str) -> None:
        if self._drafter is not None:
            self._drafter.release(req)
        self._sched.finish(req)
        self._table.retire(req, reason)

    def _apply_cancels(self) -> None:
        for req in self._cancels:
            self._drop(req)
        self._cancels.clear()

    # -- drivers ----------------------------------------------------------------------------------

    def run(self) -> dict[int, list[int]]:
        """Step until every request is done; returns ``{rid: generated tokens}`` of the requests
        finished since the last ``run``/``generate`` (and forgets them)."""
        while self.has_work:
            self.step()
        return self.pop_finished()

    def pop_finished(self) -> dict[int, list[int]]:
        """``{rid: generated tokens}`` of the requests finished or cancelled since the last
        ``run``/``generate``/``pop_finished``, which forgets them (a server stepping by itself
        calls it to keep the record small)."""
        with self._lock:
            return self._table.pop_finished()

    def generate(
        self,
        prompts: Sequence[Sequence[int] | torch.Tensor],
        max_new_tokens: int,
        eos_token_id: int | Sequence[int] | None = None,
        **sampling: Any,
    ) -> list[list[int]]:
        """Generate for every prompt; returns the generated tokens in prompt order."""
        reqs = [self._request(p, max_new_tokens, eos_token_id, **sampling) for p in prompts]
        with self._lock:
            self._queue(reqs)  # all validated first: a bad prompt queues nothing
        self.run()
        return [r.generated for r in reqs]  # a request cancelled meanwhile: its tokens so far

    def clear_prefix_cache(self) -> None:
        """Free every cached finished sequence (its chunks go to the host tier, if any)."""
        with self._lock:
            self._sched.clear_cache()
