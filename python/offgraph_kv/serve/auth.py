"""The API key (``--api-key``): every ``/v1`` route and ``/tokenize``, ``/detokenize`` need
``Authorization: Bearer <key>``; ``/health``, ``/metrics`` and the routes a router polls
(:mod:`.routes.replica`) too with ``--protect-metrics``.
Anything else is 401 in OpenAI's error shape (code ``invalid_api_key``).

A plain ASGI middleware, not Starlette's ``BaseHTTPMiddleware``: that one wraps the request's
``receive``, and a streaming endpoint must see its client's disconnect to cancel the request.
"""

from __future__ import annotations

import hmac
import json
from typing import Any

from .protocol import ApiError

__all__ = ["ApiKeyMiddleware", "protected"]

_TOKEN_ROUTES = ("/tokenize", "/detokenize")
# With --protect-metrics, also what a router polls beside /health (/v1/loads is a /v1 route).
_OPEN_ROUTES = (
    "/health",
    "/metrics",
    "/health_generate",
    "/get_load",
    "/server_info",
    "/get_server_info",
    "/model_info",
    "/get_model_info",
)


def protected(path: str, protect_metrics: bool) -> bool:
    """Whether a request for ``path`` needs the key."""
    if path == "/v1" or path.startswith("/v1/") or path in _TOKEN_ROUTES:
        return True
    return protect_metrics and path in _OPEN_ROUTES


class ApiKeyMiddleware:
    """Refuses (401) a protected request without ``Authorization: Bearer <key>``."""

    def __init__(self, app: Any, key: str, protect_metrics: bool = False):
        if not isinstance(key, str) or not key:
            raise ValueError("api key: expected a non-empty string")
        self.app = app
        # Compared as bytes with hmac.compare_digest: its time does not depend on where the
        # first difference is, so a client cannot find the key a byte at a time.
        self.want = b"Bearer " + key.encode("utf-8")
        self.protect_metrics = protect_metrics

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not protected(scope.get("path", ""), self.protect_metrics):
            await self.app(scope, receive, send)
            return
        got = b""
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                got = value
                break
        if hmac.compare_digest(got, self.want):
            await self.app(scope, receive, send)
            return
        why = "no API key given" if not got else "the API key is not valid"
        err = ApiError(
            401,
            f"{why}: send 'Authorization: Bearer <key>' with the server's --api-key",
            code="invalid_api_key",
        )
        body = json.dumps(err.body()).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", b"Bearer"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
