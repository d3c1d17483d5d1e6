"""Continuous batching over one :class:`~offgraph_kv.KvCellCache`: :class:`BatchGenerator`.

Usage::

    from offgraph_kv.hf import BatchGenerator      # or: from offgraph_kv.batch import ...

    gen = BatchGenerator(model, n_cells=8192, max_batch_tokens=512)
    outs = gen.generate([ids_a, ids_b, ids_c], max_new_tokens=32)   # greedy
    # or drive it yourself: requests join and leave at any step
    rid = gen.add(ids, max_new_tokens=64, eos_token_id=1, temperature=0.7, top_p=0.9, seed=3)
    while gen.has_work:
        for rid, token in gen.step():
            ...
    # logprobs=k (0..20): each token's logprob and its step's top k, taken as they come
    rid = gen.add(ids, max_new_tokens=8, logprobs=5)
    gen.step(); gen.take_logprobs(rid)   # [LogprobEntry(token, logprob, top=[(id, lp), ...])]
    # constrained decoding (llguidance): a JSON schema, any JSON object, a regex, a Lark grammar
    rid = gen.add(ids, max_new_tokens=64, constraint=Constraint.json_schema(schema))

One cache, one forward per step: every layer of the model writes into one cell cache (flat
layers and ``Ring(window)`` layers); a step is one forward over the flattened tokens of every
active request, decode tokens and prefill chunks together, each token at its own position.

Where each part lives (what to change for what):

* :mod:`.generator`: :class:`BatchGenerator`, the lock and the step loop (plan, forward,
  sample, account), cancelling across threads, stats.
* :mod:`.scheduler`: a scheduling change: which tokens a step carries, admission, forks of
  held prefixes (the prefix index), eviction of cached sequences, the prefix store's use.
* :mod:`.model_step`: a new model backend: the :class:`ModelStep` protocol (layer configs,
  vocab size, context length, eos tokens, ``forward_cells``) and :class:`CellsModel`, the
  adapter for a model object that has ``forward_cells`` (the native engine's).
* :mod:`.transformers_step`: the transformers implementation (the cell attention function
  registered as :data:`CELL_ATTN_NAME`, the per-layer cache faces, ``logits_to_keep``);
  imported only for a transformers model.
* :mod:`.sampling`: greedy, temperature and top-p from a per-request seeded generator; the
  logprob entries (``log_softmax`` of the raw logits row, top-k by ``argpartition``).
* :mod:`.requests`: a request's fields and checks, the table of requests by id.
* :mod:`.constraint`: :class:`Constraint`, what a constrained request may generate, checked
  when built; :mod:`.guide`: the grammar tokenizer, a request's matcher, a step's masks.
"""

from __future__ import annotations

from typing import Any

from .constraint import Constraint
from .generator import BatchGenerator
from .model_step import CellsModel, ModelStep, model_step

__all__ = [
    "CELL_ATTN_NAME",
    "BatchGenerator",
    "CellsModel",
    "Constraint",
    "ModelStep",
    "cell_attention",
    "model_step",
    "register_cell_attention",
]

_TRANSFORMERS_NAMES = (
    "CELL_ATTN_NAME",
    "TransformersStep",
    "cell_attention",
    "register_cell_attention",
)


def __getattr__(name: str) -> Any:
    # The transformers step imports transformers: only when one of its names is asked for.
    if name in _TRANSFORMERS_NAMES:
        from . import transformers_step

        return getattr(transformers_step, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
