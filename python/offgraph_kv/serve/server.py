"""The app's state (:class:`Server`): the request worker, the tokenizer's face, the served name;
it turns a request into the worker's jobs (the prompt's ids, the model checked, max_tokens)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from . import protocol as P
from .tokens import tokens_for
from .worker import Job, RequestWorker

__all__ = ["DEFAULT_CHAT_MAX_TOKENS", "DEFAULT_MAX_TOKENS", "Server"]

DEFAULT_MAX_TOKENS = 16  # /v1/completions, as OpenAI's
DEFAULT_CHAT_MAX_TOKENS = 256


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
