"""The HTTP app over a :class:`~offgraph_kv.serve.worker.RequestWorker`: the routes of
:mod:`.routes` (OpenAI's completions and chat completions, models, tokenize, health and metrics),
OpenAI's error shape for every error (an :class:`~.errors.ApiError`, and the framework's own:
an unknown route's 404, a wrong method's 405, a query that does not validate), and an API key
where one is set (:mod:`.auth`). The tokenizer is seen through :mod:`.tokens`' face, the same
for both engines."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from . import protocol as P
from .auth import ApiKeyMiddleware
from .routes import FAMILIES
from .server import Server
from .worker import RequestWorker

__all__ = ["create_app"]


def create_app(
    worker: RequestWorker,
    tokenizer: Any,
    model_name: str,
    api_key: str | None = None,
    protect_metrics: bool = False,
    system_fingerprint: str | None = None,
) -> FastAPI:
    """The app; ``tokenizer`` a GGUF or Hugging Face tokenizer (or its :mod:`.tokens` face, or
    ``None``); with ``api_key``, /v1 and the token routes (and /health, /metrics with
    ``protect_metrics``) need ``Authorization: Bearer <api_key>``; ``system_fingerprint`` the
    responses' (``None``: derived from ``model_name``)."""
    srv = Server(worker, tokenizer, model_name, system_fingerprint)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        worker.start()
        try:
            yield
        finally:
            await asyncio.get_running_loop().run_in_executor(None, worker.close, 30.0)

    app = FastAPI(title="offgraph-kv", lifespan=lifespan)
    app.state.server = srv
    if api_key:
        app.add_middleware(ApiKeyMiddleware, key=api_key, protect_metrics=protect_metrics)

    @app.exception_handler(P.ApiError)
    async def api_error(request: Request, e: P.ApiError) -> JSONResponse:
        if e.status >= 500 or e.code == "context_length_exceeded":
            worker.metrics.requests.labels(outcome="rejected").inc()
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException) -> JSONResponse:
        # An unknown route (404) or method (405, with its Allow header): OpenAI's shape.
        if e.status_code == 404:
            message = f"Invalid URL ({request.method} {request.url.path})"
        elif e.status_code == 405:
            message = f"Method {request.method} is not allowed on {request.url.path}"
        else:
            message = str(e.detail)
        code = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code)
        err = P.ApiError(e.status_code, message, code=code, headers=dict(e.headers or {}))
        return JSONResponse(err.body(), status_code=e.status_code, headers=err.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, e: RequestValidationError) -> JSONResponse:
        # A query or path parameter of the wrong type (the bodies are parsed by .protocol).
        first = e.errors()[0] if e.errors() else {"loc": (), "msg": "invalid request"}
        loc = [str(x) for x in first["loc"] if x not in ("query", "path", "body")]
        param = ".".join(loc) or None
        err = P.ApiError(400, f"{param}: {first['msg']}", param=param, code="invalid_value")
        return JSONResponse(err.body(), status_code=400)

    for family in FAMILIES:
        family.register(app, srv)
    return app
