"""A many-session agent load: ``offgraph-kv serve`` against llama.cpp's ``llama-server``.

``--sessions`` agents (32) share one long system prompt (``--system-tokens``, 2,000: a role and a
tool list) and each keeps its own growing history: every turn sends the whole conversation so
far (system, then the user/assistant turns, the assistant turns being what the server itself
answered) plus a new user message, for ``--turns`` turns (4). Turns are interleaved: every
session's turn 1, then every session's turn 2, ... (``--concurrency`` requests at a time), so
the sessions' total far exceeds the KV cells (``--n-cells``, the same number for both servers:
offgraph-kv's ``--n-cells`` with float16 pools, llama-server's ``-c`` with its unified f16 KV
cache; it must hold ``--concurrency`` whole sessions, as llama-server refuses a step that does
not fit rather than evicting) and a session's
cells are gone by its next turn unless something kept them.

Reported per server: prompt tokens recomputed (the prompt tokens the server computed instead of
taking from a cache: offgraph-kv's ``usage.prompt_tokens - cached_tokens``, llama-server's
``timings.prompt_n``), prompt tokens sent, time to first token p50/p99, and resident memory
(peak and at the end). llama-server runs with its default host prompt cache (``--cache-ram``);
offgraph-kv with its default host tier (``--prefix-cache-bytes``). Target: offgraph-kv
recomputes <= 1/3 of llama-server's prompt tokens at no more resident memory.

    python benches/bench_agents.py --llama-server PATH
    python benches/bench_agents.py --quick              # a small load, offgraph-kv only
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_serve import WORDS, text_of, tokenizer, user_text  # noqa: E402
from serve_load import (  # noqa: E402 (the benches directory is not a package)
    chat_stream,
    client_for,
    llama_flags,
    llama_metric,
    llama_server,
    okv_server,
    pct,
    ratio,
)

ROLE = (
    "You are an operations agent for a regional logistics company. You plan deliveries, answer "
    "questions about shipments and call tools when you need facts. Think step by step, call at "
    "most one tool per turn, and answer in two sentences when no tool is needed. "
)
TOOL = (
    '{"name": "%s", "description": "Looks up %s for a shipment, a depot or a route and returns '
    'a JSON object with the fields the caller asked for.", "parameters": {"type": "object", '
    '"properties": {"id": {"type": "string"}, "fields": {"type": "array", "items": {"type": '
    '"string"}}, "since": {"type": "string", "format": "date-time"}}, "required": ["id"]}}\n'
)


def system_prompt(tok, n_tokens: int) -> str:
    """A role, then tool definitions until ``n_tokens`` tokens."""
    tools = "".join(TOOL % (f"lookup_{w}_{i}", w) for i, w in enumerate(WORDS * 8))
    return text_of(tok, n_tokens, ROLE + "Tools:\n" + tools)[: 10**6]


async def run_load(url: str, model: str, args, system: str, users) -> dict:
    """Every session's turns, interleaved; per request its timing and token counts."""
    client = client_for(url)
    sem = asyncio.Semaphore(args.concurrency)
    history = [[{"role": "system", "content": system}] for _ in range(args.sessions)]
    done = []
    t0 = time.perf_counter()
    for turn in range(args.turns):

        async def one(s: int, turn: int = turn):
            async with sem:
                msgs = history[s] + [{"role": "user", "content": users[s][turn]}]
                d = await chat_stream(client, model, msgs, args.new_tokens)
                history[s] = msgs + [{"role": "assistant", "content": d.text or "ok"}]
                return d

        done += await asyncio.gather(*(one(s) for s in range(args.sessions)))
    wall = time.perf_counter() - t0
    await client.close()
    return {"wall_s": wall, "done": done}


def summary(r: dict, proc, computed_fallback: float | None = None) -> dict:
    done = r["done"]
    computed = [d.computed_tokens for d in done]
    known = all(c is not None for c in computed)
    total = sum(c for c in computed if c is not None) if known else computed_fallback
    return {
        "requests": len(done),
        "prompt_tokens": sum(d.prompt_tokens for d in done),
        "recomputed_tokens": total,
        "generated_tokens": sum(d.completion_tokens for d in done),
        "wall_s": r["wall_s"],
        "ttft_p50_s": pct([d.ttft for d in done], 50),
        "ttft_p99_s": pct([d.ttft for d in done], 99),
        "peak_rss_mib": proc.peak_rss / 2**20,
        "end_rss_mib": proc.rss() / 2**20,
    }


def table(res: dict) -> str:
    rows = [
        "| server | prompt tokens sent | recomputed | TTFT p50 (s) | TTFT p99 (s) "
        "| peak RSS (MiB) | RSS at end (MiB) | wall (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, s in res.items():
        rows.append(
            f"| {name} | {s['prompt_tokens']} | {s['recomputed_tokens']} "
            f"| {s['ttft_p50_s']:.2f} | {s['ttft_p99_s']:.2f} | {s['peak_rss_mib']:.0f} "
            f"| {s['end_rss_mib']:.0f} | {s['wall_s']:.0f} |"
        )
    a, b = res.get("offgraph-kv"), res.get("llama-server")
    if a and b:
        rows += [
            "",
            "offgraph-kv / llama-server: recomputed prompt tokens "
            f"{ratio(a['recomputed_tokens'], b['recomputed_tokens']):.3f}x (target <= 0.333), "
            f"peak resident memory {ratio(a['peak_rss_mib'], b['peak_rss_mib']):.2f}x "
            "(target <= 1.0), "
            f"TTFT p50 {ratio(a['ttft_p50_s'], b['ttft_p50_s']):.2f}x, "
            f"p99 {ratio(a['ttft_p99_s'], b['ttft_p99_s']):.2f}x",
        ]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gemma-3-270m")
    ap.add_argument("--servers", default="okv,llama", help="of okv, llama")
    ap.add_argument("--llama-server", default=None)
    ap.add_argument("--sessions", type=int, default=32)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--system-tokens", type=int, default=2000)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--n-cells", type=int, default=12288)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--okv-args",
        default="--kv-dtype float16",
        help="extra offgraph-kv serve flags (default: float16 pools, as llama-server's f16 cache)",
    )
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--log-dir", default=None, help="keep the servers' logs here")
    args = ap.parse_args(argv)
    if args.quick:
        args.sessions, args.turns, args.system_tokens, args.new_tokens = 4, 2, 256, 8
        args.n_cells, args.servers = 1024, "okv"
    tok = tokenizer(args.model)
    system = system_prompt(tok, args.system_tokens)
    rng = random.Random(0)
    users = [
        [user_text(tok, rng, f"Session {s} turn {t}:", 40, 80) for t in range(args.turns)]
        for s in range(args.sessions)
    ]
    print(
        f"agent load: {args.sessions} sessions x {args.turns} turns, a shared "
        f"{args.system_tokens}-token system prompt, 40-80 user tokens and {args.new_tokens} "
        f"new tokens a turn, {args.concurrency} at a time, {args.n_cells} KV cells; "
        f"{args.model}, {args.threads} threads",
        flush=True,
    )
    res: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = args.log_dir or tmp
        Path(tmp).mkdir(parents=True, exist_ok=True)
        for kind in [k.strip() for k in args.servers.split(",") if k.strip()]:
            log = Path(tmp) / f"{kind}.log"
            fallback = None
            if kind == "okv":
                extra = args.okv_args.split()
                proc = okv_server(args.model, "native", args.threads, args.n_cells, log, extra)
                name, flags = "offgraph-kv", f"--n-cells {args.n_cells} {args.okv_args}".strip()
            elif kind == "llama":
                if not args.llama_server:
                    raise SystemExit("--servers llama needs --llama-server PATH")
                slots = args.concurrency
                proc = llama_server(
                    args.llama_server, args.model, args.threads, args.n_cells, slots, log, ["-kvu"]
                )
                name, flags = "llama-server", llama_flags(proc)
            else:
                raise SystemExit(f"--servers: unknown {kind!r}")
            try:
                before = llama_metric(proc.url, "prompt_tokens_total") if kind == "llama" else 0
                r = asyncio.run(run_load(proc.url, args.model, args, system, users))
                if kind == "llama":
                    fallback = llama_metric(proc.url, "prompt_tokens_total") - before
                res[name] = summary(r, proc, fallback)
            finally:
                res.setdefault(name, {})["exit"] = proc.stop()
            res[name]["flags"] = flags
            print(f"{name} ({flags}): {json.dumps(res[name])}", flush=True)
    print(table(res))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": res}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
