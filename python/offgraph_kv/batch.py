"""Continuous batching over one :class:`~offgraph_kv.KvCellCache`: :class:`BatchGenerator`.

Usage::

    from offgraph_kv.hf import BatchGenerator

    gen = BatchGenerator(model, n_cells=8192, max_batch_tokens=512)
    outs = gen.generate([ids_a, ids_b, ids_c], max_new_tokens=32)   # greedy
    # or drive it yourself: requests join and leave at any step
    rid = gen.add(ids, max_new_tokens=64, eos_token_id=1, temperature=0.7, top_p=0.9, seed=3)
    while gen.has_work:
        for rid, token in gen.step():
            ...

Design
------
* **One cache, one forward per step.** Every decoder layer of the model writes into one
  :class:`~offgraph_kv.KvCellCache` (``full_attention`` layers flat, ``sliding_attention`` layers
  ``Ring(sliding_window)``; the cell cache keeps a separate cell table for ring layers and bounds
  what each sequence holds there). A step is one model forward over the flattened tokens of
  every active request (batch dimension 1): decode tokens and prefill chunks together, each token
  with its own position (``position_ids``), so RoPE gives every request its own positions. The
  cache's ``begin_step(seq_ids, positions)`` places the tokens once; each layer's ``update``
  writes K/V to the tokens' cells and returns the step's spec, whose mask is per token, in
  position space (token i sees the cells its sequence owns at positions <= its own, within the
  layer's window). Attention is :func:`offgraph_kv.attend` on that spec, registered as the
  attention implementation :data:`CELL_ATTN_NAME`; the model is switched to it only for the
  duration of a forward. No padding, no dense ``[T, n_cells]`` mask.
* **Scheduling.** A step carries at most ``max_batch_tokens`` tokens: first one token for every
  decoding request, then prompt chunks of requests already prefilling (oldest first; at most half
  a step each while a request that could start is waiting), then new requests (first come, first
  served). A long prompt is thus prefilled over several steps while decoding requests keep their
  token each step and requests behind it start within a step or two.
* **Admission.** A request is admitted only when the free cells, minus what admitted requests
  may still write (prompt rest plus ``max_new_tokens - 1`` each), cover everything it may write:
  an admitted request always finishes, so a full generator makes new requests wait instead of
  stalling or corrupting running ones. ``begin_step`` stays the gate: a refused step changes
  nothing and is retried with fewer new requests. It never wedges: with nothing running, the
  first waiting request always starts. A fork that does not fit once the cached sequences are
  evicted (its source among them: it then owns the cells it shared, up to a ring's depth on an
  all-sliding model) gives way to a fresh prefill; with every sequence id taken
  (``n_seq_max``) and the only cached sequence being the request's own fork source, the request
  takes that sequence over, cut back to the shared prefix.
* **Prefix sharing.** A new request forks (``seq_clone(src, upto=L)``) the sequence, live or
  finished, holding the longest prefix of its prompt (at most ``len(prompt) - 1`` tokens: the
  last prompt token is always fed, it produces the first logits), and prefills only the rest.
  The held sequences are found through a radix tree over their tokens
  (:class:`~offgraph_kv.prefix_index.PrefixIndex`), so a lookup walks the prompt once whatever
  the number of held sequences (``benches/bench_scheduler.py``). A
  request whose prompt shares a longer prefix with a prompt still being prefilled waits for that
  prefill (a step or two) rather than computing the same prefix again. Finished sequences stay
  cached (``prefix_cache=True``) and are freed least recently used first when cells or sequence
  ids are needed; freeing one never touches cells a fork shares (the cell's owner set keeps it).
  On sliding-window layers the cell cache refuses a fork whose next step would need keys its
  source already dropped from the ring table; the generator then tries the next source, or
  prefills from scratch.
* **Cancelling and threads.** ``cancel(rid)`` drops a waiting request at once and frees a
  running one's sequence at once, or right after the forward in flight when another thread is
  stepping: ``step`` holds the generator's lock while it schedules and while it takes the
  forward's results, never during the forward, so a server's event loop can ``add``,
  ``cancel`` and read ``stats``/``request_info`` while its engine thread steps. One thread steps.
* **Sampling.** Greedy by default; ``temperature > 0`` samples with top-p filtering from a
  per-request ``torch.Generator`` seeded by ``seed``. A request stops at ``max_new_tokens`` or at
  one of its ``eos_token_id`` tokens, which ends its output (as ``generate``'s outputs do).
* **What the kernel lacks.** An attention-logit softcap (Gemma 2) or attention sinks are refused
  at construction (:class:`NotImplementedError`); Gemma 3 and Llama-family models use neither.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import operator
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, get_layer_types_and_kwargs

from . import _native as _okv
from ._errors import CacheError, CapacityError, InvalidArgumentError
from .prefix_index import PrefixIndex
from .store.cells import GeneratorStore

__all__ = ["CELL_ATTN_NAME", "BatchGenerator", "cell_attention", "register_cell_attention"]

CELL_ATTN_NAME = "offgraph_cells"
"""The ``attn_implementation`` name under which :func:`cell_attention` is registered."""

_SPEC_ATTR = "_offgraph_cell_spec"
_WAIT_GAIN = 16  # prefix tokens a prefill in flight must add for a request to wait for it
_FORK_TRIES = 8  # sources tried (longest prefix first) before a request prefills afresh


def cell_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention of one cell-cache step: ``attend(q, spec)`` on the spec ``key`` carries.

    ``attention_mask`` is ``None``: transformers builds no mask for an attention name without a
    registered mask function, and the spec's per-token mask is the truth. Returns
    ``[1, T, n_q_heads, head_dim]``.
    """
    spec = getattr(key, _SPEC_ATTR, None)
    if spec is None:
        raise RuntimeError(
            f"attn_implementation {CELL_ATTN_NAME!r} only serves BatchGenerator steps"
        )
    if kwargs.get("softcap") is not None or kwargs.get("sinks") is not None:
        raise NotImplementedError("cell attention has no softcap or attention sinks")
    q = query[0].detach().to(torch.float32).contiguous()
    out = _okv.attend(q.numpy(), spec, scale=scaling, threads=torch.get_num_threads())
    out = torch.from_numpy(out).transpose(0, 1).unsqueeze(0)
    return out.to(query.dtype).contiguous(), None


def register_cell_attention(name: str = CELL_ATTN_NAME) -> None:
    """Register :func:`cell_attention` (idempotent). No mask function is registered on purpose:
    without one transformers skips building masks, which a cell step does not use."""
    from transformers import AttentionInterface

    AttentionInterface.register(name, cell_attention)


register_cell_attention()


class _CellLayer(CacheLayerMixin):
    """One decoder layer's face of the shared KvCellCache during a step."""

    is_compileable = False
    is_sliding = False

    def __init__(self, kc: _okv.KvCellCache, index: int, sliding: bool):
        super().__init__()
        self.kc = kc
        self.index = index
        self.is_sliding = sliding
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        pass

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        k = key_states[0].detach().to(torch.float32).contiguous()
        v = value_states[0].detach().to(torch.float32).contiguous()
        spec = self.kc.update(self.index, k.numpy(), v.numpy())
        setattr(key_states, _SPEC_ATTR, spec)
        return key_states, value_states

    def get_mask_sizes(self, query: Any, *args: Any) -> tuple[int, int]:
        n = int(query.shape[0]) if isinstance(query, torch.Tensor) else int(query)
        return n, 0

    def get_seq_length(self, *args: Any) -> int:
        return 0

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        pass


class _CellStepCache(Cache):
    """The ``past_key_values`` of a step: layer ``update`` writes to the KvCellCache."""

    def __init__(self, kc: _okv.KvCellCache, sliding: Sequence[bool]):
        super().__init__(layers=[_CellLayer(kc, i, s) for i, s in enumerate(sliding)])


@dataclass
class _Request:
    rid: int
    prompt: list[int]
    max_new_tokens: int
    eos: frozenset[int]
    temperature: float
    top_p: float
    generator: torch.Generator | None
    tokens: list[int] = field(default_factory=list)  # prompt + generated
    seq: int | None = None
    fed: int = 0  # tokens[:fed] are held by `seq`
    reused: int = 0
    done: bool = False
    finish_reason: str | None = None  # "stop" (an eos token), "length" or "cancelled"

    @property
    def generated(self) -> list[int]:
        return self.tokens[len(self.prompt) :]

    @property
    def total(self) -> int:
        """Tokens this request may write: every token but the last one generated."""
        return len(self.prompt) + self.max_new_tokens - 1

    @property
    def outstanding(self) -> int:
        return self.total - self.fed


def _policies(config: Any) -> list[_okv.LayerConfig]:
    text = config.get_text_config(decoder=True)
    if getattr(text, "attn_logit_softcapping", None) is not None:
        raise NotImplementedError(
            "BatchGenerator: the model uses an attention-logit softcap, which offgraph-kv's "
            "attention kernel does not implement"
        )
    heads = int(text.num_attention_heads)
    kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // heads)
    layer_types, kwargs = get_layer_types_and_kwargs(text)
    out = []
    for i, (kind, kw) in enumerate(zip(layer_types, kwargs)):
        if kind == "full_attention":
            policy = _okv.Flat()
        elif kind == "sliding_attention":
            policy = _okv.Ring(window=int(kw["sliding_window"]))
        else:
            raise NotImplementedError(f"BatchGenerator: layer {i} has unsupported type {kind!r}")
        out.append(_okv.LayerConfig(policy, kv_heads, head_dim))
    return out


class BatchGenerator:
    """Continuous batching of many requests over one KvCellCache (see the module docs).

    Args:
        model: a transformers causal LM on the CPU (Llama family, Gemma 3, ...).
        n_cells: cells of the cache (each holds one position's K/V for every layer).
        n_seq_max: most sequences held at once (running plus cached finished ones).
        max_batch_tokens: most tokens one step carries (also the cache's ``max_step``).
        kv_dtype: storage dtype of the pools (``None``: float32).
        prefix_cache: keep finished sequences' cells as prefix cache until cells are needed.
        store: a :class:`~offgraph_kv.store.PrefixStore` (bound to ``model`` here if it is not
            bound yet): admission loads the longest stored prefix no live sequence beats, and
            prefill saves each chunk as it passes the chunk's end.

    ``step`` switches ``model.config._attn_implementation`` to :data:`CELL_ATTN_NAME` for the
    duration of its forward and restores it after: do not run the same model from another
    thread while a step runs.
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
    ):
        if isinstance(max_batch_tokens, bool) or int(max_batch_tokens) < 1:
            raise InvalidArgumentError(f"max_batch_tokens: expected >= 1, got {max_batch_tokens}")
        self.model = model
        self.config = model.config.get_text_config(decoder=True)
        layers = _policies(model.config)
        self.n_layers = len(layers)
        self.max_batch_tokens = int(max_batch_tokens)
        self.max_positions = int(getattr(self.config, "max_position_embeddings", 0) or 1 << 20)
        self.vocab_size = int(self.config.vocab_size)
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
        self.has_flat = any(isinstance(lc.policy, _okv.Flat) for lc in layers)
        windows = [lc.policy.window for lc in layers if isinstance(lc.policy, _okv.Ring)]
        # What one sequence holds in the ring table at most (the cache's bound).
        self.ring_depth = (max(windows) + self.max_batch_tokens - 1) if windows else None
        self.prefix_cache = bool(prefix_cache)
        self._store = None if store is None else GeneratorStore(store, model, self.kc)
        self._past = _CellStepCache(self.kc, [isinstance(lc.policy, _okv.Ring) for lc in layers])
        self._ids = itertools.count()
        self._waiting: list[_Request] = []
        self._running: list[_Request] = []  # admitted, in admission order
        self._finished: dict[int, _Request] = {}
        self._cached: OrderedDict[int, int] = OrderedDict()  # seq -> tokens held, LRU first
        self._held = PrefixIndex()  # seq -> tokens it holds, for every running and cached seq
        self._prefilling = PrefixIndex()  # rid -> prompt, for running requests still prefilling
        self._live: dict[int, _Request] = {}  # rid -> waiting or running request
        # `step` holds the lock while it schedules and while it takes the forward's results, not
        # during the forward: `add`/`cancel`/`stats` from another thread never wait on a forward.
        self._lock = threading.RLock()
        self._stepping = False  # a forward is in flight: cancelling a running request waits
        self._cancels: list[_Request] = []  # running requests cancelled during the forward
        self._stats = {
            "steps": 0,
            "forward_tokens": 0,
            "prefill_tokens": 0,
            "decode_tokens": 0,
            "generated_tokens": 0,
            "prefix_tokens_reused": 0,
            "forks": 0,
            "evictions": 0,
            "requests_finished": 0,
            "requests_cancelled": 0,
        }

    # -- requests ---------------------------------------------------------------------------------

    def add(
        self,
        prompt_ids: Sequence[int] | torch.Tensor,
        max_new_tokens: int,
        eos_token_id: int | Sequence[int] | None = None,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int | None = None,
    ) -> int:
        """Queue a request; returns its id. It joins the batch at the next step it fits."""
        req = self._request(prompt_ids, max_new_tokens, eos_token_id, temperature, top_p, seed)
        with self._lock:
            self._queue([req])
        return req.rid

    def _queue(self, reqs: list[_Request]) -> None:
        self._waiting.extend(reqs)
        self._live.update((r.rid, r) for r in reqs)

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
            req = self._live.get(rid)
            if req is None:
                return False
            if req.seq is None:  # waiting
                self._waiting.remove(req)
                self._retire(req, "cancelled")
            elif self._stepping:
                if req not in self._cancels:
                    self._cancels.append(req)
            else:
                self._drop_running(req)
            return True

    def _drop_running(self, req: _Request) -> None:
        """Cancel a running request now: free its sequence."""
        if req.done:  # finished in the step that was in flight when it was cancelled
            return
        self._running.remove(req)
        assert req.seq is not None
        self.kc.seq_free(req.seq)
        self._held.remove(req.seq)
        self._prefilling.remove(req.rid)
        req.seq = None
        self._retire(req, "cancelled")

    def _retire(self, req: _Request, reason: str) -> None:
        req.done = True
        req.finish_reason = reason
        self._live.pop(req.rid, None)
        self._finished[req.rid] = req
        self._stats["requests_cancelled" if reason == "cancelled" else "requests_finished"] += 1

    def request_info(self, rid: int) -> dict[str, Any] | None:
        """What is known of a request: ``state`` (``"waiting"``, ``"running"``, ``"finished"``
        or ``"cancelled"``), ``prompt_tokens``, ``cached_tokens`` (prompt tokens served from
        shared cells rather than computed), ``generated_tokens`` and ``finish_reason``
        (``"stop"`` at an eos token, ``"length"``, ``"cancelled"``, ``None`` while live).
        ``None`` for an id never added, or finished and collected by :meth:`run` or
        :meth:`pop_finished`."""
        with self._lock:
            req = self._live.get(rid) or self._finished.get(rid)
            if req is None:
                return None
            if req.done:
                state = "cancelled" if req.finish_reason == "cancelled" else "finished"
            else:
                state = "waiting" if req.seq is None else "running"
            return {
                "state": state,
                "prompt_tokens": len(req.prompt),
                "cached_tokens": req.reused,
                "generated_tokens": len(req.generated),
                "finish_reason": req.finish_reason,
            }

    def _request(
        self,
        prompt_ids: Sequence[int] | torch.Tensor,
        max_new_tokens: int,
        eos_token_id: int | Sequence[int] | None = None,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int | None = None,
    ) -> _Request:
        """A validated request (not queued)."""
        prompt = self._tokens(prompt_ids)
        try:
            max_new = operator.index(max_new_tokens)
        except TypeError as e:
            raise InvalidArgumentError(f"max_new_tokens: expected an int, got {e}") from e
        if isinstance(max_new_tokens, bool) or max_new < 1:
            raise InvalidArgumentError(f"max_new_tokens: expected >= 1, got {max_new_tokens}")
        try:
            if eos_token_id is None:
                eos: frozenset[int] = frozenset()
            elif isinstance(eos_token_id, (int, torch.Tensor)) or hasattr(
                eos_token_id, "__index__"
            ):
                eos = frozenset([operator.index(eos_token_id)])
            else:
                eos = frozenset(operator.index(t) for t in eos_token_id)
        except TypeError as e:
            raise InvalidArgumentError(f"eos_token_id: expected token ids, got {e}") from e
        if not (isinstance(temperature, (int, float)) and math.isfinite(temperature)):
            raise InvalidArgumentError(f"temperature: expected a finite number, got {temperature}")
        if temperature < 0:
            raise InvalidArgumentError(f"temperature: expected >= 0, got {temperature}")
        if not (isinstance(top_p, (int, float)) and 0.0 < top_p <= 1.0):
            raise InvalidArgumentError(f"top_p: expected in (0, 1], got {top_p}")
        total = len(prompt) + max_new - 1
        if total > self.max_positions:
            raise CapacityError(
                f"request needs {total} positions, the model has {self.max_positions}"
            )
        if self._need(total) > self.n_cells:
            raise CapacityError(
                f"request may write {total} tokens, more than the cache's {self.n_cells} cells"
            )
        gen = None
        if temperature > 0:
            gen = torch.Generator()
            if seed is None:
                gen.seed()
            else:
                gen.manual_seed(int(seed))
        return _Request(
            rid=next(self._ids),
            prompt=prompt,
            max_new_tokens=max_new,
            eos=eos,
            temperature=float(temperature),
            top_p=float(top_p),
            generator=gen,
            tokens=list(prompt),
        )

    def _tokens(self, prompt_ids: Sequence[int] | torch.Tensor) -> list[int]:
        if isinstance(prompt_ids, torch.Tensor):
            if prompt_ids.dim() == 2 and prompt_ids.shape[0] == 1:
                prompt_ids = prompt_ids[0]
            if prompt_ids.dim() != 1:
                raise InvalidArgumentError(
                    f"prompt_ids: expected one sequence, got shape {tuple(prompt_ids.shape)}"
                )
            prompt_ids = prompt_ids.tolist()
        try:
            prompt = [int(t) for t in prompt_ids]
        except (TypeError, ValueError) as e:
            raise InvalidArgumentError(f"prompt_ids: expected token ids, got {e}") from e
        if not prompt:
            raise InvalidArgumentError("prompt_ids: empty prompt")
        bad = [t for t in prompt if not 0 <= t < self.vocab_size]
        if bad:
            raise InvalidArgumentError(
                f"prompt_ids: token {bad[0]} outside the vocabulary [0, {self.vocab_size})"
            )
        return prompt

    def _need(self, n: int) -> int:
        """Free cells ``n`` more written tokens of one sequence may take."""
        if not self.has_flat and self.ring_depth is not None:
            return min(n, self.ring_depth)
        return n

    @property
    def has_work(self) -> bool:
        """Whether a request is waiting or running."""
        return bool(self._live)

    @property
    def stats(self) -> dict[str, int]:
        """Counters since construction plus the cache's current occupancy."""
        with self._lock:
            return self._stats_now()

    def _stats_now(self) -> dict[str, int]:
        held = sum(r.fed for r in self._running) + sum(self._cached.values())
        return {
            **self._stats,
            "cells_used": self.n_cells - self.kc.free_cells,
            "cells_free": self.kc.free_cells,
            "cells_unshared": held,
            "cells_total": self.n_cells,
            "running": len(self._running),
            "waiting": len(self._waiting),
            "cached_sequences": len(self._cached),
            **({} if self._store is None else self._store.stats()),
        }

    # -- the step ---------------------------------------------------------------------------------

    def step(self) -> list[tuple[int, int]]:
        """One forward over every active request; returns ``[(rid, token), ...]`` it produced.

        One thread steps; others may :meth:`add`, :meth:`cancel` and read :attr:`stats`
        meanwhile (the lock is not held during the forward)."""
        with self._lock:
            if not self.has_work:
                return []
            plan = self._schedule()
            if not plan:
                raise CapacityError(
                    "no request can make progress: the waiting requests do not fit the free cells"
                )
            seq_ids: list[int] = []
            positions: list[int] = []
            tokens: list[int] = []
            rows: list[int] = []
            samplers: list[_Request] = []
            for req, n in plan:
                assert req.seq is not None
                seq_ids += [req.seq] * n
                positions += range(req.fed, req.fed + n)
                tokens += req.tokens[req.fed : req.fed + n]
                if req.fed + n == len(req.tokens):
                    rows.append(len(tokens) - 1)
                    samplers.append(req)
            self.kc.begin_step(seq_ids, positions)
            self._stepping = True
        try:
            logits = self._forward(tokens, positions, rows)
        except BaseException:
            with self._lock:
                self._stepping = False
                for req, _ in plan:  # the step's tokens are not held: drop them
                    with contextlib.suppress(CacheError):
                        self.kc.seq_rm(req.seq, req.fed)
                self._apply_cancels()
            raise
        with self._lock:
            self._stepping = False
            out = self._take(plan, samplers, logits, len(tokens))
            self._apply_cancels()
        return out

    def _take(
        self,
        plan: list[tuple[_Request, int]],
        samplers: list[_Request],
        logits: torch.Tensor,
        n_tokens: int,
    ) -> list[tuple[int, int]]:
        """Account a step's forward: tokens held, the tokens sampled, requests finished."""
        for req, n in plan:
            if req.fed < len(req.prompt):
                self._stats["prefill_tokens"] += n
                if req.fed + n >= len(req.prompt):
                    self._prefilling.remove(req.rid)
            else:
                self._stats["decode_tokens"] += n
            self._held.extend(req.seq, req.tokens[req.fed : req.fed + n])
            req.fed += n
        if self._store is not None:
            self._store.prefilled([(r.seq, r.prompt, r.fed - n, r.fed) for r, n in plan])
        self._stats["steps"] += 1
        self._stats["forward_tokens"] += n_tokens
        out: list[tuple[int, int]] = []
        for i, req in enumerate(samplers):
            tok = self._sample(req, logits[i])
            req.tokens.append(tok)
            out.append((req.rid, tok))
            self._stats["generated_tokens"] += 1
            if tok in req.eos:
                self._finish(req, "stop")
            elif len(req.generated) >= req.max_new_tokens:
                self._finish(req, "length")
        return out

    def _apply_cancels(self) -> None:
        for req in self._cancels:
            self._drop_running(req)
        self._cancels.clear()

    def _forward(self, tokens: list[int], positions: list[int], rows: list[int]) -> torch.Tensor:
        ids = torch.tensor([tokens], dtype=torch.long)
        pos = torch.tensor([positions], dtype=torch.long)
        keep = torch.tensor(rows, dtype=torch.long)
        with torch.inference_mode(), self._attention():
            out = self.model(
                input_ids=ids,
                position_ids=pos,
                cache=self._past,
                use_cache=True,
                logits_to_keep=keep,
            )
        return out.logits[0].to(torch.float32)

    @contextlib.contextmanager
    def _attention(self) -> Iterator[None]:
        """The model's attention is :func:`cell_attention` for the duration of a forward."""
        configs = {id(c): c for c in (self.model.config, self.config)}.values()
        saved = [(c, c._attn_implementation) for c in configs]
        try:
            for c in configs:
                c._attn_implementation = CELL_ATTN_NAME
            yield
        finally:
            for c, name in saved:
                c._attn_implementation = name

    def _sample(self, req: _Request, logits: torch.Tensor) -> int:
        if req.temperature == 0:
            return int(torch.argmax(logits))
        probs = torch.softmax(logits / req.temperature, dim=-1)
        if req.top_p < 1.0:
            sorted_p, order = torch.sort(probs, descending=True)
            cum = torch.cumsum(sorted_p, dim=-1)
            drop = cum - sorted_p >= req.top_p  # keep the smallest head reaching top_p
            sorted_p = sorted_p.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter(0, order, sorted_p)
        return int(torch.multinomial(probs, 1, generator=req.generator))

    def _finish(self, req: _Request, reason: str) -> None:
        self._running.remove(req)
        self._retire(req, reason)
        assert req.seq is not None
        if self.prefix_cache:
            self._cached[req.seq] = req.fed
        else:
            self._held.remove(req.seq)
            self.kc.seq_free(req.seq)
        req.seq = None

    # -- scheduling -------------------------------------------------------------------------------

    def _schedule(self) -> list[tuple[_Request, int]]:
        """This step's ``(request, tokens)``: decoders, prefill chunks, then admissions."""
        budget = self.max_batch_tokens
        plan: list[tuple[_Request, int]] = []
        decoders = [r for r in self._running if len(r.tokens) - r.fed == 1]
        prefill = [r for r in self._running if len(r.tokens) - r.fed > 1]
        for req in decoders[:budget]:
            plan.append((req, 1))
        budget -= len(plan)
        # While a request that could start now waits, a prefill takes at most half a step, so the
        # request starts within a step or two instead of after the whole prefill.
        starters = bool(prefill) and any(
            not self._worth_waiting(r, self._best_upto(r)) for r in self._waiting
        )
        cap = max(1, self.max_batch_tokens // 2) if starters else budget
        for req in prefill:
            if budget == 0:
                break
            n = min(len(req.tokens) - req.fed, budget, cap)
            plan.append((req, n))
            budget -= n
        while budget > 0 and self._waiting:
            req = self._admit_next()
            if req is None:
                break
            n = min(len(req.tokens) - req.fed, budget)
            plan.append((req, n))
            budget -= n
        return plan

    def _free_for_admission(self) -> int:
        return self.kc.free_cells - sum(self._need(r.outstanding) for r in self._running)

    def _admit_next(self) -> _Request | None:
        """Admit the first waiting request that should start now, or ``None``."""
        for i, req in enumerate(self._waiting):
            upto = self._best_upto(req)
            if self._worth_waiting(req, upto):
                continue
            if not self._admit(req):
                return None  # first come, first served: nothing behind it jumps the queue
            del self._waiting[i]
            self._running.append(req)
            return req
        return None

    def _sources(self, req: _Request) -> Iterator[tuple[int, int]]:
        """``(seq, upto)`` of the held sequences sharing a prefix of ``req``'s prompt (at most
        all but its last token), longest first: one walk of the prompt through the index."""
        return self._held.longest(req.prompt, len(req.prompt) - 1)

    def _best_upto(self, req: _Request) -> int:
        return next(self._sources(req), (None, 0))[1]

    def _worth_waiting(self, req: _Request, held: int) -> bool:
        """Whether a prompt still being prefilled will soon hold a longer prefix of ``req``."""
        for rid, n in self._prefilling.longest(req.prompt, len(req.prompt) - 1):
            if n - held < _WAIT_GAIN:
                return False  # longest first: no later prompt gains enough either
            if n - max(held, self._live[rid].fed) >= _WAIT_GAIN:
                return True
        return False

    def _evict_one(self, keep: int | None = None) -> bool:
        for seq in self._cached:
            if seq != keep:
                self._evict(seq)
                return True
        return False

    def _evict(self, seq: int) -> None:
        del self._cached[seq]
        self._held.remove(seq)
        self.kc.seq_free(seq)
        self._stats["evictions"] += 1

    def _admit(self, req: _Request) -> bool:
        """Give ``req`` a sequence (a fork when a source holds its prefix) if it fits."""
        if len(self._held) >= self.n_seq_max:
            best, upto = next(self._sources(req), (None, 0))
            if not self._evict_one(keep=best):
                if best not in self._cached:
                    return False  # every id is running: wait for one to finish
                seq, upto = self._take_over(best, upto)  # the only way forward
                return self._place(req, seq, upto, None)
        return self._place(req, *self._fork(req))

    def _fork(self, req: _Request) -> tuple[int, int, int | None]:
        """``(seq, upto, source)``: a fork of the longest held prefix the cache allows, else a
        fresh sequence."""
        if self._store is not None:
            seq, upto = self._store.admit(req.prompt, self._best_upto(req))
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
        del self._cached[seq]
        self._held.remove(seq)
        try:
            self.kc.seq_rm(seq, upto)
        except CacheError:
            self.kc.seq_free(seq)
            self._stats["evictions"] += 1
            return self.kc.seq_new(), 0
        return seq, upto

    def _place(self, req: _Request, seq: int, upto: int, src: int | None) -> bool:
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
            self._stats["forks"] += 1
            if src in self._cached:
                self._cached.move_to_end(src)  # a fork source counts as used
        self._start(req, seq, upto)
        return True

    def _room_for(self, req: _Request, upto: int) -> bool:
        """Whether ``req`` forked at ``upto`` fits, evicting cached sequences as needed."""
        need = self._need(req.total - upto)
        while self._free_for_admission() < need and self._evict_one():
            pass
        return self._free_for_admission() >= need

    def _start(self, req: _Request, seq: int, upto: int) -> None:
        if upto:
            self._stats["prefix_tokens_reused"] += upto
        req.seq, req.fed, req.reused = seq, upto, upto
        self._held.insert(seq, req.prompt[:upto])
        if upto < len(req.prompt):
            self._prefilling.insert(req.rid, req.prompt)

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
            done = {rid: r.generated for rid, r in self._finished.items()}
            self._finished.clear()
        return done

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
        """Free every cached finished sequence."""
        with self._lock:
            while self._evict_one():
                pass
