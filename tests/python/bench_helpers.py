"""The scripts under ``benches/`` as modules, for the tests that run their quick forms."""

from __future__ import annotations

import importlib.util
import pathlib
from types import ModuleType

BENCHES = pathlib.Path(__file__).resolve().parents[2] / "benches"


def load_bench(name: str) -> ModuleType:
    """``benches/<name>.py``, executed as a fresh module named ``name``."""
    spec = importlib.util.spec_from_file_location(name, BENCHES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
