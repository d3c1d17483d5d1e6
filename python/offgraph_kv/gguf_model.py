"""The native engine from Python: GGUF models run in Rust over the cache, weights as the file
stores them (no torch, no float32 copy of the weights).

```python
from offgraph_kv.gguf_model import GgufModel
m = GgufModel("model.gguf", threads=None)
ids = m.tokenizer.encode("Hello")           # the GGUF's own tokenizer (BOS where the model wants)
m.logits(ids)                               # float32 [len(ids), vocab], one sequence
gen = BatchGenerator(m, n_cells=4096)       # the same generator as over a transformers model
```

`forward_cells` is the model step the generator drives: the generator opens the cell step
(`kc.begin_step(seq_ids, positions)`), the engine writes every layer's K/V into the pools and
attends through `okv.attend`'s kernels, with the GIL released.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import _native
from ._errors import EngineError
from ._native import Flat, KvCellCache, LayerConfig, Ring


def family_chat_defaults(name: str | None = None) -> tuple[tuple[str, ...], str | None]:
    """``(turn-end pieces, default chat template)`` of the engine's family that an architecture
    or Hugging Face ``model_type`` names; for ``None`` or an unknown name every family's turn
    ends and no template (a model the engine does not run, such as one on the torch path)."""
    ends, template = _native.GgufModelCore.family_chat_defaults(name)
    return tuple(ends), template


class GgufTokenizer:
    """The tokenizer a GGUF file carries (built from its metadata; no ``tokenizer.json``). Ids
    equal the model's Hugging Face tokenizer's."""

    def __init__(
        self, core: Any, turn_ends: Sequence[str] = (), default_chat_template: str | None = None
    ):
        self._core = core
        self.turn_ends = tuple(turn_ends)
        """The model family's pieces that end an assistant turn."""
        self.default_chat_template = default_chat_template
        """The model family's chat template, for files that carry none."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Ids of ``text``; ``add_special_tokens`` adds BOS where the model expects one. Special
        tokens written in the text (``<start_of_turn>``) become their ids."""
        return self._core.encode(text, add_special_tokens)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self._core.decode(list(ids), skip_special_tokens)

    def token_bytes(self, token_id: int) -> bytes:
        """A token's raw bytes: a streaming decoder joins them and decodes whole characters."""
        return self._core.token_bytes(token_id)

    def token_to_id(self, piece: str) -> int | None:
        return self._core.token_to_id(piece)

    def is_special(self, token_id: int) -> bool:
        return self._core.is_special(token_id)

    @property
    def vocab_size(self) -> int:
        return self._core.vocab_size

    @property
    def bos_token_id(self) -> int | None:
        return self._core.bos_token_id

    @property
    def eos_token_id(self) -> int | None:
        return self._core.eos_token_id

    @property
    def chat_template(self) -> str | None:
        """The template string the file stores (Jinja), or None (the Gemma 3 GGUF has none)."""
        return self._core.chat_template


class GgufModel:
    """A GGUF model (Llama family, Gemma 3) on the native engine.

    Args:
        path: the ``.gguf`` file (memory-mapped; tensors read in place).
        threads: worker threads of the matmuls and attention (None: every core).

    Raises:
        EngineError: a file that is not a well-formed GGUF, or that the engine cannot run.
    """

    def __init__(self, path: str | os.PathLike[str], threads: int | None = None):
        self.path = os.fspath(path)
        self._core = _native.GgufModelCore(self.path, threads)
        self.tokenizer = GgufTokenizer(
            self._core.tokenizer, self._core.turn_ends, self._core.default_chat_template
        )
        self._digest: bytes | None = None

    def weights_digest(self) -> bytes:
        """SHA-256 of the file's header and a strided sample of every tensor's bytes (what a
        :class:`~offgraph_kv.store.PrefixStore` binds its keys to), computed once."""
        if self._digest is None:
            from .store.gguf_digest import gguf_digest

            self._digest = gguf_digest(self.path)
        return self._digest

    @property
    def threads(self) -> int:
        return self._core.threads

    @threads.setter
    def threads(self, n: int) -> None:
        self._core.threads = n

    @property
    def architecture(self) -> str:
        return self._core.architecture

    @property
    def vocab_size(self) -> int:
        return self._core.vocab_size

    @property
    def max_positions(self) -> int:
        """The context length the file declares."""
        return self._core.max_positions

    @property
    def chat_template(self) -> str | None:
        """The template string the file stores (Jinja), or None."""
        return self.tokenizer.chat_template

    @property
    def default_chat_template(self) -> str | None:
        """The model family's chat template, for files that carry none (Gemma 3's)."""
        return self._core.default_chat_template

    @property
    def turn_ends(self) -> tuple[str, ...]:
        """The model family's pieces that end an assistant turn."""
        return tuple(self._core.turn_ends)

    @property
    def eos_token_ids(self) -> list[int]:
        """Ids that end a generation: eos and the family's end-of-turn pieces."""
        ids = [self.tokenizer.eos_token_id]
        ids += [self.tokenizer.token_to_id(p) for p in self.turn_ends]
        return sorted({i for i in ids if i is not None})

    def layer_configs(self) -> list[LayerConfig]:
        """One :class:`LayerConfig` per layer: sliding layers ``Ring(window)``, full ``Flat``."""
        return [
            LayerConfig(Flat() if w is None else Ring(window=w), heads, dim)
            for w, heads, dim in self._core.layers()
        ]

    def forward_cells(
        self,
        kc: KvCellCache,
        tokens: Sequence[int],
        positions: Sequence[int],
        rows: Sequence[int],
    ) -> np.ndarray:
        """Logits float32 ``[len(rows), vocab]`` for the step ``kc`` has open: the caller ran
        ``kc.begin_step(seq_ids, positions)`` with one entry per token."""
        return self._core.forward_cells(kc, list(tokens), list(positions), list(rows))

    def generate(
        self,
        ids: Sequence[int],
        max_new_tokens: int,
        eos_token_id: int | Sequence[int] | None = None,
        speculative: Any = None,
        kv_dtype: str | None = None,
        **sampling: Any,
    ) -> list[int]:
        """One sequence's generated tokens (ending with the eos token that stopped it), through
        a :class:`~offgraph_kv.batch.BatchGenerator` sized for it. ``eos_token_id``: ``None``
        stops at :attr:`eos_token_ids`; ``speculative``: ``"ngram"``, a draft model or
        ``.gguf`` path (see the generator's); ``sampling``: ``temperature``, ``top_p``,
        ``seed`` and the other arguments of ``BatchGenerator.add``."""
        from .batch import BatchGenerator

        cells = max(64, len(ids) + int(max_new_tokens))
        gen = BatchGenerator(
            self, n_cells=cells, n_seq_max=4, kv_dtype=kv_dtype, speculative=speculative
        )
        eos = self.eos_token_ids if eos_token_id is None else eos_token_id
        return gen.generate([ids], max_new_tokens, eos_token_id=eos, **sampling)[0]

    def logits(self, ids: Sequence[int], kv_dtype: str | None = None) -> np.ndarray:
        """Logits float32 ``[len(ids), vocab]`` of one sequence from position 0 (a private
        cache, pools in ``kv_dtype``)."""
        return self._core.logits(list(ids), kv_dtype)

    def __repr__(self) -> str:
        arch, threads = self.architecture, self.threads
        return f"GgufModel({self.path!r}, architecture={arch!r}, threads={threads})"


__all__ = ["EngineError", "GgufModel", "GgufTokenizer"]
