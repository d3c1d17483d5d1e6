"""The app's state (:class:`Server`): the request worker, the tokenizer's face, the served name,
the ``system_fingerprint``; it turns a request into the worker's jobs (each prompt's ids, the
model checked, max_tokens, the sampling parameters)."""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import Any, NamedTuple

from . import protocol as P
from .tokens import tokens_for
from .tool_prompt import call_constraint
from .worker import Job, RequestWorker

__all__ = ["DEFAULT_CHAT_MAX_TOKENS", "DEFAULT_MAX_TOKENS", "Prompt", "Server", "fingerprint"]

DEFAULT_MAX_TOKENS = 16  # /v1/completions, as OpenAI's
DEFAULT_CHAT_MAX_TOKENS = 256


def fingerprint(identity: str) -> str:
    """``system_fingerprint``: ``fp_okv_`` and 8 hex digits of the package version and the model's
    identity (what the same weights served by the same code answer the same)."""
    from .. import __version__

    digest = hashlib.sha256(f"offgraph-kv {__version__}\0{identity}".encode()).hexdigest()
    return f"fp_okv_{digest[:8]}"


class Prompt(NamedTuple):
    """One prompt of a request: its ids and its text (what ``echo`` prepends)."""

    ids: list[int]
    text: str


class Server:
    """The app's state: the request worker, the tokenizer, the served name, the fingerprint
    (``None``: derived from the served name)."""

    def __init__(
        self,
        worker: RequestWorker,
        tokenizer: Any,
        model_name: str,
        system_fingerprint: str | None = None,
    ):
        self.worker = worker
        self.tok = tokens_for(tokenizer)
        self.model_name = model_name
        self.eos = frozenset() if self.tok is None else self.tok.stop_ids
        self.created = int(time.time())
        self.fingerprint = system_fingerprint or fingerprint(model_name)

    def prompts(self, req: Any, chat: bool) -> list[Prompt]:
        """The request's prompts' ids (chat: one, the template's)."""
        if chat:
            if self.tok is None:
                raise P.ApiError(400, "this model has no tokenizer: use /v1/completions with ids")
            try:
                return [Prompt(self.tok.chat_ids(req.chat(), req.tool_dicts()), "")]
            except Exception as e:  # no template, or a template that refuses these messages
                raise P.ApiError(400, f"messages: {e}", param="messages") from None
        return [self._prompt(p) for p in req.prompt_inputs()]

    def _prompt(self, prompt: str | list[int]) -> Prompt:
        if isinstance(prompt, list):
            ids = [int(t) for t in prompt]
            if self.tok is None:
                return Prompt(ids, " ".join(str(t) for t in ids))  # as a choice's text is
            return Prompt(ids, self.tok.decode(ids))
        if self.tok is None:
            raise P.ApiError(
                400, "this model has no tokenizer: send the prompt as token ids", param="prompt"
            )
        ids = self.tok.encode(prompt)
        if not ids:
            raise P.ApiError(400, "prompt: no tokens", param="prompt")
        return Prompt(ids, prompt)

    def jobs(self, req: Any, chat: bool) -> tuple[list[Job], list[Prompt], asyncio.Queue]:
        """The request's choices as jobs, ``n`` per prompt in prompt order (choice ``p * n +
        j`` is prompt ``p``'s ``j``-th, seeded ``seed + j``), its prompts, and the queue their
        events come back on."""
        if req.model != self.model_name:
            raise P.ApiError(
                404,
                f"model {req.model!r} does not exist; this server serves {self.model_name!r}",
                param="model",
                code="model_not_found",
            )
        bias = req.bias(self.worker.gen.vocab_size)
        if req.constraint is not None and self.tok is None:
            raise P.ApiError(
                400,
                "this model has no tokenizer to compile grammars against",
                param="response_format",
                code="unsupported_parameter",
            )
        prompts = self.prompts(req, chat)
        # tools: a grammar of calls in the template's syntax (forced, or auto once a call opens)
        constraint = (chat and call_constraint(req, self.tok)) or req.constraint
        max_tokens, param = req.max_new_tokens()
        if max_tokens is None:
            max_tokens = DEFAULT_CHAT_MAX_TOKENS if chat else DEFAULT_MAX_TOKENS
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        jobs = [
            Job(
                prompt=p.ids,
                max_tokens=max_tokens,
                temperature=req.temperature,
                top_p=req.top_p,
                seed=None if req.seed is None else req.seed + j,
                eos=self.eos,
                logprobs=req.logprob_count(),
                loop=loop,
                events=events,
                index=i * req.n + j,
                logit_bias=bias,
                frequency_penalty=req.frequency_penalty,
                presence_penalty=req.presence_penalty,
                constraint=constraint,
                max_tokens_param=param,
                speculative=req.speculative,
            )
            for i, p in enumerate(prompts)
            for j in range(req.n)
        ]
        return jobs, prompts, events
