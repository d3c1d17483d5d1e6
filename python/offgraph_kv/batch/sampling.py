"""Choosing a request's next token from its logits row.

Greedy (``temperature == 0``) takes the argmax; ``temperature > 0`` samples with top-p
filtering from the request's own random source, seeded by its ``seed`` (so a seeded request
repeats whatever it is batched with). A transformers model's requests draw from a
``torch.Generator`` (as they always did); the native engine's from a numpy ``Generator``, so
that its path never imports torch (torch alone is ~490 MB resident).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["sample", "sampler_for"]


def sampler_for(temperature: float, seed: int | None, numpy: bool = False) -> Any:
    """The random source of a request: ``None`` for greedy, else a generator seeded by
    ``seed`` (fresh entropy when ``seed`` is ``None``): numpy's with ``numpy``, else torch's."""
    if temperature <= 0:
        return None
    if numpy:
        return np.random.default_rng(None if seed is None else int(seed))
    import torch

    gen = torch.Generator()
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(int(seed))
    return gen


def sample(logits: Any, temperature: float, top_p: float, generator: Any) -> int:
    """The next token from one row of logits (a torch tensor or a numpy array, ``[vocab]``)."""
    if isinstance(logits, np.ndarray) and (
        generator is None or isinstance(generator, np.random.Generator)
    ):
        return _sample_numpy(logits, temperature, top_p, generator)
    import torch

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


def _sample_numpy(row: np.ndarray, temperature: float, top_p: float, rng: Any) -> int:
    # argmax takes the first of equal maxima, as torch.argmax does.
    if temperature == 0 or rng is None:
        return int(np.argmax(row))
    z = row.astype(np.float64) / temperature
    p = np.exp(z - z.max())
    order = None
    if top_p < 1.0:
        order = np.argsort(-p, kind="stable")  # ties keep the lower id first
        p = p[order]
        cum = np.cumsum(p)
        p[cum - p >= top_p * cum[-1]] = 0.0  # keep the smallest head reaching top_p
    cdf = np.cumsum(p)
    i = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    i = min(i, len(p) - 1)
    return int(order[i]) if order is not None else i
