"""The app's routes, in process (no model, no server thread): every route family registers itself
the same way and ``create_app`` adds exactly the routes of :data:`~offgraph_kv.serve.routes.
FAMILIES`, each defined in its family's module; the route modules import nothing from the app
that includes them; the API key and the error shape cover the routes as they did inline."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path
from types import SimpleNamespace

from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from offgraph_kv.serve import routes
from offgraph_kv.serve.app import create_app
from offgraph_kv.serve.metrics import Metrics
from offgraph_kv.serve.worker import RequestWorker

WANT = {
    ("/v1/completions", "POST"): "completions",
    ("/v1/chat/completions", "POST"): "completions",
    ("/tokenize", "POST"): "tokenize",
    ("/detokenize", "POST"): "tokenize",
    ("/v1/models", "GET"): "models",
    ("/health", "GET"): "health",
    ("/metrics", "GET"): "health",
    ("/v1/loads", "GET"): "replica",
    ("/get_load", "GET"): "replica",
    ("/server_info", "GET"): "replica",
    ("/get_server_info", "GET"): "replica",
    ("/model_info", "GET"): "replica",
    ("/get_model_info", "GET"): "replica",
    ("/health_generate", "GET"): "replica",
}
# What a router or a probe reads without the API key (unless ``--protect-metrics``).
KEYED = ("/v1/", "/tokenize", "/detokenize")
OPEN = {path for path, _ in WANT if not path.startswith(KEYED)}


def _gen() -> SimpleNamespace:
    """What the worker reads of a generator before it steps (it never starts here)."""
    stats = {
        "running": 0,
        "cells_used": 0,
        "cells_total": 64,
        "cached_sequences": 0,
        "prefix_tokens_reused": 0,
    }
    kc = SimpleNamespace(free_cells=64)
    return SimpleNamespace(
        stats=stats,
        _running=[],
        kc=kc,
        max_positions=64,
        vocab_size=32,
        n_cells=64,
        n_seq_max=4,
        max_prefill_tokens=64,
        model=SimpleNamespace(architecture="llama"),
    )


def _app(api_key: str | None = None):
    return create_app(RequestWorker(_gen(), Metrics()), None, "tiny", api_key=api_key)


def test_every_family_registers_the_same_way_and_the_app_has_exactly_their_routes():
    assert [f.__name__.rsplit(".", 1)[1] for f in routes.FAMILIES] == [
        "completions",
        "tokenize",
        "models",
        "health",
        "replica",
    ]
    for family in routes.FAMILIES:
        assert list(inspect.signature(family.register).parameters) == ["app", "srv"]
    got = {}
    for r in _app().routes:
        if isinstance(r, APIRoute):
            for method in r.methods:
                got[(r.path, method)] = r.endpoint.__module__.rsplit(".", 1)[1]
    assert got == WANT


def test_route_modules_import_nothing_from_the_app():
    """serve.routes may use serve's modules; only serve.app includes serve.routes."""
    serve_dir = Path(importlib.import_module("offgraph_kv.serve").__file__).parent
    for path in sorted((serve_dir / "routes").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert node.module not in ("app", "offgraph_kv.serve.app"), path.name
                if node.level == 2 and node.module is None:  # from .. import x
                    assert "app" not in [a.name for a in node.names], path.name
    for path in sorted(serve_dir.glob("*.py")):
        if path.name == "app.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert not (node.module or "").startswith("routes"), path.name


def test_models_answers_and_the_key_guards_the_family_routes():
    with_key = TestClient(_app(api_key="k"))
    ok = {"Authorization": "Bearer k"}
    assert with_key.get("/v1/models", headers=ok).json() == {
        "object": "list",
        "data": [
            {
                "id": "tiny",
                "object": "model",
                "created": with_key.app.state.server.created,
                "owned_by": "offgraph-kv",
            }
        ],
    }
    for path, method in WANT:
        r = with_key.request(method, path)
        if path in OPEN:
            assert r.status_code != 401, path  # open without --protect-metrics
        else:
            assert r.status_code == 401, path
            assert r.json()["error"]["code"] == "invalid_api_key"


def test_a_family_route_error_has_openai_shape_from_the_app_handler():
    client = TestClient(_app())
    r = client.post("/tokenize", json={"model": "other", "prompt": "x"})
    assert r.status_code == 404
    assert r.json() == {
        "error": {
            "message": "model 'other' does not exist; this server serves 'tiny'",
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
    }
    r = client.post("/v1/completions", json={"model": "tiny", "prompt": [1, 2], "max_tokens": 99})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
