"""The OpenAI wire format: request models (validated before anything reaches the generator),
error bodies and response/chunk builders.

Requests are parsed from the raw body here, not by the web framework, so every mistake (a body
that is not UTF-8, not JSON, a wrong type, a value out of range) gets OpenAI's error shape
``{"error": {"message", "type", "param", "code"}}`` with a 4xx status.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError

MAX_N = 16
MAX_STOP = 4
MAX_COMPLETION_LOGPROBS = 5  # OpenAI's legacy completions limit
MAX_TOP_LOGPROBS = 20  # chat's (and the generator's)


class ApiError(Exception):
    """An error answered as OpenAI's error body with ``status``."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


class _Strict(BaseModel):
    # Strict types: "5" is not an int and true is not a number; unknown fields are ignored, as
    # OpenAI clients send fields this server has no use for.
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(_Strict):
    include_usage: bool = False


class _Sampling(_Strict):
    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = Field(default=1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None

    def stop_strings(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > MAX_STOP:
            raise ApiError(400, f"stop: at most {MAX_STOP} strings", param="stop")
        if any(s == "" for s in stops):
            raise ApiError(400, "stop: empty string", param="stop")
        return stops


class CompletionRequest(_Sampling):
    prompt: str | list[int] | list[str]
    logprobs: int | None = Field(default=None, ge=0, le=MAX_COMPLETION_LOGPROBS)

    def logprob_count(self) -> int | None:
        """Top alternatives per token the generator records (``None``: no logprobs)."""
        return self.logprobs

    def prompt_input(self) -> str | list[int]:
        p = self.prompt
        if isinstance(p, list) and p and all(isinstance(x, str) for x in p):
            if len(p) != 1:
                raise ApiError(400, "prompt: one prompt per request", param="prompt")
            p = p[0]
        if isinstance(p, str) and p == "" or isinstance(p, list) and not p:
            raise ApiError(400, "prompt: empty", param="prompt")
        return p  # type: ignore[return-value]


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatRequest(_Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)

    def logprob_count(self) -> int | None:
        """Top alternatives per token (``None``: no logprobs); ``top_logprobs`` needs
        ``logprobs: true``, as OpenAI's API says."""
        if not self.logprobs:
            if self.top_logprobs is not None:
                raise ApiError(
                    400,
                    "top_logprobs: logprobs must be true when top_logprobs is given",
                    param="top_logprobs",
                    code="invalid_value",
                )
            return None
        return self.top_logprobs or 0

    def chat(self) -> list[dict[str, str]]:
        msgs = [{"role": m.role, "content": m.text()} for m in self.messages]
        for m in msgs:  # templates know "system"; OpenAI's newer name is "developer"
            if m["role"] == "developer":
                m["role"] = "system"
        if all(m["content"] == "" for m in msgs):
            raise ApiError(400, "messages: every message is empty", param="messages")
        return msgs


def parse(body: bytes, model: type[_Sampling]) -> Any:
    """``body`` as ``model``, or :class:`ApiError` (400) naming what is wrong."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ApiError(400, f"the body is not UTF-8: {e}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ApiError(400, f"the body is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        param = ".".join(str(x) for x in err["loc"]) or None
        raise ApiError(400, f"{param}: {err['msg']}", param=param, code="invalid_value") from None


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


class TokenLogprob(NamedTuple):
    """One reported token: its text (what it added to the choice's text), the offset of that
    text in the choice's text, its logprob, and the top alternatives ``(text, logprob)``, most
    likely first."""

    text: str
    offset: int
    logprob: float
    top: list[tuple[str, float]]


def _lp(x: float) -> float:
    # JSON has no -inf (a masked logit); OpenAI reports such a token's logprob as -9999.
    return x if math.isfinite(x) else -9999.0


def logprobs_body(chat: bool, tokens: list[TokenLogprob] | None) -> dict[str, Any] | None:
    """A choice's ``logprobs`` for ``tokens`` (``None`` when logprobs were not asked for).

    Chat: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}`` with the top
    ``top_logprobs`` alternatives. Completions (OpenAI's legacy shape): parallel lists
    ``tokens``, ``token_logprobs``, ``top_logprobs`` (``{text: logprob}``: the top ``logprobs``
    plus the chosen token, as OpenAI's "up to logprobs + 1") and ``text_offset``."""
    if tokens is None:
        return None
    if chat:
        return {
            "content": [
                {
                    "token": t.text,
                    "logprob": _lp(t.logprob),
                    "bytes": list(t.text.encode("utf-8")),
                    "top_logprobs": [
                        {"token": a, "logprob": _lp(x), "bytes": list(a.encode("utf-8"))}
                        for a, x in t.top
                    ],
                }
                for t in tokens
            ]
        }
    tops = []
    for t in tokens:
        top: dict[str, float] = {}
        for a, x in t.top:
            top.setdefault(a, _lp(x))  # two tokens of one text: the likelier one's
        top.setdefault(t.text, _lp(t.logprob))
        tops.append(top)
    return {
        "tokens": [t.text for t in tokens],
        "token_logprobs": [_lp(t.logprob) for t in tokens],
        "top_logprobs": tops,
        "text_offset": [t.offset for t in tokens],
    }


def response(
    chat: bool,
    rid: str,
    model: str,
    choices: list[tuple[str, str | None]],
    use: dict[str, Any],
    logprobs: list[dict[str, Any] | None] | None = None,
) -> dict[str, Any]:
    """A whole (non-streamed) completion: ``choices`` are ``(text, finish_reason)``,
    ``logprobs`` each choice's :func:`logprobs_body` (``None``: none asked)."""
    out = []
    for i, (text, reason) in enumerate(choices):
        lps = None if logprobs is None else logprobs[i]
        if chat:
            out.append(
                {
                    "index": i,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": reason,
                    "logprobs": lps,
                }
            )
        else:
            out.append({"index": i, "text": text, "finish_reason": reason, "logprobs": lps})
    return {
        "id": rid,
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": out,
        "usage": use,
    }


def chunk(
    chat: bool,
    rid: str,
    model: str,
    index: int,
    text: str | None,
    reason: str | None,
    first: bool = False,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One streamed chunk of choice ``index``: a text delta and/or its finish reason, and the
    :func:`logprobs_body` of the tokens whose text it carries."""
    if chat:
        delta: dict[str, Any] = {}
        if first:
            delta["role"] = "assistant"
        if text:
            delta["content"] = text
        choice: dict[str, Any] = {"index": index, "delta": delta, "finish_reason": reason}
    else:
        choice = {"index": index, "text": text or "", "finish_reason": reason}
    choice["logprobs"] = logprobs
    return {
        "id": rid,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
    }


def usage_chunk(chat: bool, rid: str, model: str, use: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [],
        "usage": use,
    }
