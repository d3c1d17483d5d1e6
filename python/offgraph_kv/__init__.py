"""offgraph-kv: an off-graph KV cache for LLM inference.

The cache lives outside the model's compute graph, owned by the runtime:
bookkeeping (:class:`SequenceCache`, :class:`CellCache`), K/V pools
(:class:`KvSequenceCache`, :class:`KvCellCache`) and pooled attention
(:func:`attend`). Import as ``import offgraph_kv as okv``.
"""

from __future__ import annotations

from . import registry
from ._errors import (
    BackendError,
    CacheError,
    CapacityError,
    ConfigError,
    DTypeError,
    InvalidArgumentError,
    KeyExistsError,
    NotFoundError,
    ShapeError,
    StepError,
    UnknownSequenceError,
)
from ._native import (
    AttendSpec,
    CacheConfig,
    Flat,
    KvSequenceCache,
    LayerConfig,
    Ring,
    SeqStepPlan,
    SequenceCache,
    SequenceControl,
    SequencePlanner,
    __version__,
)
from .registry import CacheSession

__all__ = [
    "AttendSpec",
    "BackendError",
    "CacheConfig",
    "CacheError",
    "CacheSession",
    "CapacityError",
    "ConfigError",
    "DTypeError",
    "Flat",
    "InvalidArgumentError",
    "KeyExistsError",
    "KvSequenceCache",
    "LayerConfig",
    "NotFoundError",
    "Ring",
    "SeqStepPlan",
    "SequenceCache",
    "SequenceControl",
    "SequencePlanner",
    "ShapeError",
    "StepError",
    "UnknownSequenceError",
    "__version__",
    "registry",
]
