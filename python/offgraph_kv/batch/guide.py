"""Constrained decoding's moving parts: the vocabulary llguidance reads (:func:`grammar_tokenizer`),
one request's matcher (:class:`Guide`), and the masks of a step (:class:`StepMasks`).

Each step, every constrained request that samples gets a bitmask of the tokens its grammar
allows next (one bit per token, llguidance's numpy layout); the request's own logits row (a
copy) has every other token set to ``-inf`` before greedy or sampling, so constrained and free
requests share one batch and a free request's row is never touched. The sampled token then
advances the matcher; once the grammar can take nothing more, the request stops
(``finish_reason`` ``"stop"``) without spending a step on an end token.

The masks depend only on the tokens generated so far, so they are computed on a thread while
the step's forward runs (llguidance releases the GIL): a step's mask cost hides behind the
forward rather than adding to it.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from .._errors import InvalidArgumentError
from .constraint import Constraint, require_llguidance

__all__ = ["Guide", "StepMasks", "allowed", "grammar_tokenizer", "masked"]


def grammar_tokenizer(tokenizer: Any, vocab_size: int, eos_ids: Sequence[int]) -> Any:
    """llguidance's ``LLTokenizer`` for ``tokenizer``: a GGUF tokenizer (``token_bytes``,
    ``is_special``, ``encode``; the native engine's) or a fast Hugging Face tokenizer.
    ``vocab_size`` is the logits' width (a model may pad past the tokenizer's ids); a request
    may end on any of ``eos_ids``. Built once per generator (~0.4 s at 49K tokens, ~3 s at
    262K)."""
    llg = require_llguidance()
    eos = sorted({int(i) for i in eos_ids})
    if hasattr(tokenizer, "token_bytes") and hasattr(tokenizer, "is_special"):
        return llg.LLTokenizer(
            llg.TokenizerWrapper(_GgufVocab(tokenizer, eos)),
            n_vocab=vocab_size,
            eos_token=eos or None,
        )
    if hasattr(tokenizer, "backend_tokenizer"):
        from llguidance.hf import from_tokenizer

        return from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=eos or None)
    raise InvalidArgumentError(
        "constraint: this generator has no tokenizer to compile grammars against; pass "
        "BatchGenerator(..., tokenizer=...) (a GGUF tokenizer or a fast Hugging Face one)"
    )


class _GgufVocab:
    """A GGUF tokenizer as llguidance's ``TokenizerWrapper`` reads one: every token's bytes
    (special tokens marked with a leading 0xFF byte, llguidance's convention, so no text ever
    spells them), the end tokens, and an encoder of text (no BOS)."""

    def __init__(self, tok: Any, eos: list[int]):
        n = int(tok.vocab_size)
        self.tokens = [
            (b"\xff" if tok.is_special(i) else b"") + tok.token_bytes(i) for i in range(n)
        ]
        self.eos_token_id = eos[0] if eos else tok.eos_token_id
        self.bos_token_id = tok.bos_token_id
        self.special_token_ids: list[int] = []  # marked in `tokens` already
        self._tok = tok

    def __call__(self, text: str) -> list[int]:
        return list(self._tok.encode(text, False))


class Guide:
    """One request's grammar state: the next-token mask, advanced by each sampled token."""

    def __init__(self, ll_tokenizer: Any, constraint: Constraint):
        llg = require_llguidance()
        self.constraint = constraint
        self.matcher = llg.LLMatcher(ll_tokenizer, constraint.grammar, log_level=0)
        if self.matcher.is_error():
            raise InvalidArgumentError(f"constraint: {self.matcher.get_error()}")

    def fill(self, row: np.ndarray) -> None:
        """Write the allowed next tokens into ``row`` (int32 words, one bit per token)."""
        self.matcher.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)

    def advance(self, token: int) -> bool:
        """Take the sampled ``token``; ``True`` once the output is complete (the grammar takes
        nothing more, or it took an end token) or the matcher failed."""
        ok = self.matcher.consume_token(int(token))
        return not ok or self.matcher.is_stopped()


def allowed(mask: np.ndarray, vocab_size: int) -> np.ndarray:
    """A bool per token of one mask row: whether the grammar allows it next."""
    return np.unpackbits(mask.view(np.uint8), bitorder="little")[:vocab_size].view(bool)


def masked(logits: Any, mask: np.ndarray) -> np.ndarray:
    """A float32 copy of one logits row (numpy or torch) with every token ``mask`` does not
    allow at ``-inf``. A grammar's structure allows few tokens: those are gathered into a row
    of ``-inf`` (at 262K tokens ~4x cheaper than writing ``-inf`` over the rest)."""
    x = logits.detach().float().cpu().numpy() if hasattr(logits, "detach") else logits
    n = x.shape[0]
    ok = allowed(mask, n)
    ids = np.flatnonzero(ok)
    if ids.size * 4 < n:
        out = np.full(n, -np.inf, dtype=np.float32)
        out[ids] = x[ids]
        return out
    out = np.array(x, dtype=np.float32)
    out[~ok] = -np.inf
    return out


class StepMasks:
    """The masks of one step's constrained requests, computed on a worker thread (``start``
    before the forward, ``rows`` after it) or inline (``overlap=False``)."""

    def __init__(self, vocab_size: int, overlap: bool = True):
        self.vocab_size = vocab_size
        self.words = (vocab_size + 31) // 32
        self.overlap = overlap
        self._pool: ThreadPoolExecutor | None = None
        self._pending: Future | None = None
        self._ready: np.ndarray | None = None

    def start(self, guides: list[Guide]) -> None:
        """Begin computing one mask per guide (in order)."""
        self._pending = self._ready = None
        if not guides:
            return
        if not self.overlap:
            self._ready = self._compute(guides)
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="offgraph-kv-masks")
        self._pending = self._pool.submit(self._compute, guides)

    def rows(self) -> np.ndarray | None:
        """The masks ``start`` began (``[guides, words]`` int32), waiting for them if needed."""
        if self._pending is not None:
            self._ready, self._pending = self._pending.result(), None
        out, self._ready = self._ready, None
        return out

    def _compute(self, guides: list[Guide]) -> np.ndarray:
        masks = np.zeros((len(guides), self.words), dtype=np.int32)
        for i, g in enumerate(guides):
            g.fill(masks[i])
        return masks
