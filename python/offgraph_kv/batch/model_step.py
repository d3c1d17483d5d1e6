"""The model step: the one interface :class:`~offgraph_kv.batch.BatchGenerator` runs a model by.

A new model backend implements :class:`ModelStep`; nothing in the scheduler changes. Two
implementations exist:

* :class:`~offgraph_kv.batch.transformers_step.TransformersStep`: a transformers causal LM, its
  layers writing into the cache through a ``past_key_values`` and its attention switched to
  the cell kernel for the forward;
* :class:`CellsModel`: any model object that already has ``forward_cells`` (the native engine's
  ``offgraph_kv.gguf_model.GgufModel``), checked once at construction and at each step's output.

:func:`model_step` picks one for a model object (``BatchGenerator`` calls it).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

from .. import _native as _okv
from .._errors import ConfigError, DTypeError, ShapeError
from .step_args import Cells, Ids

__all__ = ["CellsModel", "ModelStep", "model_step"]


@runtime_checkable
class ModelStep(Protocol):
    """What a generator needs of a model: its cache layout, its limits and one step's forward.

    The generator builds one :class:`~offgraph_kv.KvCellCache` from :meth:`layer_configs`,
    opens each step with ``kc.begin_step(seq_ids, positions)`` (one entry per token, the
    sequences' tokens flattened in one batch) and then calls :meth:`forward_cells` once; the
    forward writes every layer's K/V of those tokens into ``kc`` (``kc.update(layer, k, v)``,
    layer order) and attends over the specs it returns. A forward that raises leaves the
    step's tokens unheld: the generator rewinds each sequence to what it held before.
    """

    @property
    def vocab_size(self) -> int:
        """Logits per row; prompt tokens must be below it."""
        ...

    @property
    def max_positions(self) -> int:
        """The context length: a request's prompt plus new tokens may not exceed it."""
        ...

    @property
    def eos_token_ids(self) -> list[int]:
        """The model's end-of-sequence tokens (a caller passes them as ``eos_token_id``; the
        generator stops a request only at the tokens the request names)."""
        ...

    def layer_configs(self) -> list[_okv.LayerConfig]:
        """One :class:`~offgraph_kv.LayerConfig` per layer (``Flat()`` or ``Ring(window)``,
        KV heads, head dim), in layer order."""
        ...

    def forward_cells(self, kc: Cells, tokens: Ids, positions: Ids, rows: Ids) -> Any:
        """One forward over the open step's ``tokens`` at ``positions``; returns float32
        logits ``[len(rows), vocab_size]`` of the tokens at indices ``rows`` (the last token of
        each sequence that samples this step), in ``rows`` order."""
        ...


class CellsModel:
    """A model object that has ``forward_cells`` (the native engine's model) as a
    :class:`ModelStep`: its attributes read and checked once, its logits checked every step
    (a float32 array ``[len(rows), vocab_size]``, else a typed error naming what came back)."""

    def __init__(self, model: Any):
        self.model = model
        layers = list(model.layer_configs())
        if not layers or not all(isinstance(lc, _okv.LayerConfig) for lc in layers):
            raise ConfigError(
                f"{type(model).__name__}.layer_configs(): expected a non-empty list of "
                f"offgraph_kv.LayerConfig, got {layers!r}"
            )
        self._layers = layers
        self.vocab_size = _positive(model, "vocab_size")
        self.max_positions = _positive(model, "max_positions")
        try:
            self.eos_token_ids = [int(t) for t in model.eos_token_ids]
        except (TypeError, ValueError) as e:
            raise ConfigError(
                f"{type(model).__name__}.eos_token_ids: expected token ids, got {e}"
            ) from e

    def layer_configs(self) -> list[_okv.LayerConfig]:
        return list(self._layers)

    def forward_cells(self, kc: Cells, tokens: Ids, positions: Ids, rows: Ids) -> np.ndarray:
        out = self.model.forward_cells(kc, tokens, positions, rows)
        if not isinstance(out, np.ndarray) or out.dtype != np.float32:
            raise DTypeError(
                f"{type(self.model).__name__}.forward_cells: expected a float32 numpy array, "
                f"got {type(out).__name__} {getattr(out, 'dtype', '')}"
            )
        if out.shape != (len(rows), self.vocab_size):
            raise ShapeError(
                f"{type(self.model).__name__}.forward_cells: expected logits of shape "
                f"{(len(rows), self.vocab_size)}, got {out.shape}"
            )
        return out


def _positive(model: Any, name: str) -> int:
    value = getattr(model, name, None)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ConfigError(f"{type(model).__name__}.{name}: expected a positive int, got {value!r}")
    return int(value)


def model_step(model: Any) -> ModelStep:
    """The :class:`ModelStep` of ``model``: :class:`CellsModel` when it has ``forward_cells``,
    else a transformers causal LM (:class:`~offgraph_kv.batch.transformers_step.TransformersStep`,
    imported only then: the engine path does not need transformers)."""
    if callable(getattr(model, "forward_cells", None)):
        return CellsModel(model)
    from .transformers_step import TransformersStep

    return TransformersStep(model)
