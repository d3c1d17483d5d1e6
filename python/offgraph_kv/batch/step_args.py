"""The argument types of one model step (:meth:`~offgraph_kv.batch.ModelStep.forward_cells`),
shared by the protocol and its implementations."""

from __future__ import annotations

from .. import _native as _okv

__all__ = ["Cells", "Ids"]

Cells = _okv.KvCellCache
"""The cache a model step writes into."""
Ids = list[int]
"""Token ids, positions or row indices of one step, flattened over its sequences."""
