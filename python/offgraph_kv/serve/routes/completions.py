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
from ..tools import ToolCallParser

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
    if chat and req.tools_on():  # each choice's text parsed for the template's call syntax
        syntax, markers = srv.tok.tool_syntax[0], srv.tok.marker_ids()
        one = req.parallel_tool_calls is False or isinstance(req.tool_choice, P.ToolChoice)
        for c in choices:
            c.markers = markers
            c.parser = ToolCallParser(syntax, 1 if one else None)
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
    texts = [
        (e + (c.text if c.parser is None else c.parser.content), c.finish_reason())
        for e, c in zip(echo, choices)
    ]
    calls = [c.tool_calls() for c in choices]
    body = P.response(chat, rid, srv.model_name, texts, use, lps, srv.fingerprint, calls)
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
        if c.parser is not None and c.reason != "error":
            c.parse()
            if c.reason is not None:  # the parser took its last call
                srv.worker.cancel(c.job)
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
            if c.parser is not None:
                for out in _tool_chunks(chat, rid, name, i, c, fp):
                    yield _sse(out)
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


def _tool_chunks(
    chat: bool, rid: str, name: str, i: int, c: Choice, fp: str | None
) -> list[dict[str, Any]]:
    """The chunks of a tools choice's parser events: content, a call's first delta (index, id,
    type, name, arguments ""), its argument pieces; the finish reason once the choice is over.
    The tokens' logprobs ride on the last chunk."""
    out: list[tuple[str | None, list[dict[str, Any]] | None]] = []
    for e in c.events:
        if e[0] == "content":
            out.append((e[1], None))
        elif e[0] == "call":
            fn = {"name": e[3], "arguments": ""}
            out.append((None, [{"index": e[1], "id": e[2], "type": "function", "function": fn}]))
        elif out and out[-1][1] and "id" not in out[-1][1][0] and out[-1][1][0]["index"] == e[1]:
            out[-1][1][0]["function"]["arguments"] += e[2]  # one piece per batch of tokens
        else:
            out.append((None, [{"index": e[1], "function": {"arguments": e[2]}}]))
    c.events = []
    if c.reason is not None:
        out.append((None, None))
    if not out:
        return []
    lps = P.logprobs_body(chat, c.take_logprobs())
    chunks = []
    for k, (text, calls) in enumerate(out):
        last = k == len(out) - 1
        chunks.append(
            P.chunk(
                chat,
                rid,
                name,
                i,
                text,
                c.finish_reason() if last else None,
                logprobs=lps if last else None,
                fingerprint=fp,
                tool_calls=calls,
            )
        )
    return chunks


def _sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"
