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
    EngineError,
    InvalidArgumentError,
    KeyExistsError,
    NotFoundError,
    ShapeError,
    SnapshotError,
    StepError,
    UnknownSequenceError,
)
from ._native import (
    AttendSpec,
    CacheConfig,
    CellCache,
    CellControl,
    CellPlanner,
    CellStepPlan,
    Flat,
    KvCellCache,
    KvSequenceCache,
    LayerConfig,
    Ring,
    SeqStepPlan,
    SequenceCache,
    SequenceControl,
    SequencePlanner,
    __version__,
    attend,
    cells_for_forks,
    dequantize,
    first_visible,
    ring_keep,
    snapshot_info,
)
from .registry import CacheSession

__all__ = [
    "AttendSpec",
    "BackendError",
    "CacheConfig",
    "CacheError",
    "CacheSession",
    "CapacityError",
    "CellCache",
    "CellControl",
    "CellPlanner",
    "CellStepPlan",
    "ConfigError",
    "DTypeError",
    "EngineError",
    "Flat",
    "InvalidArgumentError",
    "KeyExistsError",
    "KvCellCache",
    "KvSequenceCache",
    "LayerConfig",
    "NotFoundError",
    "Ring",
    "SeqStepPlan",
    "SequenceCache",
    "SequenceControl",
    "SequencePlanner",
    "ShapeError",
    "SnapshotError",
    "StepError",
    "UnknownSequenceError",
    "__version__",
    "attend",
    "cells_for_forks",
    "first_visible",
    "dequantize",
    "registry",
    "ring_keep",
    "snapshot_info",
]
