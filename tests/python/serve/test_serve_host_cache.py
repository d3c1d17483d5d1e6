"""``offgraph-kv serve --prefix-cache-bytes``: a prompt evicted from the cells comes back from the
host tier (cached tokens in the usage, the host cache counters in /metrics) and generates what
``model.generate`` does; the option's sizes and default."""

from __future__ import annotations

import argparse

import pytest
import torch
from model_helpers import reference, tiny_model
from offgraph_kv.serve.host_cache import DEFAULT_CAP, default_bytes, parse_size, resolve
from offgraph_kv.tools.cli import build_parser

from .serve_helpers import Server

SHAPE = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, head_dim=32)
SHAPE["max_position_embeddings"] = 2048


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", **SHAPE)


@pytest.fixture(scope="module")
def server(start_server, model, tmp_path_factory) -> Server:
    path = tmp_path_factory.mktemp("tiny-llama-host")
    model.save_pretrained(path)
    # 2,000 cells: two 1,300-token sessions do not fit at once.
    return start_server(str(path), "--n-cells", "2000", "--prefix-cache-bytes", "256M")


def prompt(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, 128, (n,), generator=g).tolist()


def complete(server: Server, ids: list[int], n: int) -> tuple[list[int], int]:
    name = server.client().models.list().data[0].id
    r = server.client().completions.create(model=name, prompt=ids, max_tokens=n, temperature=0)
    details = r.usage.prompt_tokens_details
    return [int(t) for t in r.choices[0].text.split()], details.cached_tokens if details else 0


def test_an_evicted_prompt_is_restored_from_the_host_tier(server, model):
    a, b = prompt(1300, 1), prompt(1300, 2)
    for p in (a, b):  # b evicts a's cached sequence: its chunks go to the tier
        out, cached = complete(server, p, 4)
        assert out == reference(model, p, 4)[0] and cached == 0
    assert server.metric("offgraph_kv_host_cache_bytes") > 0
    assert server.metric("offgraph_kv_host_cache_hits_total") == 0
    follow = a[:1280] + prompt(10, 3)
    out, cached = complete(server, follow, 4)
    assert out == reference(model, follow, 4)[0]
    assert cached == 1280  # five 256-token chunks from the tier
    assert server.metric("offgraph_kv_host_cache_hits_total") == 1
    assert server.metric("offgraph_kv_host_cache_tokens_restored_total") == 1280
    assert server.metric("offgraph_kv_host_cache_evictions_total") == 0
    assert server.get("/health?audit=true")["audit"] == "ok"


def test_sizes_and_the_default():
    assert parse_size("512M") == 512 << 20 and parse_size("2G") == 2 << 30
    assert parse_size("1.5GiB") == 3 << 29 and parse_size("4096") == 4096
    assert parse_size("0") == 0 and parse_size("8k") == 8192
    for bad in ("", "-1", "2X", "1.5", "G", "1e9"):
        with pytest.raises(ValueError):
            parse_size(bad)
    assert default_bytes(4 << 30) == 1 << 30
    assert default_bytes(64 << 30) == DEFAULT_CAP
    assert default_bytes(0) == 0
    assert resolve(0) == 0 and resolve(123) == 123 and 0 <= resolve(None) <= DEFAULT_CAP
    p = build_parser()
    args = p.parse_args(["serve", "m", "--prefix-cache-bytes", "2G"])
    assert args.prefix_cache_bytes == 2 << 30
    assert p.parse_args(["serve", "m"]).prefix_cache_bytes is None
    with pytest.raises(SystemExit):
        p.parse_args(["serve", "m", "--prefix-cache-bytes", "lots"])
    assert isinstance(p, argparse.ArgumentParser)
