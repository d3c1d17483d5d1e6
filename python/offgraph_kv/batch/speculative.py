"""Speculative decoding in the batch step: what drafts come from, and how a draft is accepted.

A decoding request that speculates feeds its last token and ``k`` drafted tokens in one step;
the forward returns the logits of all ``k + 1`` rows and the request keeps the longest prefix
of the draft its own sampling produces (:func:`accept`), plus one token from the first row it
did not accept (or from the last row): 1 to ``k + 1`` tokens per step for one pass over the
weights. The rejected drafts' cells are removed (``seq_rm``; the cache rewinds within
``max_step``).

* **Greedy** requests accept a draft token iff it is the row's argmax: the output is the one
  without speculation.
* **Sampled** requests use the rejection rule for a deterministic proposal: accept the draft
  ``x`` with probability ``p(x)``, else draw from ``p`` without ``x``, renormalised; ``p`` is
  the distribution the request's sampler draws from (its logit bias and penalties applied,
  then temperature and top-p), so each token's distribution is exactly the sampler's. The
  random draws differ from a run without speculation: a seeded request repeats itself, but
  not the unspeculated run's tokens.
* **Constrained** requests (a grammar) do not speculate.

Sources: :class:`PromptLookup` (n-grams of the request's own tokens, :mod:`.ngram`) and a draft
model of the same vocabulary (:class:`~offgraph_kv.batch.draft_model.DraftModel`).

Draft length is per request and per step (:mod:`.draft_length`): the length with the most
expected tokens per second of forward, from the request's measured acceptance and the
generator's measured cost of a forward by its token count; none when no length pays (a request
that stopped drafting drafts again every few steps to keep its estimate current). Drafts are
added only while the step holds at most ``step_tokens`` tokens (12 by default;
docs/speculative.md has the measured curves), so a full batch does not speculate.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._errors import InvalidArgumentError
from .ngram import NgramIndex

__all__ = [
    "PromptLookup",
    "Speculation",
    "accept",
    "distribution",
    "speculation",
]

DEFAULT_MAX_DRAFT = 8
DEFAULT_STEP_TOKENS = 12


@dataclass(frozen=True)
class Speculation:
    """How a generator speculates.

    Args:
        source: ``"ngram"`` (prompt lookup), a draft model of the target's vocabulary (an object
            with ``forward_cells``, such as a :class:`~offgraph_kv.GgufModel`), or the path of
            a ``.gguf`` file to open as one.
        max_draft: most tokens drafted for one request in one step.
        step_tokens: drafts are added only while the step holds at most this many tokens
            (decode, prefill and drafts together): a full batch does not speculate.
        draft_cells: cells of a draft model's own cache (``None``: the generator's ``n_cells``).
        step_cost: ``{T: ratio}``, what a ``T``-token forward costs over a one-token one, fixed
            (as ``benches/bench_spec.py --step-cost`` prints it); ``None`` (default): measured
            as the generator runs (see :mod:`.draft_length`).
    """

    source: Any = "ngram"
    max_draft: int = DEFAULT_MAX_DRAFT
    step_tokens: int = DEFAULT_STEP_TOKENS
    draft_cells: int | None = None
    step_cost: Mapping[int, float] | None = None

    def __post_init__(self) -> None:
        for name in ("max_draft", "step_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidArgumentError(f"speculative {name}: expected an int >= 1, got {v!r}")
        c = self.step_cost
        if c is not None and (
            not isinstance(c, Mapping)
            or not all(
                isinstance(n, int)
                and not isinstance(n, bool)
                and n >= 1
                and isinstance(r, (int, float))
                and not isinstance(r, bool)
                and r > 0
                for n, r in c.items()
            )
        ):
            raise InvalidArgumentError(
                "speculative step_cost: expected a dict of token counts >= 1 to ratios > 0, "
                f"got {c!r}"
            )
        d = self.draft_cells
        if d is not None and (isinstance(d, bool) or not isinstance(d, int) or d < 1):
            raise InvalidArgumentError(
                f"speculative draft_cells: expected an int >= 1 or None, got {d!r}"
            )


def speculation(arg: Any) -> Speculation | None:
    """The generator's ``speculative`` argument as a :class:`Speculation` (``None``: off).
    ``None``/``False``: off; ``"ngram"``; a ``.gguf`` path; a model; a :class:`Speculation`."""
    if arg is None or arg is False:
        return None
    if isinstance(arg, Speculation):
        spec = arg
    elif arg is True:
        spec = Speculation()
    else:
        spec = Speculation(source=arg)
    src = spec.source
    if isinstance(src, (str, os.PathLike)):
        if src == "ngram":
            return spec
        if not os.fspath(src).endswith(".gguf"):
            raise InvalidArgumentError(
                f"speculative: expected 'ngram', a .gguf path or a draft model, got {src!r}"
            )
    elif not callable(getattr(src, "forward_cells", None)) and not hasattr(src, "config"):
        raise InvalidArgumentError(
            "speculative: expected 'ngram', a .gguf path or a draft model, got "
            f"{type(src).__name__}"
        )
    return spec


class PromptLookup:
    """Drafts from each request's own tokens (an :class:`~.ngram.NgramIndex` per request)."""

    def __init__(self, max_n: int = 4, min_n: int = 2):
        self.max_n, self.min_n = max_n, min_n

    def draft(self, wants: list[tuple[Any, int]]) -> list[list[int]]:
        """Per ``(request, k)``: at most ``k`` drafted tokens."""
        out = []
        for req, k in wants:
            if req.ngram is None:
                req.ngram = NgramIndex(self.max_n, self.min_n)
            out.append(req.ngram.draft(req.tokens, k))
        return out

    def verified(self, req: Any) -> None:
        """``req``'s drafts were verified (nothing to keep in step)."""

    def release(self, req: Any) -> None:
        """``req`` is over."""
        req.ngram = None

    def close(self) -> None:
        pass


def _as_numpy(row: Any) -> np.ndarray:
    return row.detach().float().cpu().numpy() if hasattr(row, "detach") else np.asarray(row)


def distribution(row: Any, temperature: float, top_p: float) -> np.ndarray:
    """The float64 probabilities (over the whole vocabulary) the sampler draws a token from
    for one (already adjusted) logits row at ``temperature > 0`` with top-p: the smallest head
    reaching ``top_p`` kept (ties: the lower id first), renormalised."""
    z = _as_numpy(row).astype(np.float64) / temperature
    p = np.exp(z - z.max())
    if top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        sp = p[order]
        cum = np.cumsum(sp)
        sp[cum - sp >= top_p * cum[-1]] = 0.0
        p = np.zeros_like(p)
        p[order] = sp
    return p / p.sum()


def _uniform(generator: Any) -> float:
    if isinstance(generator, np.random.Generator):
        return float(generator.random())
    import torch

    return float(torch.rand((), generator=generator, dtype=torch.float64))


def _draw(p: np.ndarray, generator: Any) -> int:
    cdf = np.cumsum(p)
    i = int(np.searchsorted(cdf, _uniform(generator) * cdf[-1], side="right"))
    return min(i, len(p) - 1)


def accept(row: Any, draft: int, temperature: float, top_p: float, generator: Any) -> int:
    """The token a request takes at a row whose drafted token is ``draft``: ``draft`` itself
    when accepted, else a token drawn from the rest (see the module's rules). ``row`` is the
    adjusted logits row the request's sampler would use."""
    if temperature == 0 or generator is None:
        return int(np.argmax(_as_numpy(row)))  # the first of equal maxima, as the sampler's
    p = distribution(row, temperature, top_p)
    if _uniform(generator) < p[draft]:
        return int(draft)
    p[draft] = 0.0
    return _draw(p, generator)
