"""The request worker: the only thread that touches the :class:`BatchGenerator`.

The event loop never runs a forward. It hands the worker commands (add a request, cancel one,
read the state) through a queue; the worker applies them between steps, steps while there is
work, and sends each request's tokens back to the loop with ``call_soon_threadsafe``.

Admission control happens in :meth:`RequestWorker.submit`, on the caller's thread, before
anything is queued: a request that can never fit the cache is refused
(``context_length_exceeded``), and beyond ``max_queue`` requests waiting for their first token (a
request with ``n`` choices counts once) the server answers 503.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .._errors import CacheError
from .metrics import Metrics
from .protocol import ApiError


@dataclass
class Job:
    """One choice of one HTTP request: a generator request and where its tokens go."""

    prompt: list[int]
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    eos: frozenset[int]
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue  # (index, kind, arg), shared by the choices of one request
    index: int = 0  # the choice's index in its request
    logprobs: int | None = None  # top alternatives per token; None: no logprobs
    logit_bias: dict[int, float] | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    constraint: Any = None  # a Constraint the reply must match; None: free
    max_tokens_param: str = "max_tokens"  # the request's name of max_tokens, for its errors
    speculative: bool = True  # False: opted out of the generator's speculative decoding
    # Shared by the choices of one request: [True] once one of them has started. The queue
    # counts requests, not choices.
    ticket: list[bool] = field(default_factory=lambda: [False])
    rid: int | None = None
    started: bool = False  # first token produced
    ended: bool = False
    cached_tokens: int = 0
    submitted: float = field(default_factory=time.perf_counter)

    def send(self, kind: str, arg: Any) -> None:
        """Hand an event to the request's coroutine (from the worker thread)."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (self.index, kind, arg))
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass


class RequestWorker:
    """Owns a :class:`~offgraph_kv.hf.BatchGenerator` and steps it on its own thread."""

    def __init__(self, gen: Any, metrics: Metrics, max_queue: int = 256):
        self.gen = gen
        self.metrics = metrics
        self.max_queue = max_queue
        self._inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._waiting = 0  # submitted requests none of whose choices has started
        self._closing = False
        self._jobs: dict[int, Job] = {}  # rid -> job (worker thread only)
        self._thread = threading.Thread(target=self._run, name="offgraph-kv-worker", daemon=True)
        self.error: BaseException | None = None
        self._memory_at = float("-inf")  # when the pools' committed bytes were last read
        # The figures after the last step: read without waiting for the step that runs.
        self.last_state: dict[str, Any] = self.state()

    # -- the loop's side --------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()
        # The grammar tokenizer, built beside the stepping thread: the first constrained request
        # does not stall every stream for it. Without one, constrained requests fail alone.
        threading.Thread(target=self._prepare_constraints, daemon=True).start()

    def _prepare_constraints(self) -> None:
        try:
            self.gen.prepare_constraints()
        except Exception:  # no tokenizer or no llguidance: said by each constrained request
            pass

    def check_fits(self, prompt: list[int], max_tokens: int, param: str = "max_tokens") -> None:
        """Refuse (400 ``context_length_exceeded``, naming ``param``, the request's name of
        ``max_tokens``) a request the cache can never hold."""
        gen = self.gen
        total = len(prompt) + max_tokens - 1
        if total > gen.max_positions:
            raise ApiError(
                400,
                f"this model's context is {gen.max_positions} tokens; the request needs "
                f"{total} ({len(prompt)} prompt + {max_tokens} {param} - 1)",
                param=param,
                code="context_length_exceeded",
            )
        if gen.cells_needed(total) > gen.n_cells:
            raise ApiError(
                400,
                f"the cache holds {gen.n_cells} tokens; the request may write {total} "
                f"({len(prompt)} prompt + {max_tokens} {param} - 1)",
                param=param,
                code="context_length_exceeded",
            )
        bad = [t for t in prompt if not 0 <= t < gen.vocab_size]
        if bad:
            raise ApiError(
                400,
                f"prompt: token {bad[0]} is outside the vocabulary [0, {gen.vocab_size})",
                param="prompt",
            )

    def submit(self, jobs: list[Job]) -> None:
        """Queue ``jobs`` (the choices of one request), all or none: 503 when the queue is full
        or the server is shutting down."""
        for job in jobs:
            self.check_fits(job.prompt, job.max_tokens, job.max_tokens_param)
            job.ticket = jobs[0].ticket
        with self._lock:
            if self._closing:
                raise ApiError(
                    503, "the server is shutting down", "server_error", code="shutting_down"
                )
            if self._waiting + 1 > self.max_queue:
                raise ApiError(
                    503,
                    f"the queue is full ({self._waiting} requests waiting, at most "
                    f"{self.max_queue}); retry later",
                    "server_error",
                    code="queue_full",
                    headers={"Retry-After": "1"},
                )
            self._waiting += 1
        self.metrics.waiting.set(self._waiting)
        self._inbox.put(("add", jobs))
        self._wake.set()

    def cancel(self, job: Job) -> None:
        """Drop ``job`` if it has not ended (client gone, stop string seen)."""
        if not job.ended:
            self._inbox.put(("cancel", job))
            self._wake.set()

    async def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the worker thread between steps; returns its result."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future = loop.create_future()

        def run() -> None:
            try:
                res = fn()
            except BaseException as e:  # handed to the caller
                loop.call_soon_threadsafe(_settle, fut, None, e)
            else:
                loop.call_soon_threadsafe(_settle, fut, res, None)

        self._inbox.put(("call", run))
        self._wake.set()
        return await fut

    def close(self, timeout: float | None = None) -> None:
        """Stop admitting, cancel what still runs, and join the thread."""
        with self._lock:
            self._closing = True
        self._inbox.put(("close", None))
        self._wake.set()
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # -- the worker thread ------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                if self._drain():
                    break
                if self.gen.has_work:
                    self._step()
                else:
                    self._publish(memory=True)
                    self._wake.wait(0.5)
                    self._wake.clear()
        except BaseException as e:  # a failed forward: every open request hears it
            self.error = e
            for job in list(self._jobs.values()):
                self._end(job, "error", f"{type(e).__name__}: {e}")
            raise
        finally:
            with self._lock:
                self._closing = True

    def _drain(self) -> bool:
        """Apply queued commands; ``True`` once asked to close."""
        while True:
            try:
                cmd, arg = self._inbox.get_nowait()
            except queue.Empty:
                return False
            if cmd == "add":
                for job in arg:
                    try:
                        job.rid = self.gen.add(
                            job.prompt,
                            job.max_tokens,
                            eos_token_id=sorted(job.eos),
                            temperature=job.temperature,
                            top_p=job.top_p,
                            seed=job.seed,
                            logprobs=job.logprobs,
                            logit_bias=job.logit_bias,
                            frequency_penalty=job.frequency_penalty,
                            presence_penalty=job.presence_penalty,
                            constraint=job.constraint,
                            speculative=job.speculative,
                        )
                    except CacheError as e:  # submit's checks should have caught it
                        self._end(job, "error", str(e))
                        continue
                    self._jobs[job.rid] = job
                    self.metrics.prompt_tokens.inc(len(job.prompt))
            elif cmd == "cancel":
                if arg.rid is not None and arg.rid in self._jobs:
                    self.gen.cancel(arg.rid)
                    self._end(arg, "cancelled", None)
            elif cmd == "call":
                arg()
            elif cmd == "close":
                for job in list(self._jobs.values()):
                    self.gen.cancel(job.rid)
                    self._end(job, "cancelled", "the server is shutting down")
                self._publish(memory=True)
                return True

    def _step(self) -> None:
        t0 = time.perf_counter()
        produced = self.gen.step()
        now = time.perf_counter()
        self.metrics.step_seconds.observe(now - t0)
        # A speculating request may produce several tokens in one step: each token gets its
        # own logprob entry, and only its last token can end it.
        last = {rid: i for i, (rid, _) in enumerate(produced)}
        entries: dict[int, list] = {}
        for i, (rid, tok) in enumerate(produced):
            job = self._jobs.get(rid)
            if job is None:
                continue
            if not job.started:
                job.started = True
                job.cached_tokens = (self.gen.request_info(rid) or {}).get("cached_tokens", 0)
                self._started(job)
                self.metrics.cached_tokens.inc(job.cached_tokens)
                self.metrics.ttft_seconds.observe(now - job.submitted)
            self.metrics.generated_tokens.inc()
            # The token's logprob entry, or None when the job asked for none.
            if job.logprobs is not None and rid not in entries:
                entries[rid] = self.gen.take_logprobs(rid) or []
            mine = entries.get(rid)
            job.send("token", (tok, mine.pop(0) if mine else None))
            if i != last[rid]:
                continue
            info = self.gen.request_info(rid)
            if info is not None and info["state"] == "finished":
                # "stop": an end token, or a constraint's grammar complete; else "length".
                self._end(job, "finished", info["finish_reason"])
        self._publish()

    def _started(self, job: Job) -> None:
        if job.ticket[0]:
            return
        job.ticket[0] = True
        with self._lock:
            self._waiting -= 1

    def _end(self, job: Job, outcome: str, detail: str | None) -> None:
        """The job is over: tell its coroutine and forget it."""
        if job.ended:
            return
        if not job.started:
            job.started = True
            self._started(job)
        job.ended = True
        self._jobs.pop(job.rid, None)  # type: ignore[arg-type]
        self.gen.forget_finished(job.rid)
        self.metrics.requests.labels(outcome=outcome).inc()
        job.send(outcome, detail)

    def _publish(self, memory: bool = False) -> None:
        st = self.last_state = self.state()
        m = self.metrics
        now = time.perf_counter()
        # Reading the pools' pages costs a system call per pool: idle, or once a second.
        if memory or now - self._memory_at >= 1.0:
            self._memory_at = now
            m.pool_committed_bytes.set(self.gen.kc.committed_bytes())
        m.running.set(st["running"])
        m.waiting.set(self._waiting)
        m.cells_used.set(st["cells_used"])
        m.cells_free.set(st["cells_free"])
        m.cells_cached.set(st["cells_cached"])
        m.host_cache(st)
        m.speculation(st)

    def state(self) -> dict[str, Any]:
        """Occupancy figures (worker thread, or under :meth:`call`)."""
        gen = self.gen
        st = gen.stats
        running = gen._running
        # Cells a running request wrote itself; the rest of the cells in use hold prefix cache
        # (finished sequences kept for reuse) and the prompt prefixes running requests forked.
        written = sum(r.fed - r.reused for r in running)
        used = st["cells_used"]
        return {
            "running": st["running"],
            "waiting": self._waiting,
            "cells_used": used,
            "cells_free": gen.kc.free_cells,
            "cells_cached": max(0, used - written),
            "cells_total": st["cells_total"],
            "cached_sequences": st["cached_sequences"],
            "requests_cancelled": st.get("requests_cancelled", 0),
            "prefix_tokens_reused": st["prefix_tokens_reused"],
            **{k: v for k, v in st.items() if k.startswith(("host_cache_", "spec_"))},
        }

    def audit(self) -> dict[str, Any]:
        """The cache's own invariant check plus the generator's books: every live sequence is a
        running request's or a cached prefix's, and nothing else (worker thread only)."""
        gen = self.gen
        live = set(gen.kc.live_seqs)
        held = {r.seq for r in gen._running if r.seq is not None} | set(gen._cached)
        problem = gen.kc.audit()
        if problem is None and live != held:
            problem = f"live sequences {sorted(live - held)} belong to no request or prefix"
        return {**self.state(), "audit": problem or "ok", "live_sequences": len(live)}


def _settle(fut: asyncio.Future, res: Any, err: BaseException | None) -> None:
    if fut.done():
        return
    if err is not None:
        fut.set_exception(err)
    else:
        fut.set_result(res)
