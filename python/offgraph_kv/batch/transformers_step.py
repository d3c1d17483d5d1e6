"""The model step of a transformers causal LM: :class:`TransformersStep`.

Every decoder layer writes into the generator's :class:`~offgraph_kv.KvCellCache`
(``full_attention`` layers flat, ``sliding_attention`` layers ``Ring(sliding_window)``). A step
is one model forward over the flattened tokens of every active request (batch dimension 1),
each token with its own position (``position_ids``), so RoPE gives every request its own
positions. The generator has placed the tokens with ``kc.begin_step(seq_ids, positions)``; each
layer's ``update`` (:class:`_CellLayer`) writes K/V to the tokens' cells and returns the step's
spec, whose mask is per token, in position space. Attention is :func:`offgraph_kv.attend` on
that spec, registered as the attention implementation :data:`CELL_ATTN_NAME`; the model is
switched to it only for the duration of a forward. No padding, no dense ``[T, n_cells]`` mask.
Only the rows that sample are computed by the head (``logits_to_keep``).

An attention-logit softcap (Gemma 2) or attention sinks are refused (:class:`NotImplementedError`):
the kernel has neither; Gemma 3 and Llama-family models use neither.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from transformers.cache_utils import Cache, CacheLayerMixin, get_layer_types_and_kwargs

from .. import _native as _okv
from .step_args import Cells, Ids

__all__ = ["CELL_ATTN_NAME", "TransformersStep", "cell_attention", "register_cell_attention"]

CELL_ATTN_NAME = "offgraph_cells"
"""The ``attn_implementation`` name under which :func:`cell_attention` is registered."""

_SPEC_ATTR = "_offgraph_cell_spec"


def cell_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention of one cell-cache step: ``attend(q, spec)`` on the spec ``key`` carries.

    ``attention_mask`` is ``None``: transformers builds no mask for an attention name without a
    registered mask function, and the spec's per-token mask is the truth. Returns
    ``[1, T, n_q_heads, head_dim]``.
    """
    spec = getattr(key, _SPEC_ATTR, None)
    if spec is None:
        raise RuntimeError(
            f"attn_implementation {CELL_ATTN_NAME!r} only serves BatchGenerator steps"
        )
    if kwargs.get("softcap") is not None or kwargs.get("sinks") is not None:
        raise NotImplementedError("cell attention has no softcap or attention sinks")
    q = query[0].detach().to(torch.float32).contiguous()
    out = _okv.attend(q.numpy(), spec, scale=scaling, threads=torch.get_num_threads())
    out = torch.from_numpy(out).transpose(0, 1).unsqueeze(0)
    return out.to(query.dtype).contiguous(), None


def register_cell_attention(name: str = CELL_ATTN_NAME) -> None:
    """Register :func:`cell_attention` (idempotent). No mask function is registered on purpose:
    without one transformers skips building masks, which a cell step does not use."""
    from transformers import AttentionInterface

    AttentionInterface.register(name, cell_attention)


register_cell_attention()


class _CellLayer(CacheLayerMixin):
    """One decoder layer's face of the shared KvCellCache during a step."""

    is_compileable = False
    is_sliding = False

    def __init__(self, kc: _okv.KvCellCache, index: int, sliding: bool):
        super().__init__()
        self.kc = kc
        self.index = index
        self.is_sliding = sliding
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        pass

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        k = key_states[0].detach().to(torch.float32).contiguous()
        v = value_states[0].detach().to(torch.float32).contiguous()
        spec = self.kc.update(self.index, k.numpy(), v.numpy())
        setattr(key_states, _SPEC_ATTR, spec)
        return key_states, value_states

    def get_mask_sizes(self, query: Any, *args: Any) -> tuple[int, int]:
        n = int(query.shape[0]) if isinstance(query, torch.Tensor) else int(query)
        return n, 0

    def get_seq_length(self, *args: Any) -> int:
        return 0

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        pass


class _CellStepCache(Cache):
    """The ``past_key_values`` of a step: layer ``update`` writes to the KvCellCache."""

    def __init__(self, kc: _okv.KvCellCache, sliding: Sequence[bool]):
        super().__init__(layers=[_CellLayer(kc, i, s) for i, s in enumerate(sliding)])


def layer_configs_of(config: Any) -> list[_okv.LayerConfig]:
    """One :class:`~offgraph_kv.LayerConfig` per decoder layer of a transformers ``config``:
    ``full_attention`` flat, ``sliding_attention`` ``Ring(sliding_window)``."""
    text = config.get_text_config(decoder=True)
    if getattr(text, "attn_logit_softcapping", None) is not None:
        raise NotImplementedError(
            "BatchGenerator: the model uses an attention-logit softcap, which offgraph-kv's "
            "attention kernel does not implement"
        )
    heads = int(text.num_attention_heads)
    kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // heads)
    layer_types, kwargs = get_layer_types_and_kwargs(text)
    out = []
    for i, (kind, kw) in enumerate(zip(layer_types, kwargs)):
        if kind == "full_attention":
            policy = _okv.Flat()
        elif kind == "sliding_attention":
            policy = _okv.Ring(window=int(kw["sliding_window"]))
        else:
            raise NotImplementedError(f"BatchGenerator: layer {i} has unsupported type {kind!r}")
        out.append(_okv.LayerConfig(policy, kv_heads, head_dim))
    return out


def _eos_ids(model: Any, text: Any) -> list[int]:
    gen_cfg = getattr(model, "generation_config", None)
    eos = getattr(gen_cfg, "eos_token_id", None)
    if eos is None:
        eos = getattr(text, "eos_token_id", None)
    if eos is None:
        return []
    return [int(eos)] if isinstance(eos, int) else [int(t) for t in eos]


class TransformersStep:
    """A transformers causal LM (on the CPU) as a :class:`~offgraph_kv.batch.ModelStep`.

    ``forward_cells`` switches ``model.config._attn_implementation`` to :data:`CELL_ATTN_NAME`
    for the duration of its forward and restores it after: do not run the same model from
    another thread while a step runs.
    """

    def __init__(self, model: Any):
        self.model = model
        self.config = model.config.get_text_config(decoder=True)
        self._layers = layer_configs_of(model.config)
        self.vocab_size = int(self.config.vocab_size)
        self.max_positions = int(getattr(self.config, "max_position_embeddings", 0) or 1 << 20)
        self.eos_token_ids = _eos_ids(model, self.config)
        self._sliding = [isinstance(lc.policy, _okv.Ring) for lc in self._layers]
        self._past: tuple[Any, _CellStepCache] | None = None  # (kc, its step cache)

    def layer_configs(self) -> list[_okv.LayerConfig]:
        return list(self._layers)

    def forward_cells(self, kc: Cells, tokens: Ids, positions: Ids, rows: Ids) -> np.ndarray:
        if self._past is None or self._past[0] is not kc:
            self._past = (kc, _CellStepCache(kc, self._sliding))
        ids = torch.tensor([tokens], dtype=torch.long)
        pos = torch.tensor([positions], dtype=torch.long)
        keep = torch.tensor(rows, dtype=torch.long)
        with torch.inference_mode(), self._attention():
            out = self.model(
                input_ids=ids,
                position_ids=pos,
                cache=self._past[1],
                use_cache=True,
                logits_to_keep=keep,
            )
        return out.logits[0].to(torch.float32).numpy()

    @contextlib.contextmanager
    def _attention(self) -> Iterator[None]:
        """The model's attention is :func:`cell_attention` for the duration of a forward."""
        configs = {id(c): c for c in (self.model.config, self.config)}.values()
        saved = [(c, c._attn_implementation) for c in configs]
        try:
            for c in configs:
                c._attn_implementation = CELL_ATTN_NAME
            yield
        finally:
            for c, name in saved:
                c._attn_implementation = name
