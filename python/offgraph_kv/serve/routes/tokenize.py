"""``POST /tokenize`` and ``POST /detokenize``, in vLLM's shape (llama-server's ``content`` key
accepted too):

* tokenize ``{"model"?, "prompt" | "content" | "messages", "add_special_tokens": true}`` ->
  ``{"tokens": [...], "count": n, "max_model_len": ctx}``; ``messages`` are the chat prompt
  ``/v1/chat/completions`` would run (template, generation prompt);
* detokenize ``{"model"?, "tokens": [...]}`` -> ``{"prompt": text, "content": text}`` (special
  tokens left out, as completions' texts).

Bad input is a 400 in OpenAI's error shape, as on the /v1 routes.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from pydantic import Field

from .. import protocol as P
from ..server import Server

__all__ = ["DetokenizeRequest", "TokenizeRequest", "register"]


class TokenizeRequest(P._Strict):
    model: str | None = None
    prompt: str | None = None
    content: str | None = None
    messages: list[P.Message] | None = Field(default=None, min_length=1)
    add_special_tokens: bool = True

    def source(self) -> tuple[str, Any]:
        given = [(k, v) for k in ("prompt", "content", "messages") if (v := getattr(self, k))]
        given += [(k, "") for k in ("prompt", "content") if getattr(self, k) == ""]
        if len(given) != 1:
            raise P.ApiError(
                400,
                "give exactly one of prompt, content (a text) or messages (a chat)",
                param="prompt",
            )
        return given[0]


class DetokenizeRequest(P._Strict):
    model: str | None = None
    tokens: list[int]


def _check_model(srv: Server, model: str | None) -> None:
    if model is not None and model != srv.model_name:
        raise P.ApiError(
            404,
            f"model {model!r} does not exist; this server serves {srv.model_name!r}",
            param="model",
            code="model_not_found",
        )
    if srv.tok is None:
        raise P.ApiError(400, "this model has no tokenizer")


def register(app: FastAPI, srv: Server) -> None:
    """Adds the two routes to ``app``, over ``srv``."""

    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict[str, Any]:
        req = P.parse(await request.body(), TokenizeRequest)
        _check_model(srv, req.model)
        kind, value = req.source()
        if kind == "messages":
            chat = P.ChatRequest.chat(req)  # the same checks and role names as chat's
            try:
                ids = srv.tok.chat_ids(chat)
            except Exception as e:  # no template, or a template that refuses these messages
                raise P.ApiError(400, f"messages: {e}", param="messages") from None
        else:
            ids = srv.tok.encode(value, add_special_tokens=req.add_special_tokens)
        return {"tokens": ids, "count": len(ids), "max_model_len": srv.worker.gen.max_positions}

    @app.post("/detokenize")
    async def detokenize(request: Request) -> dict[str, Any]:
        req = P.parse(await request.body(), DetokenizeRequest)
        _check_model(srv, req.model)
        vocab = srv.worker.gen.vocab_size
        bad = [t for t in req.tokens if not 0 <= t < vocab]
        if bad:
            raise P.ApiError(
                400, f"tokens: {bad[0]} is outside the vocabulary [0, {vocab})", param="tokens"
            )
        text = srv.tok.decode(req.tokens)
        return {"prompt": text, "content": text}
