"""``GET /v1/models``: the one model this server serves, in OpenAI's list shape."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from ..server import Server

__all__ = ["register"]


def register(app: FastAPI, srv: Server) -> None:
    """Adds the route to ``app``, over ``srv``."""

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": srv.model_name,
                    "object": "model",
                    "created": srv.created,
                    "owned_by": "offgraph-kv",
                }
            ],
        }
