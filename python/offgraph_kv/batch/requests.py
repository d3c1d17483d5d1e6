"""Requests: what one holds (:class:`Request`), how one is checked (:func:`new_request`), and
the table of every request by id (:class:`RequestTable`: live ones, finished ones not yet
collected, and the finished / cancelled counters)."""

from __future__ import annotations

import math
import operator
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .._errors import CapacityError, InvalidArgumentError
from .sampling import MAX_LOGPROBS, LogprobEntry, sampler_for

if TYPE_CHECKING:
    import torch

__all__ = ["Request", "RequestLimits", "RequestTable", "new_request", "prompt_tokens"]


def _is_tensor(x: Any) -> bool:
    # A torch tensor exists only once torch is imported: the native engine's path never
    # imports it just to find out that a list is not a tensor.
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


@dataclass(eq=False)  # compared and hashed by identity: the scheduler's prefix index keys by it
class Request:
    rid: int
    prompt: list[int]
    max_new_tokens: int
    eos: frozenset[int]
    temperature: float
    top_p: float
    generator: Any  # torch.Generator, numpy Generator or None (greedy); see .sampling
    tokens: list[int] = field(default_factory=list)  # prompt + generated
    seq: int | None = None
    fed: int = 0  # tokens[:fed] are held by `seq`
    reused: int = 0
    done: bool = False
    finish_reason: str | None = None  # "stop" (an eos token), "length" or "cancelled"
    logprobs: int | None = None  # top alternatives asked per token; None: no logprobs
    # Entries of the tokens generated since the last `BatchGenerator.take_logprobs`.
    logprob_entries: list[LogprobEntry] = field(default_factory=list)
    logit_bias: tuple[np.ndarray, np.ndarray] | None = None  # (token ids, biases)
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    counts: dict[int, int] = field(default_factory=dict)  # generated token -> times (penalties)
    guide: Any = None  # a .guide.Guide: the grammar its output must match; None: free
    speculative: bool = True  # may speculate when the generator does (False: opted out)
    acceptance: Any = None  # its draft acceptance estimate (.draft_length.Acceptance)
    ngram: Any = None  # its prompt lookup index (.ngram.NgramIndex), built on first use

    @property
    def adjusts(self) -> bool:
        """Whether its logits row is changed before sampling (bias or penalties)."""
        return self.logit_bias is not None or bool(self.frequency_penalty or self.presence_penalty)

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


@dataclass(frozen=True)
class RequestLimits:
    """What a request must fit: the vocabulary, the model's positions, the cache's cells
    (``cells_needed(n)``: free cells ``n`` written tokens of one sequence may take)."""

    vocab_size: int
    max_positions: int
    n_cells: int
    cells_needed: Callable[[int], int]
    numpy_sampler: bool = False  # the native engine's requests: numpy random sources


def prompt_tokens(prompt_ids: Sequence[int] | torch.Tensor, vocab_size: int) -> list[int]:
    """``prompt_ids`` (a sequence of ints, a 1-D tensor or a ``[1, T]`` one) as a checked list."""
    if _is_tensor(prompt_ids):
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
    bad = [t for t in prompt if not 0 <= t < vocab_size]
    if bad:
        raise InvalidArgumentError(
            f"prompt_ids: token {bad[0]} outside the vocabulary [0, {vocab_size})"
        )
    return prompt


def _eos_set(eos_token_id: int | Sequence[int] | None) -> frozenset[int]:
    try:
        if eos_token_id is None:
            return frozenset()
        if _is_tensor(eos_token_id) or hasattr(eos_token_id, "__index__"):
            return frozenset([operator.index(eos_token_id)])  # type: ignore[arg-type]
        return frozenset(operator.index(t) for t in eos_token_id)
    except TypeError as e:
        raise InvalidArgumentError(f"eos_token_id: expected token ids, got {e}") from e


def new_request(
    ids: Iterator[int],
    limits: RequestLimits,
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
    guide: Any = None,
    speculative: bool = True,
) -> Request:
    """A checked request (not queued); its id is drawn from ``ids`` only once every check
    passed, so a refused request takes no id. ``guide``: its constraint's matcher (built by
    the generator, which holds the grammar tokenizer). ``speculative``: ``False`` opts the
    request out of the generator's speculative decoding."""
    prompt = prompt_tokens(prompt_ids, limits.vocab_size)
    if not isinstance(speculative, bool):
        raise InvalidArgumentError(f"speculative: expected a bool, got {speculative!r}")
    try:
        max_new = operator.index(max_new_tokens)
    except TypeError as e:
        raise InvalidArgumentError(f"max_new_tokens: expected an int, got {e}") from e
    if isinstance(max_new_tokens, bool) or max_new < 1:
        raise InvalidArgumentError(f"max_new_tokens: expected >= 1, got {max_new_tokens}")
    eos = _eos_set(eos_token_id)
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature)):
        raise InvalidArgumentError(f"temperature: expected a finite number, got {temperature}")
    if temperature < 0:
        raise InvalidArgumentError(f"temperature: expected >= 0, got {temperature}")
    if not (isinstance(top_p, (int, float)) and 0.0 < top_p <= 1.0):
        raise InvalidArgumentError(f"top_p: expected in (0, 1], got {top_p}")
    top = _logprobs(logprobs)
    bias = _logit_bias(logit_bias, limits.vocab_size)
    freq = _penalty("frequency_penalty", frequency_penalty)
    pres = _penalty("presence_penalty", presence_penalty)
    total = len(prompt) + max_new - 1
    if total > limits.max_positions:
        raise CapacityError(
            f"request needs {total} positions, the model has {limits.max_positions}"
        )
    if limits.cells_needed(total) > limits.n_cells:
        raise CapacityError(
            f"request may write {total} tokens, more than the cache's {limits.n_cells} cells"
        )
    return Request(
        rid=next(ids),
        prompt=prompt,
        max_new_tokens=max_new,
        eos=eos,
        temperature=float(temperature),
        top_p=float(top_p),
        generator=sampler_for(temperature, seed, numpy=limits.numpy_sampler),
        tokens=list(prompt),
        logprobs=top,
        logit_bias=bias,
        frequency_penalty=freq,
        presence_penalty=pres,
        guide=guide,
        speculative=speculative,
    )


MAX_LOGIT_BIAS = 100.0  # OpenAI's range: -100 bans a token, +100 all but forces it
MAX_PENALTY = 2.0  # OpenAI's range of frequency_penalty and presence_penalty


def _number(name: str, value: Any, bound: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise InvalidArgumentError(f"{name}: expected a number, got {value!r}")
    if not (math.isfinite(value) and -bound <= value <= bound):
        raise InvalidArgumentError(f"{name}: expected in [{-bound:g}, {bound:g}], got {value}")
    return float(value)


def _penalty(name: str, value: Any) -> float:
    return _number(name, value, MAX_PENALTY)


def _logit_bias(bias: Any, vocab_size: int) -> tuple[np.ndarray, np.ndarray] | None:
    """``logit_bias`` checked: ``None`` or a mapping token id -> bias in [-100, 100], as
    ``(ids, biases)`` arrays (``None`` when empty)."""
    if bias is None:
        return None
    if not isinstance(bias, Mapping):
        raise InvalidArgumentError(
            f"logit_bias: expected a mapping token id -> bias, got {type(bias).__name__}"
        )
    ids: dict[int, float] = {}
    for key, value in bias.items():
        if isinstance(key, bool) or not hasattr(key, "__index__"):
            raise InvalidArgumentError(f"logit_bias: expected token ids as keys, got {key!r}")
        tok = operator.index(key)
        if not 0 <= tok < vocab_size:
            raise InvalidArgumentError(
                f"logit_bias: token {tok} outside the vocabulary [0, {vocab_size})"
            )
        ids[tok] = _number(f"logit_bias[{tok}]", value, MAX_LOGIT_BIAS)
    if not ids:
        return None
    return np.fromiter(ids, np.int64, len(ids)), np.fromiter(ids.values(), np.float32, len(ids))


def _logprobs(logprobs: Any) -> int | None:
    """``logprobs`` checked: ``None`` (off) or an int in ``[0, MAX_LOGPROBS]`` (a bool is not
    one: ``True`` would silently mean 1)."""
    if logprobs is None:
        return None
    if isinstance(logprobs, bool):
        raise InvalidArgumentError(f"logprobs: expected an int or None, got {logprobs!r}")
    try:
        k = operator.index(logprobs)
    except TypeError:
        raise InvalidArgumentError(
            f"logprobs: expected an int or None, got {type(logprobs).__name__}"
        ) from None
    if not 0 <= k <= MAX_LOGPROBS:
        raise InvalidArgumentError(f"logprobs: expected in [0, {MAX_LOGPROBS}], got {k}")
    return k


class RequestTable:
    """Every request by id: ``live`` (waiting or running) and ``finished`` (finished or
    cancelled, until collected by :meth:`pop_finished`)."""

    def __init__(self) -> None:
        self.live: dict[int, Request] = {}
        self.finished: dict[int, Request] = {}
        self.counters = {"requests_finished": 0, "requests_cancelled": 0}

    def add(self, reqs: Sequence[Request]) -> None:
        self.live.update((r.rid, r) for r in reqs)

    def retire(self, req: Request, reason: str) -> None:
        """``req`` is over (``"stop"``, ``"length"`` or ``"cancelled"``)."""
        req.done = True
        req.finish_reason = reason
        self.live.pop(req.rid, None)
        self.finished[req.rid] = req
        self.counters["requests_cancelled" if reason == "cancelled" else "requests_finished"] += 1

    def info(self, rid: int) -> dict[str, Any] | None:
        """See :meth:`BatchGenerator.request_info`."""
        req = self.live.get(rid) or self.finished.get(rid)
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

    def pop_finished(self) -> dict[int, list[int]]:
        """``{rid: generated tokens}`` of the finished requests, which are forgotten."""
        done = {rid: r.generated for rid, r in self.finished.items()}
        self.finished.clear()
        return done
