"""Kept so ``from offgraph_kv.engine import GgufModel`` (the name in the design document)
keeps working: the GGUF model classes live in :mod:`offgraph_kv.gguf_model`."""

from __future__ import annotations

from ._errors import EngineError
from .gguf_model import GgufModel, GgufTokenizer

__all__ = ["EngineError", "GgufModel", "GgufTokenizer"]
