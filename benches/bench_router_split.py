"""How SMG's cache-aware routing splits an agent-like load over ``offgraph-kv serve-cluster``
replicas, with SMG's own spill gate (at its default match threshold, 0.3, and at 0.9) and with
the launcher's (``tools/cluster.py``'s ``SPILL``).

``--sessions`` sessions of ``--turns`` turns, ``--concurrency`` sessions at a time, every one
starting with the same ~600-token system prompt and growing its own history; greedy, 12 new
tokens a turn. Per configuration: the requests each replica served, the prompt tokens, the share
served from cache (``offgraph_kv_cached_tokens_total`` over ``offgraph_kv_prompt_tokens_total``),
the prompt tokens recomputed and the wall time (the last only as a hint on a shared machine).

    python benches/bench_router_split.py                  # 2 replicas, 16 sessions x 3 turns
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster_load import run_sessions, totals  # noqa: E402 (the benches directory is not a package)

SMG_GATE = ["--balance-abs-threshold", "64", "--balance-rel-threshold", "1.5"]
CONFIGS = {
    "SMG's": SMG_GATE,
    "SMG's, --cache-threshold 0.9": [*SMG_GATE, "--cache-threshold", "0.9"],
    "the launcher's": [],
}
SYSTEM = " ".join(
    f"Rule {i}: answer the customer politely and mention item {i * 7 % 31}." for i in range(45)
)


def run(args: argparse.Namespace, name: str, router_args: list[str], port: int) -> str:
    flags = ["--replicas", str(args.replicas), "--threads", str(args.threads)]
    flags += ["--serve-arg=--n-cells", f"--serve-arg={args.n_cells}"]
    flags += [f"--router-arg={a}" for a in router_args]

    def session(client, s: int) -> None:
        messages = [{"role": "system", "content": SYSTEM}]
        for t in range(args.turns):
            ask = f"Customer {s}, question {t}: what about order {s * 13 + t}?"
            messages.append({"role": "user", "content": ask})
            r = client.chat.completions.create(
                model=args.model, messages=messages, max_tokens=12, temperature=0
            )
            messages.append({"role": "assistant", "content": r.choices[0].message.content})

    wall, ms = run_sessions(args.model, port, flags, args.sessions, args.concurrency, session)
    split, prompt, cached = totals(ms)
    return (
        f"| {name} | {split} | {int(prompt)} | {100 * cached / prompt:.1f}% "
        f"| {int(prompt - cached)} | {wall:.1f} |"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="per replica")
    p.add_argument("--n-cells", type=int, default=8192)
    p.add_argument("--sessions", type=int, default=16)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--port", type=int, default=18300)
    args = p.parse_args()
    print("| spill gate | requests per replica | prompt tokens | cached | recomputed | wall s |")
    print("|---|---|---|---|---|---|")
    for name, router_args in CONFIGS.items():
        print(run(args, name, router_args, args.port), flush=True)


if __name__ == "__main__":
    main()
