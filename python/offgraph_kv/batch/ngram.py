"""Prompt lookup: draft tokens from a sequence's own earlier text (:class:`NgramIndex`).

The last ``n`` tokens of a sequence (``n`` from ``max_n`` down to ``min_n``, longest first) are
looked up among its earlier tokens, prompt and generated alike; the tokens that followed their
latest earlier occurrence are the draft. Agent and code-editing loads quote their context back
(a file rewritten with small changes, a tool output cited), which is where this pays.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["NgramIndex"]


class NgramIndex:
    """Where each n-gram of one growing token list last occurred, indexed as the list grows
    (each position is indexed once: a step costs what it appends, not the whole list)."""

    def __init__(self, max_n: int = 4, min_n: int = 2):
        self.sizes = tuple(range(max_n, min_n - 1, -1))
        # n -> n-gram -> the position right after its latest occurrence (its continuation).
        self._next: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in self.sizes}
        self._upto = 0  # continuations below this position are indexed

    def draft(self, tokens: Sequence[int], k: int) -> list[int]:
        """At most ``k`` tokens that followed the latest earlier occurrence of the longest
        suffix of ``tokens`` found; ``[]`` when none recurs."""
        end = len(tokens)
        # Index every n-gram whose continuation exists (ends before the last token), so the
        # suffix never finds itself.
        for e in range(max(self._upto, 1), end):
            for n, table in self._next.items():
                if e >= n:
                    table[tuple(tokens[e - n : e])] = e
        self._upto = max(self._upto, end)
        if k < 1:
            return []
        for n in self.sizes:
            if end < n:
                continue
            at = self._next[n].get(tuple(tokens[end - n :]))
            if at is not None:
                return list(tokens[at : at + k])
        return []
