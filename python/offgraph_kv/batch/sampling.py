"""Choosing a request's next token from its logits row, and the logprobs a request may ask for.

Greedy (``temperature == 0``) takes the argmax; ``temperature > 0`` samples with top-p
filtering from the request's own random source, seeded by its ``seed`` (so a seeded request
repeats whatever it is batched with). A transformers model's requests draw from a
``torch.Generator`` (as they always did); the native engine's from a numpy ``Generator``, so
that its path never imports torch (torch alone is ~490 MB resident).

A request's ``logit_bias`` and ``frequency_penalty`` / ``presence_penalty`` adjust a copy of
its row before greedy's argmax or temperature and top-p (:func:`adjusted`, OpenAI's formula:
``logits[j] += bias[j] - c[j] * frequency_penalty - (c[j] > 0) * presence_penalty``, ``c[j]``
the times token ``j`` was generated so far by that request; the prompt does not count).

Logprobs (:func:`logprob_entry`) are ``log_softmax`` of the raw logits row the token was
sampled from: the model's own distribution, before bias, penalties, temperature and top-p, as
OpenAI's API and vLLM report them. A sampled token's logprob is therefore not the probability
it was drawn with when any of those changed the row.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "MAX_LOGPROBS",
    "LogprobEntry",
    "adjusted",
    "logprob_entry",
    "sample",
    "sampler_for",
]

MAX_LOGPROBS = 20
"""Most top alternatives a request may ask for per token (OpenAI's chat limit)."""


class LogprobEntry(NamedTuple):
    """One generated token's logprob and the ``k`` most likely tokens at its step, most likely
    first (ties: the lower id first), each ``(token, logprob)``."""

    token: int
    logprob: float
    top: list[tuple[int, float]]


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


def adjusted(
    logits: Any,
    bias: tuple[np.ndarray, np.ndarray] | None,
    counts: dict[int, int],
    frequency_penalty: float,
    presence_penalty: float,
) -> np.ndarray:
    """A float32 copy of one row of logits (torch or numpy, ``[vocab]``) with ``bias`` (token
    ids, their biases) added and the penalties subtracted for the tokens in ``counts`` (token ->
    times generated). The raw row is left as it is: logprobs are the model's."""
    row = logits.detach().float().cpu().numpy() if hasattr(logits, "detach") else logits
    x = np.array(row, dtype=np.float32)  # a copy: the forward's buffer stays the model's
    if counts and (frequency_penalty or presence_penalty):
        ids = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
        c = np.fromiter(counts.values(), dtype=np.float32, count=len(counts))
        x[ids] -= c * np.float32(frequency_penalty) + np.float32(presence_penalty)
    if bias is not None:
        x[bias[0]] += bias[1]
    return x


def logprob_entry(logits: Any, token: int, k: int) -> LogprobEntry:
    """``token``'s logprob and the top ``k`` under ``log_softmax(logits)`` (one row ``[vocab]``,
    a torch tensor or a numpy array). The exponentials in float32 (vectorized; a 262K
    vocabulary's row costs ~1 ms), their sum and the log in float64; the top ``k`` by
    ``argpartition`` (linear in the vocabulary), only those ``k`` sorted."""
    row = logits.detach().cpu().numpy() if hasattr(logits, "detach") else logits  # torch
    x = np.asarray(row, dtype=np.float32)
    peak = float(x.max())
    lse = peak + math.log(float(np.exp(x - np.float32(peak)).sum(dtype=np.float64)))
    top: list[tuple[int, float]] = []
    if k > 0:
        k = min(k, x.shape[0])
        idx = np.argpartition(x, x.shape[0] - k)[x.shape[0] - k :]
        idx = idx[np.lexsort((idx, -x[idx]))]  # by logit descending, then by id
        top = [(int(i), float(x[i]) - lse) for i in idx]
    return LogprobEntry(int(token), float(x[token]) - lse, top)


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
