"""``POST /v1/completions`` and ``POST /v1/chat/completions``, whole or streamed (server-sent
events): the request's choices are jobs for the worker (``n`` per prompt, prompts in order),
their text cut at stop strings; with ``echo`` a completion's text starts with its prompt's."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from .. import protocol as P
from ..choice import Choice
from ..server import Prompt, Server

__all__ = ["register"]


def register(app: FastAPI, srv: Server) -> None:
    """Adds the two routes to ``app``, over ``srv``."""

    @app.post("/v1/completions", response_model=None)
    async def completions(request: Request) -> Response:
        return await _complete(srv, request, chat=False)

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(request: Request) -> Response:
        return await _complete(srv, request, chat=True)


async def _complete(srv: Server, request: Request, chat: bool) -> Response:
    req = P.parse(await request.body(), P.ChatRequest if chat else P.CompletionRequest)
    stops = req.stop_strings()
    jobs, prompts, events = srv.jobs(req, chat)
    srv.worker.submit(jobs)
    rid = P.new_id("chatcmpl" if chat else "cmpl")
    choices = [Choice(job, srv.tok, stops) for job in jobs]
    # The text each choice starts with: its prompt's with echo (completions), else nothing.
    echo = [
        prompts[i // req.n].text if getattr(req, "echo", False) else "" for i in range(len(jobs))
    ]
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return StreamingResponse(
            _stream(srv, request, chat, rid, choices, events, prompts, echo, include_usage),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
        )
    try:
        async for _ in _events(srv, request, choices, events):
            pass
    finally:
        for c in choices:
            srv.worker.cancel(c.job)
    errors = [c for c in choices if c.reason == "error"]
    if errors:
        raise P.ApiError(500, errors[0].text or "generation failed", "server_error")
    use = _usage(choices, prompts)
    lps = [P.logprobs_body(chat, c.take_logprobs()) for c in choices]
    texts = [(e + c.text, c.reason) for e, c in zip(echo, choices)]
    body = P.response(chat, rid, srv.model_name, texts, use, lps, srv.fingerprint)
    return JSONResponse(body)


def _usage(choices: list[Choice], prompts: list[Prompt]) -> dict[str, Any]:
    # Each prompt counted once; its cached tokens are those its first choice found shared (the
    # other choices fork that choice's prefilled prompt).
    n = len(choices) // len(prompts)
    done = sum(len(c.ids) for c in choices)
    cached = sum(choices[i * n].job.cached_tokens for i in range(len(prompts)))
    return P.usage(sum(len(p.ids) for p in prompts), done, cached)


async def _events(
    srv: Server, request: Request, choices: list[Choice], events: asyncio.Queue
) -> AsyncIterator[int]:
    """Apply the worker's events to the choices; yields the index of each choice that changed.
    Ends when every choice is over. A client that went away cancels what is left."""
    open_ = len(choices)
    while open_:
        try:
            index, kind, arg = await asyncio.wait_for(events.get(), timeout=1.0)
        except asyncio.TimeoutError:
            if await request.is_disconnected():
                return
            continue
        c = choices[index]
        if c.reason is not None:
            continue  # over already (a stop string): late events do not count
        if kind == "token":
            tok, entry = arg  # the token and its logprob entry (None: none asked)
            c.add(tok)
            if entry is not None:
                c.add_logprob(entry)
            if c.reason is not None:
                srv.worker.cancel(c.job)
        elif kind == "finished":
            c.reason = arg
        elif kind == "error":
            c.reason, c.text = "error", str(arg)
        else:  # cancelled by shutdown
            c.reason = "length"
        if c.reason is not None:
            open_ -= 1
        yield index


async def _stream(
    srv: Server,
    request: Request,
    chat: bool,
    rid: str,
    choices: list[Choice],
    events: asyncio.Queue,
    prompts: list[Prompt],
    echo: list[str],
    include_usage: bool,
) -> AsyncIterator[str]:
    name, fp = srv.model_name, srv.fingerprint
    try:
        for i in range(len(choices)):
            if chat:  # the role comes first, as OpenAI's streams do
                yield _sse(P.chunk(chat, rid, name, i, "", None, first=True, fingerprint=fp))
            elif echo[i]:  # the echoed prompt, before any generated text
                yield _sse(P.chunk(chat, rid, name, i, echo[i], None, fingerprint=fp))
        async for i in _events(srv, request, choices, events):
            c = choices[i]
            if c.reason == "error":
                err = P.ApiError(500, c.text or "generation failed", "server_error")
                yield _sse(err.body())
                continue
            text = c.pending()
            if text or c.reason is not None:
                lps = P.logprobs_body(chat, c.take_logprobs())
                yield _sse(
                    P.chunk(chat, rid, name, i, text, c.reason, logprobs=lps, fingerprint=fp)
                )
        if include_usage:
            use = _usage(choices, prompts)
            yield _sse(P.usage_chunk(chat, rid, name, use, fp))
        yield "data: [DONE]\n\n"
    finally:  # the client went away (or the stream ended): free what still runs
        for c in choices:
            srv.worker.cancel(c.job)


def _sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"
