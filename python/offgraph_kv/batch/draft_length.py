"""How many tokens a request drafts: the length that yields most tokens per second of forward.

A step that verifies ``k`` drafts of one request yields ``1 + p + ... + p**k`` tokens on
average (``p``: the request's chance that a draft token is accepted, estimated from its
verifications) and costs a ``T``-token forward. What a ``T``-token forward costs depends on the
CPU and the kernels: on AVX-512 VNNI a 9-token step of a small model costs ~1.5x a one-token
one, on an AVX2-only CPU ~3.7x, and the kernels' 4-token chunks make 5 tokens cost nearly what
8 do (docs/speculative.md). So the cost is measured: :class:`StepCost` times every forward by
its token count, and :func:`choose` takes the draft length with the most expected tokens per
second, zero when none pays. Counts never measured are interpolated between measured ones
(beyond the largest, taken as its cost: optimistic, so they get tried and measured).
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["PROBE_EVERY", "Acceptance", "StepCost", "best_positive", "choose", "expected_tokens"]

# A new measurement's weight; a sample above SPIKE x the estimate counts as SPIKE x (a shared
# machine's interruptions only ever make a forward slower).
ALPHA = 0.25
SPIKE = 1.5
# Steps a request goes without drafting before it drafts anyway, to keep its acceptance
# estimate current (what it drafts then is still the best length by the estimate).
PROBE_EVERY = 16


class StepCost:
    """Seconds of a forward by its number of tokens: measured (:meth:`record`), or fixed by the
    caller as ratios to a one-token forward (``Speculation(step_cost={T: ratio})``)."""

    def __init__(self, fixed: Mapping[int, float] | None = None):
        self._t: dict[int, float] = {}
        self.fixed = fixed is not None
        if fixed is not None:
            self._t = {1: 1.0, **{int(n): float(r) for n, r in fixed.items()}}
        self._known: list[int] = sorted(self._t)

    def record(self, n_tokens: int, seconds: float) -> None:
        if self.fixed or n_tokens < 1 or not seconds > 0:
            return
        old = self._t.get(n_tokens)
        if old is None:
            self._t[n_tokens] = seconds
            self._known = sorted(self._t)
        else:
            self._t[n_tokens] = old + ALPHA * (min(seconds, SPIKE * old) - old)

    def seconds(self, n_tokens: int) -> float | None:
        """The estimate for ``n_tokens``: measured, interpolated between the nearest measured
        counts, or the largest measured count's below it; ``None`` if nothing at or below it
        was measured."""
        t = self._t.get(n_tokens)
        if t is not None:
            return t
        lo = hi = None
        for n in self._known:
            if n < n_tokens:
                lo = n
            else:
                hi = n
                break
        if lo is None:
            return None
        if hi is None:
            return self._t[lo]
        w = (n_tokens - lo) / (hi - lo)
        return self._t[lo] + w * (self._t[hi] - self._t[lo])

    def ratios(self) -> dict[int, float]:
        """The measured counts' costs over a one-token forward's (empty before one ran)."""
        one = self._t.get(1)
        return {n: self._t[n] / one for n in self._known} if one else {}


class Acceptance:
    """A request's chance that a draft token is accepted: accepted tokens against rejections
    (a verification that stopped before the draft's end), older ones decaying, starting from
    one of each (0.5)."""

    DECAY = 0.9

    def __init__(self) -> None:
        self.accepted = 1.0
        self.rejected = 1.0
        self.idle = 0  # steps since it last drafted

    def record(self, drafted: int, accepted: int) -> None:
        self.accepted = self.DECAY * self.accepted + accepted
        self.rejected = self.DECAY * self.rejected + (1 if accepted < drafted else 0)

    @property
    def p(self) -> float:
        return self.accepted / (self.accepted + self.rejected)


def expected_tokens(p: float, k: int) -> float:
    """Tokens a step verifying ``k`` drafts yields when each is accepted with ``p``
    (independently, until the first rejection), the token after the last kept one included."""
    return float(k + 1) if p >= 1.0 else (1.0 - p ** (k + 1)) / (1.0 - p)


def _rate(cost: StepCost, n_before: int, k: int, p: float) -> float | None:
    """Tokens per second of a step of ``n_before + k`` tokens whose request drafts ``k`` (each
    other token counting as one)."""
    t = cost.seconds(n_before + k)
    return None if t is None else (n_before - 1 + expected_tokens(p, k)) / t


def choose(cost: StepCost, n_before: int, k_max: int, p: float) -> int:
    """The draft length (``0..k_max``) with the most tokens per second for a request whose
    pending token is the ``n_before``-th token of the step (the step's other tokens each count
    as one); the shortest of equal ones. Zero while no forward of at most ``n_before`` tokens
    was measured: the step then measures one (and every longer step has an estimate)."""
    if cost.seconds(n_before) is None:
        return 0
    return max(range(k_max + 1), key=lambda k: _rate(cost, n_before, k, p) or 0.0)


def best_positive(cost: StepCost, n_before: int, k_max: int, p: float) -> int:
    """The best length of at least one draft (a probe when :func:`choose` says none pays);
    ``k_max >= 1``."""
    return max(range(1, k_max + 1), key=lambda k: _rate(cost, n_before, k, p) or 0.0)
