"""Choosing a request's next token from its logits row.

Greedy (``temperature == 0``) takes the argmax; ``temperature > 0`` samples with top-p
filtering from the request's own ``torch.Generator``, seeded by its ``seed`` (so a seeded
request repeats whatever it is batched with).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["sample", "sampler_for"]


def sampler_for(temperature: float, seed: int | None) -> torch.Generator | None:
    """The random source of a request: ``None`` for greedy, else a generator seeded by
    ``seed`` (fresh entropy when ``seed`` is ``None``)."""
    if temperature <= 0:
        return None
    gen = torch.Generator()
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(int(seed))
    return gen


def sample(logits: Any, temperature: float, top_p: float, generator: torch.Generator | None) -> int:
    """The next token from one row of logits (a torch tensor or a numpy array, ``[vocab]``)."""
    row = torch.as_tensor(logits)
    if temperature == 0:
        return int(torch.argmax(row))
    probs = torch.softmax(row / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        cum = torch.cumsum(sorted_p, dim=-1)
        drop = cum - sorted_p >= top_p  # keep the smallest head reaching top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(0, order, sorted_p)
    return int(torch.multinomial(probs, 1, generator=generator))
