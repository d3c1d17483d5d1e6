"""The HTTP app: OpenAI's completions and chat completions (whole or streamed), models, health
and metrics, over a :class:`~offgraph_kv.serve.worker.RequestWorker`; ``/tokenize`` and
``/detokenize`` (:mod:`.tokenize`); an API key where one is set (:mod:`.auth`). The tokenizer
is seen through :mod:`.tokens`' face, the same for both engines."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .._errors import InvalidArgumentError
from . import protocol as P
from .auth import ApiKeyMiddleware
from .worker import Job, RequestWorker
from .tokenize import add_token_routes
from .tokens import tokens_for

DEFAULT_MAX_TOKENS = 16  # /v1/completions, as OpenAI's
DEFAULT_CHAT_MAX_TOKENS = 256


@dataclass
class _Choice:
    """One choice's text as it is produced: detokenized incrementally, cut at a stop string."""

    job: Job
    tok: Any
    stops: list[str]
    ids: list[int] = field(default_factory=list)
    text: str = ""  # the text so far, stop string excluded
    sent: int = 0  # characters of `text` already streamed
    reason: str | None = None  # set once the choice is over

    # Logprob entries of the tokens not reported yet, each with the end of its text in `text`
    # (a token's text runs from the previous one's end); `reported` is where the next starts.
    lps: list[tuple[int, Any]] = field(default_factory=list)
    reported: int = 0

    def add(self, token: int) -> None:
        self.ids.append(token)
        if self.tok is None:
            self.text = " ".join(str(t) for t in self.ids)  # a model without a tokenizer
            return
        self.text = self.tok.decode(self.ids)
        for s in self.stops:
            i = self.text.find(s)
            if i >= 0:
                self.text = self.text[:i]
                self.reason = "stop"

    def add_logprob(self, entry: Any) -> None:
        """The logprob entry of the token :meth:`add` just took. A token's text is what it
        added to the choice's text, up to a partial character (the decoder's U+FFFD), which
        the token completing the character carries."""
        end = len(self.text.rstrip("\ufffd")) if self.reason is None else len(self.text)
        self.lps.append((max(end, self.lps[-1][0] if self.lps else self.reported), entry))
        if self.reason == "stop":  # tokens from the stop string on are not reported
            cut, kept, start = len(self.text), [], self.reported
            for end, e in self.lps:
                if start >= cut:
                    break
                kept.append((min(end, cut), e))
                start = end
            self.lps = kept

    def _ready(self, safe: int) -> int:
        """How many of the unreported tokens may be reported now: all once the choice is over;
        else those whose text ends by ``safe``, but not the ones ending where a partial
        character starts (if the generation ends there, the last of them carries the
        character's U+FFFD, as a whole answer has it)."""
        if self.reason is not None:
            return len(self.lps)
        hold = len(self.text.rstrip("\ufffd")) if self.text.endswith("\ufffd") else -1
        n = 0
        while n < len(self.lps) and self.lps[n][0] <= safe and self.lps[n][0] != hold:
            n += 1
        return n

    def take_logprobs(self) -> list[P.TokenLogprob] | None:
        """The logprobs of the tokens whose text has been sent (all once the choice is over),
        which are then reported; ``None`` when the job asked for none."""
        if self.job.logprobs is None:
            return None
        if self.reason is not None and self.lps:  # the text's tail (a partial char) is the last's
            self.lps[-1] = (len(self.text), self.lps[-1][1])
        out: list[P.TokenLogprob] = []
        for _ in range(self._ready(self.sent)):
            end, e = self.lps.pop(0)
            start, self.reported = self.reported, max(self.reported, end)
            text = self.text[start:end]
            top = [(text if t == e.token else token_text(self.tok, t), lp) for t, lp in e.top]
            out.append(P.TokenLogprob(text, start, e.logprob, top))
        return out

    def pending(self) -> str:
        """Text that is safe to send now: not a possible start of a stop string, not a partial
        UTF-8 character (the decoder's U+FFFD), unless the choice is over. With logprobs, text
        goes out whole tokens at a time, so a chunk's tokens are exactly the text it carries."""
        end = len(self.text)
        if self.reason is None:
            while end > self.sent and self.text[end - 1] == "\ufffd":
                end -= 1
            for s in self.stops:
                for k in range(min(len(s) - 1, end - self.sent), 0, -1):
                    if self.text[end - k : end] == s[:k]:
                        end -= k
                        break
            if self.job.logprobs is not None:
                n = self._ready(end)
                end = max(self.sent, self.lps[n - 1][0] if n else self.reported)
        out = self.text[self.sent : end]
        self.sent = end
        return out


def token_text(tok: Any, token_id: int) -> str:
    """A token's text on its own, for the logprobs' top alternatives (the tokenizer face's: a
    GGUF token's bytes, an incomplete character as U+FFFD); its id without a tokenizer, and
    nothing for an id past the tokenizer's vocabulary (a model's padded rows). A chosen
    token's text is what it added to the choice's text."""
    if tok is None:
        return str(token_id)
    try:
        if callable(getattr(tok, "token_text", None)):  # the serve tokenizer faces
            return tok.token_text(token_id)
        if callable(getattr(tok, "token_bytes", None)):
            return bytes(tok.token_bytes(token_id)).decode("utf-8", errors="replace")
        return tok.decode([token_id])
    except InvalidArgumentError:
        return ""


class Server:
    """The app's state: the request worker, the tokenizer, the served name."""

    def __init__(self, worker: RequestWorker, tokenizer: Any, model_name: str):
        self.worker = worker
        self.tok = tokens_for(tokenizer)
        self.model_name = model_name
        self.eos = frozenset() if self.tok is None else self.tok.stop_ids
        self.created = int(time.time())

    def prompt_ids(self, req: Any, chat: bool) -> list[int]:
        if chat:
            if self.tok is None:
                raise P.ApiError(400, "this model has no tokenizer: use /v1/completions with ids")
            try:
                return self.tok.chat_ids(req.chat())
            except Exception as e:  # no template, or a template that refuses these messages
                raise P.ApiError(400, f"messages: {e}", param="messages") from None
        prompt = req.prompt_input()
        if isinstance(prompt, list):
            return [int(t) for t in prompt]
        if self.tok is None:
            raise P.ApiError(
                400, "this model has no tokenizer: send the prompt as token ids", param="prompt"
            )
        ids = self.tok.encode(prompt)
        if not ids:
            raise P.ApiError(400, "prompt: no tokens", param="prompt")
        return ids

    def jobs(self, req: Any, chat: bool) -> tuple[list[Job], list[int], asyncio.Queue]:
        if req.model != self.model_name:
            raise P.ApiError(
                404,
                f"model {req.model!r} does not exist; this server serves {self.model_name!r}",
                param="model",
                code="model_not_found",
            )
        ids = self.prompt_ids(req, chat)
        max_tokens = req.max_tokens
        if chat and max_tokens is None:
            max_tokens = req.max_completion_tokens or DEFAULT_CHAT_MAX_TOKENS
        max_tokens = max_tokens or DEFAULT_MAX_TOKENS
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        jobs = [
            Job(
                prompt=ids,
                max_tokens=max_tokens,
                temperature=req.temperature,
                top_p=req.top_p,
                seed=None if req.seed is None else req.seed + i,
                eos=self.eos,
                logprobs=req.logprob_count(),
                loop=loop,
                events=events,
                index=i,
            )
            for i in range(req.n)
        ]
        return jobs, ids, events


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

    @app.post("/v1/completions", response_model=None)
    async def completions(request: Request) -> Response:
        return await _complete(srv, request, chat=False)

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(request: Request) -> Response:
        return await _complete(srv, request, chat=True)

    add_token_routes(app, srv)

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

    return app


async def _complete(srv: Server, request: Request, chat: bool) -> Response:
    req = P.parse(await request.body(), P.ChatRequest if chat else P.CompletionRequest)
    stops = req.stop_strings()
    jobs, ids, events = srv.jobs(req, chat)
    srv.worker.submit(jobs)
    rid = P.new_id("chatcmpl" if chat else "cmpl")
    choices = [_Choice(job, srv.tok, stops) for job in jobs]
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return StreamingResponse(
            _stream(srv, request, chat, rid, choices, events, len(ids), include_usage),
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
    use = _usage(choices, len(ids))
    lps = [P.logprobs_body(chat, c.take_logprobs()) for c in choices]
    texts = [(c.text, c.reason) for c in choices]
    body = P.response(chat, rid, srv.model_name, texts, use, lps)
    return JSONResponse(body)


def _usage(choices: list[_Choice], n_prompt: int) -> dict[str, Any]:
    # One prompt for every choice; its cached tokens are those the first choice found shared
    # (the other choices fork that choice's prefilled prompt).
    done = sum(len(c.ids) for c in choices)
    return P.usage(n_prompt, done, choices[0].job.cached_tokens)


async def _events(
    srv: Server, request: Request, choices: list[_Choice], events: asyncio.Queue
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
    choices: list[_Choice],
    events: asyncio.Queue,
    n_prompt: int,
    include_usage: bool,
) -> AsyncIterator[str]:
    name = srv.model_name
    first = [True] * len(choices)
    try:
        if chat:  # the role comes first, as OpenAI's streams do
            for i in range(len(choices)):
                yield _sse(P.chunk(chat, rid, name, i, "", None, first=True))
                first[i] = False
        async for i in _events(srv, request, choices, events):
            c = choices[i]
            if c.reason == "error":
                err = P.ApiError(500, c.text or "generation failed", "server_error")
                yield _sse(err.body())
                continue
            text = c.pending()
            if text or c.reason is not None:
                lps = P.logprobs_body(chat, c.take_logprobs())
                yield _sse(P.chunk(chat, rid, name, i, text, c.reason, logprobs=lps))
        if include_usage:
            yield _sse(P.usage_chunk(chat, rid, name, _usage(choices, n_prompt)))
        yield "data: [DONE]\n\n"
    finally:  # the client went away (or the stream ended): free what still runs
        for c in choices:
            srv.worker.cancel(c.job)


def _sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"
