"""Routing an agent load over ``offgraph-kv serve-cluster`` replicas: SMG's round robin against
its cache-aware policy (with the launcher's spill gate), each without and with a shared Redis
prefix store.

The load: ``--sessions`` agent sessions of ``--turns`` turns, ``--concurrency`` at a time, all
sharing a ~600-token system prompt; each turn quotes a tool output of its own (~150 tokens)
back into the session's growing history, so the sessions together hold more than one replica's
``--n-cells`` and where a turn lands decides what is recomputed. Greedy, 12 new tokens a turn,
streamed through the router with the official ``openai`` client. Per configuration: the
requests each replica served, prompt tokens, the share served from cache and the prompt tokens
recomputed (the replicas' ``/metrics``), time to first token p50/p99 over every turn, and the
ratios of the last two to round robin without a store. Redis is Debian's ``redis-server`` on a
free loopback port, started and stopped here, emptied between configurations.

    python benches/bench_routing.py                   # 2 replicas, 24 sessions x 3 turns
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster_load import run_sessions, totals  # noqa: E402 (the benches directory is not a package)
from serve_load import free_port, pct  # noqa: E402

SYSTEM = " ".join(
    f"Rule {i}: answer the customer politely and mention item {i * 7 % 31}." for i in range(45)
)
WORDS = "alpha beta gamma delta build test lint deploy cache shard replica token".split()
CONFIGS = [
    ("round robin", "round_robin", False),
    ("cache-aware", "cache_aware", False),
    ("round robin + Redis", "round_robin", True),
    ("cache-aware + Redis", "cache_aware", True),
]


def tool_output(session: int, turn: int) -> str:
    """A tool output of its own per turn (~150 tokens): log lines of a made-up build."""
    rng = random.Random(session * 1000 + turn)
    return "\n".join(
        f"[{rng.randrange(100, 999)}] {rng.choice(WORDS)} {rng.choice(WORDS)}: "
        f"{rng.randrange(10**5)} ok"
        for _ in range(14)
    )


def run(args, policy: str, redis_port: int | None, port: int) -> dict:
    flags = ["--replicas", str(args.replicas), "--threads", str(args.threads)]
    flags += ["--policy", policy, "--serve-arg=--n-cells", f"--serve-arg={args.n_cells}"]
    if redis_port is not None:
        flags += ["--store", f"redis://127.0.0.1:{redis_port}"]
    flags += [f"--router-arg={a}" for a in args.router_arg]
    ttft: list[float] = []

    def session(client, s: int) -> None:
        messages = [{"role": "system", "content": SYSTEM}]
        for t in range(args.turns):
            ask = f"Session {s}, step {t}: the tool printed\n{tool_output(s, t)}\nWhat failed?"
            messages.append({"role": "user", "content": ask})
            t0 = time.perf_counter()
            first, parts = None, []
            stream = client.chat.completions.create(
                model=args.model, messages=messages, max_tokens=12, temperature=0, stream=True
            )
            for c in stream:
                if c.choices and c.choices[0].delta.content:
                    if first is None:
                        first = time.perf_counter() - t0
                    parts.append(c.choices[0].delta.content)
            ttft.append(first if first is not None else time.perf_counter() - t0)
            messages.append({"role": "assistant", "content": "".join(parts)})

    wall, ms = run_sessions(args.model, port, flags, args.sessions, args.concurrency, session)
    split, prompt, cached = totals(ms)
    return {
        "split": split,
        "prompt": prompt,
        "cached": cached / prompt,
        "recomputed": prompt - cached,
        "ttft_p50": pct(ttft, 50),
        "ttft_p99": pct(ttft, 99),
        "wall": wall,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="per replica")
    p.add_argument("--n-cells", type=int, default=3072, help="per replica")
    p.add_argument("--sessions", type=int, default=24)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--port", type=int, default=18400)
    p.add_argument(
        "--configs",
        default=",".join(str(i) for i in range(len(CONFIGS))),
        help="which rows, by index (0: round robin, 1: cache-aware, 2, 3: each + Redis)",
    )
    p.add_argument("--router-arg", action="append", default=[], help="one more SMG flag")
    args = p.parse_args()
    configs = [CONFIGS[int(i)] for i in args.configs.split(",")]
    if configs[0][0] != "round robin":
        raise SystemExit("--configs: start with 0 (the rows compare to round robin)")
    redis_port = free_port()
    redis = subprocess.Popen(
        ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", ""],
        stdout=subprocess.DEVNULL,
    )
    try:
        time.sleep(0.5)
        rows = {}
        for name, policy, shared in configs:
            if shared:
                subprocess.run(["redis-cli", "-p", str(redis_port), "flushall"], check=True)
            rows[name] = run(args, policy, redis_port if shared else None, args.port)
            print(f"{name}: {rows[name]}", flush=True)
    finally:
        redis.terminate()
        redis.wait(30)
    rr = rows["round robin"]
    print(
        f"{args.replicas} replicas x {args.threads} thread(s), --n-cells {args.n_cells}; "
        f"{args.sessions} sessions x {args.turns} turns, {args.concurrency} at a time; "
        f"router flags {args.router_arg or 'the launcher defaults'}"
    )
    print(
        "| routing | requests per replica | prompt tokens | cached | recomputed "
        "| vs round robin | TTFT p50 (s) | TTFT p99 (s) | p99 vs round robin | wall s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        print(
            f"| {name} | {r['split']} | {int(r['prompt'])} | {100 * r['cached']:.1f}% "
            f"| {int(r['recomputed'])} | {r['recomputed'] / rr['recomputed']:.2f}x "
            f"| {r['ttft_p50']:.2f} | {r['ttft_p99']:.2f} | {r['ttft_p99'] / rr['ttft_p99']:.2f}x "
            f"| {r['wall']:.1f} |"
        )


if __name__ == "__main__":
    main()
