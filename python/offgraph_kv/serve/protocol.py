"""The OpenAI wire format: request models (validated before anything reaches the generator),
error bodies and response/chunk builders.

Requests are parsed from the raw body here, not by the web framework, so every mistake (a body
that is not UTF-8, not JSON, a wrong type, a value out of range) gets OpenAI's error shape
``{"error": {"message", "type", "param", "code"}}`` with a 4xx status.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

MAX_N = 16
MAX_STOP = 4


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


def response(
    chat: bool,
    rid: str,
    model: str,
    choices: list[tuple[str, str | None]],
    use: dict[str, Any],
) -> dict[str, Any]:
    """A whole (non-streamed) completion: ``choices`` are ``(text, finish_reason)``."""
    out = []
    for i, (text, reason) in enumerate(choices):
        if chat:
            out.append(
                {
                    "index": i,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": reason,
                    "logprobs": None,
                }
            )
        else:
            out.append({"index": i, "text": text, "finish_reason": reason, "logprobs": None})
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
) -> dict[str, Any]:
    """One streamed chunk of choice ``index``: a text delta and/or its finish reason."""
    if chat:
        delta: dict[str, Any] = {}
        if first:
            delta["role"] = "assistant"
        if text:
            delta["content"] = text
        choice: dict[str, Any] = {"index": index, "delta": delta, "finish_reason": reason}
    else:
        choice = {"index": index, "text": text or "", "finish_reason": reason}
    choice["logprobs"] = None
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
