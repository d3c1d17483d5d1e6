"""``offgraph-kv serve``'s process: loads a model, builds the generator and its request worker,
serves.

The command line (``offgraph-kv serve ...``) is parsed by :mod:`offgraph_kv.tools.cli`, which
calls :func:`serve` with the :class:`ServeOptions` it parsed; nothing here imports the CLI.
"""

from __future__ import annotations

import logging
import os
import signal
from dataclasses import dataclass
from typing import Any

__all__ = ["ServeOptions", "build", "serve"]


@dataclass
class ServeOptions:
    """What one server runs: the model, the address, the cache and the queue.

    ``model`` is a local transformers directory, a ``.gguf`` file or a known name (see
    :mod:`.loading`); ``engine`` ``"native"`` (the default for a ``.gguf`` or a known name),
    ``"torch"`` (transformers, float32; the default for a directory) or ``None``; ``store`` a
    ``redis://`` / ``redis-cluster://`` URL of a prefix store shared by servers; ``threads`` the
    engine's threads (native: matmuls and attention; torch: torch's; ``None``: all);
    ``api_key`` the key /v1 and the token routes need (``protect_metrics``: /health and /metrics
    too); ``max_prefill_tokens`` the prompt tokens a step carries while requests generate
    (``BatchGenerator``'s; ``None``: ``max_batch_tokens``); ``spec`` ``"ngram"`` or a draft
    ``.gguf`` for speculative decoding (``None``: off), ``spec_max_draft`` its most drafted
    tokens per request and step.
    """

    model: str
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str | None = None
    kv_dtype: str = "float32"
    n_cells: int = 16384
    n_seq_max: int = 256
    max_batch_tokens: int = 512
    max_prefill_tokens: int | None = 128
    max_queue: int = 256
    store: str | None = None
    prefix_cache_bytes: int | None = None  # host tier bytes; None: 1/4 of MemAvailable, <= 8 GiB
    threads: int | None = None
    shutdown_timeout: float = 30.0
    log_level: str = "info"
    engine: str | None = None
    api_key: str | None = None
    protect_metrics: bool = False
    spec: str | None = None
    spec_max_draft: int = 8


def build(opts: ServeOptions) -> Any:
    """The app for ``opts``: loads the model, builds the generator and its request worker. The
    native path imports neither torch nor transformers (torch alone is ~490 MB resident)."""
    from ..batch import BatchGenerator
    from .app import create_app
    from .loading import engine_of, identity, load, load_native
    from .metrics import Metrics
    from .server import fingerprint
    from .worker import RequestWorker

    if engine_of(opts.model, opts.engine) == "native":
        model, tok, name = load_native(opts.model, opts.threads)
    else:
        import torch

        if opts.threads:
            torch.set_num_threads(opts.threads)
        model, tok, name = load(opts.model)
    kw: dict[str, Any] = {}
    if tok is not None and not hasattr(model, "tokenizer"):  # what grammars compile against
        kw["tokenizer"] = tok
    if opts.store:  # loaded on admission, saved as each prefill passes a chunk's end
        from ..store import PrefixStore, RedisBackend

        kw["store"] = PrefixStore(RedisBackend(opts.store), model=model)
    from .host_cache import resolve  # evicted prompts' chunks, in process, before the store

    kw["host_cache_bytes"] = resolve(opts.prefix_cache_bytes) or None
    if opts.spec:
        from ..batch.speculative import Speculation

        kw["speculative"] = Speculation(opts.spec, max_draft=opts.spec_max_draft)
    gen = BatchGenerator(
        model,
        n_cells=opts.n_cells,
        n_seq_max=opts.n_seq_max,
        max_batch_tokens=opts.max_batch_tokens,
        max_prefill_tokens=opts.max_prefill_tokens,
        kv_dtype=opts.kv_dtype,
        **kw,
    )
    worker = RequestWorker(gen, Metrics(), max_queue=opts.max_queue)
    return create_app(
        worker,
        tok,
        opts.served_model_name or name,
        api_key=opts.api_key or None,
        protect_metrics=opts.protect_metrics,
        system_fingerprint=fingerprint(f"{identity(opts.model)}\0{type(model).__name__}"),
    )


def serve(opts: ServeOptions) -> int:
    """Serve until SIGINT/SIGTERM (in-flight requests finish, up to ``shutdown_timeout``);
    returns the exit status: 0 after a graceful stop, 1 if the server never started, 2 without
    the ``[serve]`` extra."""
    try:
        import uvicorn
    except ImportError:
        print("offgraph-kv serve needs the [serve] extra: pip install 'offgraph-kv[serve]'")
        return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    app = build(opts)
    config = uvicorn.Config(
        app,
        host=opts.host,
        port=opts.port,
        log_level=opts.log_level,
        timeout_graceful_shutdown=opts.shutdown_timeout,
    )
    server = uvicorn.Server(config)
    # uvicorn re-raises the signal that stopped it once it is done; a graceful stop is a normal
    # exit here, so the handlers it restores (and re-raises into) ignore them.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)
    server.run()
    logging.getLogger("uvicorn.error").info("offgraph-kv serve: stopped")
    return 0 if server.started else 1
