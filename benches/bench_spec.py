"""Speculative decoding, one stream: ``offgraph-kv serve --spec ngram`` against the same server
without it, and against llama.cpp's ``llama-server`` with and without its n-gram modes, on an
agent/code-editing load; then the cost on a full batch (``--full-load``).

The one-stream load (greedy, streamed through the official ``openai`` client, one request at a
time): ``code``, a Python file in the prompt with a request to rewrite it with small changes;
``tool``, a chat quoting a tool output back (failing tests of a log, cited line by line). Every
server runs at once on the same GGUF and threads, idle but for its turn; each round sends each
request to every server in turn (the order rotating per round), so a loaded machine's drift
falls on all alike. Reported per load and server: the median decode tokens/s (tokens after the
first over the time from the first streamed token to the last), its ratio to offgraph-kv
without speculation (the per-round ratios' median, alternating pairs), offgraph-kv's acceptance
rate (``/metrics``), llama-server's (its ``timings``), and whether the speculating replies equal
the plain ones (greedy: they must).

``--full-load``: ``bench_serve.py``'s shared-prefix chat load (64 requests, 16 at a time)
against the server with and without ``--spec ngram``, alternating: throughput with speculation
over without (speculation turns itself down on a full batch; the aim is >= 0.95).
llama-server runs with ``OMP_WAIT_POLICY=passive`` (unless set) and ``--poll 0``
(``--llama-extra``): its waiting threads sleep instead of spinning, which a loaded machine needs.

``--step-cost``: in process, a T-token forward of one sequence over a one-token one.

    python benches/bench_spec.py --model smollm2-135m
    python benches/bench_spec.py --model gemma-3-270m --llama-server PATH --rounds 5
    python benches/bench_spec.py --model smollm2-135m --full-load --servers okv
    python benches/bench_spec.py --model smollm2-135m --servers "" --step-cost
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from serve_load import (  # noqa: E402 (the benches directory is not a package)
    client_for,
    llama_server,
    okv_server,
    ratio,
)

CODE = '''import json
import os
from dataclasses import dataclass


@dataclass
class Order:
    order_id: int
    customer: str
    items: list
    total: float


def load_orders(path):
    """Read every order from a JSON lines file."""
    orders = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            data = json.loads(line)
            orders.append(Order(data["id"], data["customer"], data["items"], data["total"]))
    return orders


def total_by_customer(orders):
    """The sum of the totals of each customer's orders."""
    totals = {}
    for order in orders:
        totals[order.customer] = totals.get(order.customer, 0.0) + order.total
    return totals


def largest_orders(orders, n=3):
    """The n orders with the largest totals, largest first."""
    return sorted(orders, key=lambda o: o.total, reverse=True)[:n]


def main():
    orders = load_orders(os.environ.get("ORDERS", "orders.jsonl"))
    for customer, total in sorted(total_by_customer(orders).items()):
        print(f"{customer}: {total:.2f}")
    for order in largest_orders(orders):
        print(order.order_id, order.customer, order.total)


if __name__ == "__main__":
    main()
'''

TOOL_LOG = """============================= test session starts ==============================
collected 14 items

tests/test_orders.py::test_load_orders_reads_every_line PASSED           [  7%]
tests/test_orders.py::test_load_orders_skips_blank_lines PASSED          [ 14%]
tests/test_orders.py::test_total_by_customer_sums_totals FAILED          [ 21%]
tests/test_orders.py::test_total_by_customer_empty PASSED                [ 28%]
tests/test_orders.py::test_largest_orders_default_three PASSED           [ 35%]
tests/test_orders.py::test_largest_orders_ties_keep_order FAILED         [ 42%]
tests/test_orders.py::test_main_prints_totals PASSED                     [ 50%]
tests/test_report.py::test_report_header PASSED                          [ 57%]
tests/test_report.py::test_report_rounds_to_cents FAILED                 [ 64%]
tests/test_report.py::test_report_sorted_by_customer PASSED              [ 71%]
tests/test_report.py::test_report_empty_file PASSED                      [ 78%]
tests/test_cli.py::test_cli_reads_env_path PASSED                        [ 85%]
tests/test_cli.py::test_cli_missing_file FAILED                          [ 92%]
tests/test_cli.py::test_cli_help PASSED                                  [100%]

=========================== short test summary info ============================
FAILED tests/test_orders.py::test_total_by_customer_sums_totals - AssertionError: 41.5 != 42.0
FAILED tests/test_orders.py::test_largest_orders_ties_keep_order - AssertionError: [3, 1] != [1, 3]
FAILED tests/test_report.py::test_report_rounds_to_cents - AssertionError: '10.005' != '10.01'
FAILED tests/test_cli.py::test_cli_missing_file - FileNotFoundError: orders.jsonl
========================= 4 failed, 10 passed in 0.41s =========================
"""

LOADS = {
    "code": [
        {
            "role": "user",
            "content": "Here is a Python file:\n\n```python\n"
            + CODE
            + "```\n\nRewrite the whole file with the function load_orders renamed to "
            "read_orders (and its call updated). Output only the complete file in a code block.",
        }
    ],
    "tool": [
        {"role": "user", "content": "Run the tests."},
        {
            "role": "assistant",
            "content": "I ran `pytest -q`. The tool returned:\n\n" + TOOL_LOG,
        },
        {
            "role": "user",
            "content": "Quote the four FAILED lines of the short test summary exactly as the "
            "tool printed them, one per line, then say in one sentence what to fix first.",
        },
    ],
}


def metric(url: str, name: str) -> float:
    """An unlabelled sample of a server's ``/metrics`` (NaN when absent)."""
    with urllib.request.urlopen(url + "/metrics", timeout=60) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return float("nan")


async def one_stream(url: str, model: str, messages, max_tokens: int) -> dict:
    """One greedy streamed chat: its text, decode rate and llama-server's draft timings."""
    client = client_for(url)
    stream = await client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    first = last = None
    parts: list[str] = []
    tokens = 0
    timings: dict = {}
    async for c in stream:
        t = (c.model_extra or {}).get("timings")
        if isinstance(t, dict):
            timings = t
        if c.usage is not None:
            tokens = c.usage.completion_tokens
        if c.choices and c.choices[0].delta.content:
            parts.append(c.choices[0].delta.content)
            now = time.perf_counter()
            first = first or now
            last = now
    await client.close()
    # Several tokens may arrive in one chunk (a speculating step): the rate counts tokens.
    rate = (tokens - 1) / (last - first) if first and last and last > first else float("nan")
    return {
        "text": "".join(parts),
        "tokens": tokens,
        "rate": rate,
        "drafted": timings.get("draft_n"),
        "accepted": timings.get("draft_n_accepted"),
    }


def start_servers(args, tmp: Path) -> dict:
    """Every server of the run, by name, started (and ready) one after another."""
    servers: dict = {}
    kinds = [k.strip() for k in args.servers.split(",") if k.strip()]
    okv_extra = ["--max-batch-tokens", str(args.max_batch_tokens), "--kv-dtype", args.kv_dtype]
    if "okv" in kinds:
        servers["okv"] = okv_server(
            args.model, "native", args.threads, args.n_cells, tmp / "okv.log", okv_extra
        )
        spec = okv_extra + ["--spec", "ngram", "--spec-max-draft", str(args.max_draft)]
        servers["okv --spec ngram"] = okv_server(
            args.model, "native", args.threads, args.n_cells, tmp / "okv-spec.log", spec
        )
    if "llama" in kinds:
        if not args.llama_server:
            raise SystemExit("--servers llama needs --llama-server PATH")
        # llama.cpp's OpenMP threads spin while they wait: on a shared, loaded machine that
        # starves them (measured here: 1.5-5 tok/s against 12-24 with passive waiting).
        os.environ.setdefault("OMP_WAIT_POLICY", "passive")
        extra = args.llama_extra.split()
        servers["llama"] = llama_server(
            args.llama_server, args.model, args.threads, args.n_cells, 1, tmp / "llama.log", extra
        )
        for t in [t.strip() for t in args.llama_spec_types.split(",") if t.strip()]:
            servers[f"llama --spec-type {t}"] = llama_server(
                args.llama_server,
                args.model,
                args.threads,
                args.n_cells,
                1,
                tmp / f"llama-{t}.log",
                [*extra, "--spec-type", t],
            )
    return servers


def one_stream_load(args, servers: dict) -> dict:
    """Each load's requests, ``rounds`` times, to every server in turn (rotating)."""
    names = list(servers)
    res: dict = {load: {n: [] for n in names} for load in LOADS}
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for load, messages in LOADS.items():
            for name in order:
                url = servers[name].url
                before = (
                    metric(url, "offgraph_kv_spec_drafted_tokens_total"),
                    metric(url, "offgraph_kv_spec_accepted_tokens_total"),
                )
                out = asyncio.run(one_stream(url, args.model, messages, args.new_tokens))
                if name.startswith("okv"):
                    drafted = metric(url, "offgraph_kv_spec_drafted_tokens_total")
                    accepted = metric(url, "offgraph_kv_spec_accepted_tokens_total")
                    out["drafted"], out["accepted"] = drafted - before[0], accepted - before[1]
                res[load][name].append(out)
            line = ", ".join(f"{n} {res[load][n][-1]['rate']:.1f}" for n in order)
            print(f"round {r + 1} {load}: tok/s {line}", flush=True)
    return res


def summarise(res: dict) -> dict:
    out: dict = {}
    for load, by in res.items():
        base = by.get("okv") or next(iter(by.values()))
        rows = {}
        for name, runs in by.items():
            rates = [x["rate"] for x in runs]
            pairs = [ratio(x["rate"], b["rate"]) for x, b in zip(runs, base, strict=True)]
            drafted = sum(x["drafted"] or 0 for x in runs)
            accepted = sum(x["accepted"] or 0 for x in runs)
            rows[name] = {
                "tok_per_s": statistics.median(rates),
                "vs_okv": statistics.median(pairs),
                "acceptance": accepted / drafted if drafted else None,
                "drafted": drafted,
                "tokens": statistics.median(x["tokens"] for x in runs),
                "same_text_as_okv": all(
                    x["text"] == b["text"] for x, b in zip(runs, base, strict=True)
                ),
            }
        # llama-server's best speculating mode (by its median), and offgraph-kv's speculating
        # server against it round by round.
        modes = [n for n in rows if n.startswith("llama --spec-type")]
        if modes and "okv --spec ngram" in by:
            best = max(modes, key=lambda n: rows[n]["tok_per_s"])
            pairs = [
                ratio(x["rate"], b["rate"])
                for x, b in zip(by["okv --spec ngram"], by[best], strict=True)
            ]
            rows["okv --spec ngram"]["best_llama"] = best
            rows["okv --spec ngram"]["vs_best_llama"] = statistics.median(pairs)
        out[load] = rows
    return out


def table(summary: dict) -> str:
    lines = [
        "| load | server | decode tok/s (median) | vs offgraph-kv plain | acceptance | tokens "
        "| same text |",
        "|---|---|---|---|---|---|---|",
    ]
    for load, rows in summary.items():
        for name, r in rows.items():
            acc = "" if r["acceptance"] is None else f"{r['acceptance']:.0%}"
            lines.append(
                f"| {load} | {name} | {r['tok_per_s']:.1f} | {r['vs_okv']:.2f}x | {acc} "
                f"| {r['tokens']:.0f} | {'yes' if r['same_text_as_okv'] else 'no'} |"
            )
            if "vs_best_llama" in r:
                lines.append(
                    f"| {load} | okv --spec ngram / {r['best_llama']} | | "
                    f"{r['vs_best_llama']:.2f}x | | | |"
                )
    return "\n".join(lines)


def full_load(args, tmp: Path) -> dict:
    """bench_serve.py's chat load against the server with and without --spec ngram,
    alternating ``rounds`` times; each side's throughput and the ratio."""
    from bench_serve import replay, tokenizer, workload

    tok = tokenizer(args.model)
    convs = workload(tok, 64, 1024)
    cells = 1024 + 64 * (64 + 64 + 64)
    extra = ["--max-batch-tokens", "512", "--max-prefill-tokens", "128"]
    procs = {
        "plain": okv_server(args.model, "native", args.threads, cells, tmp / "full.log", extra),
        "spec": okv_server(
            args.model,
            "native",
            args.threads,
            cells,
            tmp / "full-spec.log",
            extra + ["--spec", "ngram", "--spec-max-draft", str(args.max_draft)],
        ),
    }
    rates: dict = {"plain": [], "spec": []}
    try:
        for r in range(args.rounds):
            for name in ("plain", "spec") if r % 2 == 0 else ("spec", "plain"):
                # A fresh prefix cache per replay is not possible on a live server: the first
                # round warms both alike.
                out = asyncio.run(replay(procs[name].url, args.model, convs, 16, 64))
                rates[name].append(out["tokens"] / out["wall_s"])
                print(f"full load round {r + 1} {name}: {rates[name][-1]:.1f} tok/s", flush=True)
        drafted = metric(procs["spec"].url, "offgraph_kv_spec_drafted_tokens_total")
        accepted = metric(procs["spec"].url, "offgraph_kv_spec_accepted_tokens_total")
    finally:
        for p in procs.values():
            p.stop()
    pairs = [s / p for s, p in zip(rates["spec"], rates["plain"], strict=True)]
    return {
        "plain_tok_per_s": statistics.median(rates["plain"]),
        "spec_tok_per_s": statistics.median(rates["spec"]),
        "spec_over_plain": statistics.median(pairs),
        "drafted": drafted,
        "acceptance": accepted / drafted if drafted else None,
    }


def step_cost(args) -> dict:
    """In process: the time of one forward of ``T`` tokens of one sequence (a 512-token context
    held) over the time of a one-token forward, for the ``T`` a verifying step carries; the T
    values interleaved, ``rounds * 5`` times each, medians. What ``step_tokens`` is chosen by."""
    import offgraph_kv as okv
    from offgraph_kv.gguf_model import GgufModel
    from serve_load import gguf_path

    m = GgufModel(gguf_path(args.model), threads=args.threads)
    layers = m.layer_configs()
    cfg = okv.CacheConfig(m.max_positions, len(layers), layers, max_step=64)
    kc = okv.KvCellCache(cfg, 1024, n_seq_max=4)
    seq = kc.seq_new()
    ctx = m.tokenizer.encode(TOOL_LOG * 2)[:512]
    for at in range(0, len(ctx), 64):
        part = ctx[at : at + 64]
        kc.begin_step([seq] * len(part), list(range(at, at + len(part))))
        m.forward_cells(kc, part, list(range(at, at + len(part))), [len(part) - 1])
    n0 = len(ctx)
    sizes = (1, 2, 4, 8, 12, 16, 24, 32)
    times: dict = {t: [] for t in sizes}
    for _ in range(args.rounds * 5):
        for t in sizes:
            pos = list(range(n0, n0 + t))
            kc.begin_step([seq] * t, pos)
            t0 = time.perf_counter()
            m.forward_cells(kc, ctx[:t], pos, list(range(t)))
            times[t].append(time.perf_counter() - t0)
            kc.seq_rm(seq, n0)
    base = statistics.median(times[1])
    return {t: statistics.median(x) / base for t, x in times.items()} | {"one_token_s": base}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--servers", default="okv,llama", help="okv, llama (with --llama-server)")
    ap.add_argument("--llama-server", default=None, help="llama.cpp's llama-server executable")
    ap.add_argument(
        "--llama-spec-types",
        default="ngram-simple,ngram-map-k,ngram-mod",
        help="llama-server --spec-type values, one server each (the best one is its figure)",
    )
    ap.add_argument(
        "--llama-extra",
        default="--poll 0",
        help="more llama-server flags (default --poll 0: its threads sleep rather than spin "
        "while waiting, which a shared, loaded machine needs)",
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=320)
    ap.add_argument("--max-draft", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-cells", type=int, default=4096)
    ap.add_argument("--max-batch-tokens", type=int, default=512)
    ap.add_argument("--kv-dtype", default="float32")
    ap.add_argument("--full-load", action="store_true", help="also bench_serve's chat load")
    ap.add_argument(
        "--step-cost", action="store_true", help="also a T-token forward over a 1-token one"
    )
    ap.add_argument("--json", default=None)
    ap.add_argument("--log-dir", default=None, help="keep the servers' logs here")
    args = ap.parse_args(argv)
    if "llama" in args.servers and not args.llama_server:
        args.servers = ",".join(k for k in args.servers.split(",") if k.strip() != "llama")
        print("no --llama-server: offgraph-kv only", flush=True)
    print(
        f"one stream, greedy, {args.new_tokens} new tokens at most, {args.rounds} rounds; "
        f"{args.model}, {args.threads} threads",
        flush=True,
    )
    result: dict = {"args": vars(args)}
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(args.log_dir or tmp_dir)
        tmp.mkdir(parents=True, exist_ok=True)
        if args.servers:
            servers = start_servers(args, tmp)
            try:
                res = one_stream_load(args, servers)
            finally:
                for p in servers.values():
                    p.stop()
            result["one_stream"] = summarise(res)
            result["rates"] = {
                load: {n: [x["rate"] for x in runs] for n, runs in by.items()}
                for load, by in res.items()
            }
            result["flags"] = {n: " ".join(p.cmd[3:]) for n, p in servers.items()}
            print(table(result["one_stream"]))
        if args.step_cost:
            result["step_cost"] = step_cost(args)
            print(f"step cost (T tokens / 1 token): {json.dumps(result['step_cost'])}")
        if args.full_load:
            result["full_load"] = full_load(args, tmp)
            print(f"full chat load: {json.dumps(result['full_load'])}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
