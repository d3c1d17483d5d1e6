"""``GET /health`` (the worker's occupancy figures; ``?audit=true`` adds the cache's invariant
check) and ``GET /metrics`` (Prometheus' text format)."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ..server import Server

__all__ = ["register"]


def register(app: FastAPI, srv: Server) -> None:
    """Adds the two routes to ``app``, over ``srv``."""
    worker = srv.worker

    @app.get("/health", response_model=None)
    async def health(audit: bool = False) -> Response:
        if not worker.alive:
            return JSONResponse({"status": "error", "error": repr(worker.error)}, status_code=503)
        # The audit runs on the worker thread between steps; the plain figures are the last
        # step's, so a health check never waits for a forward.
        st = await worker.call(worker.audit) if audit else worker.last_state
        return JSONResponse({"status": "ok", **st})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(worker.metrics.registry), media_type=CONTENT_TYPE_LATEST)
