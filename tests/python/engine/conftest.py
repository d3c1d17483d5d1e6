"""The two real GGUF models on the native engine, each opened once per session (a memory map:
opening costs milliseconds), beside the float32 transformers models of the top-level conftest."""

import os

import pytest
from offgraph_kv.gguf_model import GgufModel
from offgraph_kv.serve.loading import resolve


def _path(name: str) -> str:
    where, gguf, _ = resolve(name)
    assert gguf is not None
    return os.path.join(where, gguf)


@pytest.fixture(scope="session")
def gemma_gguf_path() -> str:
    return _path("gemma-3-270m")


@pytest.fixture(scope="session")
def smollm2_gguf_path() -> str:
    return _path("smollm2-135m")


@pytest.fixture(scope="session")
def gemma_engine(gemma_gguf_path: str) -> GgufModel:
    return GgufModel(gemma_gguf_path, threads=2)


@pytest.fixture(scope="session")
def smollm2_engine(smollm2_gguf_path: str) -> GgufModel:
    return GgufModel(smollm2_gguf_path, threads=2)
