"""The HTTP app over a :class:`~offgraph_kv.serve.worker.RequestWorker`: the routes of
:mod:`.routes` (OpenAI's completions and chat completions, models, tokenize, health and metrics),
OpenAI's error shape for every :class:`~.protocol.ApiError`, and an API key where one is set
(:mod:`.auth`). The tokenizer is seen through :mod:`.tokens`' face, the same for both engines."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

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
) -> FastAPI:
    """The app; ``tokenizer`` a GGUF or Hugging Face tokenizer (or its :mod:`.tokens` face, or
    ``None``); with ``api_key``, /v1 and the token routes (and /health, /metrics with
    ``protect_metrics``) need ``Authorization: Bearer <api_key>``."""
    srv = Server(worker, tokenizer, model_name)

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

    for family in FAMILIES:
        family.register(app, srv)
    return app
