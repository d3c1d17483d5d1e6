"""``offgraph-kv serve`` against llama.cpp's ``llama-server`` (and its own torch path, and
``transformers serve``) under one shared-prefix chat load, then one stream at a time.

The load generator (the ``openai`` async client) replays a chat workload against each server in
turn, on the same GGUF (Gemma 3 270M from its PyPI package by default) and the same threads:
``--requests`` requests, ``--concurrency`` at a time, every one sharing a ``--system-tokens``
system prompt and adding 32-64 distinct user tokens, ``--new-tokens`` generated tokens each,
greedy, streamed. Then ``--single`` requests one after another (single-stream decode). Reported
per server: generated tokens/s over the wall time, time to first token p50/p99, inter-token
latency p50/p99 (gaps between streamed chunks), single-stream decode tokens/s (median), peak
resident memory. Targets against llama-server (``-np 16 --cont-batching``): throughput >= 2x,
TTFT p50 <= 0.5x and p99 <= 0.2x, inter-token p50 <= 1.0x, single-stream decode >= 1.0x.

llama.cpp is not vendored: build ``llama-server`` as ``bench_engine.py`` says and pass
``--llama-server PATH``. It runs with ``OMP_WAIT_POLICY=passive`` (unless set) and ``--poll 0``
(``--llama-extra``): on a loaded machine its spinning threads otherwise starve each other
(measured: ~30 prompt tokens/s on SmolLM2 with 16 slots while other jobs ran).

    python benches/bench_serve.py --llama-server PATH            # native, torch path, llama-server
    python benches/bench_serve.py --servers okv,llama --llama-server PATH
    python benches/bench_serve.py --quick                        # CI: a small load, native only
    python benches/bench_serve.py --structured --servers okv     # half the load with a json_schema
    python benches/bench_serve.py --structured --servers okv,llama --llama-server PATH --rounds 3

``--structured``: each server answers the load twice, as it is and with every other request
carrying a ``response_format`` ``json_schema`` (constrained decoding), and the table compares
the two (throughput and inter-token p50; the target is within 10%), with the share of the
constrained replies that parse as JSON (those cut by ``--new-tokens`` do not). A complete
constrained reply stops early (~50 of 64 tokens), which alone lowers tokens/s (the same
prefills, fewer tokens), so each server also answers a third, token-matched load: the same
requests unconstrained, each constrained one's twin limited to the tokens its structured reply
had (from that server's first structured run): the same work but for the constraint. With ``llama``
among the servers, offgraph-kv against llama-server's grammar path on the same requests (the
target: >= 2x throughput). ``--rounds N`` runs every server (and load) N times, alternating
the order each round, and reports each figure's median.

Writes a JSON of the figures (``--json``) and a plot (``--plot``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from serve_load import (  # noqa: E402 (the benches directory is not a package)
    chat_stream,
    client_for,
    gguf_path,
    llama_flags,
    llama_server,
    okv_server,
    pct,
    ratio,
)

TEXT = (
    "Four score and seven years ago our fathers brought forth on this continent, a new nation, "
    "conceived in Liberty, and dedicated to the proposition that all men are created equal. "
    "When in the Course of human events, it becomes necessary for one people to dissolve the "
    "political bands which have connected them with another, and to assume among the powers of "
    "the earth, the separate and equal station to which the Laws of Nature entitle them. "
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, "
    "must be in want of a wife. "
)
WORDS = (
    "bread rye oven flour butter sugar yeast crust dough morning market river bridge garden "
    "lantern window harbour meadow orchard candle letter journey winter summer autumn spring"
).split()

STRUCTURED = " json_schema"  # the structured load's row: the server's name and this
MATCHED = " matched"  # the token-matched unconstrained load's row

NAMES = {
    "okv": "offgraph-kv",
    "okv-torch": "offgraph-kv torch",
    "llama": "llama-server",
    "transformers": "transformers",
}


def tokenizer(model: str):
    """The GGUF's own tokenizer (the native engine's), to size the workload's texts."""
    from offgraph_kv.gguf_model import GgufModel

    return GgufModel(gguf_path(model), threads=1).tokenizer


def text_of(tok, n_tokens: int, seed_text: str) -> str:
    text, part = "", 0
    while len(tok.encode(text, add_special_tokens=False)) < n_tokens:
        part += 1
        text += f"Part {part}. {seed_text}"
    return tok.decode(tok.encode(text, add_special_tokens=False)[:n_tokens])


def user_text(tok, rng: random.Random, label: str, lo: int, hi: int) -> str:
    want = rng.randint(lo, hi)
    words = [label]
    while len(tok.encode(" ".join(words), add_special_tokens=False)) < want:
        words.append(rng.choice(WORDS))
    return tok.decode(tok.encode(" ".join(words), add_special_tokens=False)[:want])


def workload(tok, n: int, system_tokens: int, seed: int = 0):
    """``n`` chat conversations: one shared system prompt of ``system_tokens`` tokens, then a
    distinct user message of 32-64 tokens each."""
    rng = random.Random(seed)
    system = text_of(tok, system_tokens, TEXT)
    return [
        [
            {"role": "system", "content": system},
            {"role": "user", "content": user_text(tok, rng, f"Question {i}:", 32, 64)},
        ]
        for i in range(n)
    ]


# The structured load's schema: bounded so that a reply completes within --new-tokens' 64
# (~50 tokens), as an agent's structured answers do.
SCHEMA = {
    "type": "object",
    "properties": {
        "topic": {"type": "string", "maxLength": 24},
        "keywords": {
            "type": "array",
            "items": {"type": "string", "maxLength": 12},
            "maxItems": 3,
        },
        "answer": {"type": "string", "maxLength": 60},
        "confidence": {"type": "integer", "minimum": 0, "maximum": 10},
    },
    "required": ["topic", "keywords", "answer", "confidence"],
    "additionalProperties": False,
}
RESPONSE_FORMAT = {
    "type": "json_schema",
    "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True},
}


async def replay(
    url: str,
    model: str,
    convs,
    concurrency: int,
    new_tokens: int,
    structured: bool = False,
    limits: list[int] | None = None,
) -> dict:
    """The load: every conversation, ``concurrency`` at a time; ``structured``: every other one
    with :data:`RESPONSE_FORMAT`; ``limits``: each request's max tokens (else ``new_tokens``)."""
    client = client_for(url)
    sem = asyncio.Semaphore(concurrency)

    async def one(i, msgs):
        extra = {"response_format": RESPONSE_FORMAT} if structured and i % 2 == 0 else {}
        n = limits[i] if limits else new_tokens
        async with sem:
            return await chat_stream(client, model, msgs, n, **extra)

    t0 = time.perf_counter()
    done = await asyncio.gather(*(one(i, m) for i, m in enumerate(convs)))
    wall = time.perf_counter() - t0
    await client.close()
    out = {
        "wall_s": wall,
        "tokens": sum(d.completion_tokens for d in done),
        "ttft": [d.ttft for d in done],
        "itl": [g for d in done for g in d.gaps],
        "per_request": [d.completion_tokens for d in done],
    }
    if structured:
        constrained = [d.text for d in done[::2]]
        out["json_valid"] = sum(_is_json(t) for t in constrained) / len(constrained)
    return out


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


async def single(url: str, model: str, convs, new_tokens: int) -> list[float]:
    """One stream at a time: each request's decode rate (tokens after the first over the time
    from the first streamed token to the last)."""
    client = client_for(url)
    rates = []
    for msgs in convs:
        d = await chat_stream(client, model, msgs, new_tokens)
        if d.completion_tokens > 1 and d.decode_s > 0:
            rates.append((len(d.gaps)) / d.decode_s)
    await client.close()
    return rates


def summary(r: dict, rates: list[float], peak_rss: int) -> dict:
    extra = {"json_valid": r["json_valid"]} if "json_valid" in r else {}
    return {
        **extra,
        "tok_per_s": r["tokens"] / r["wall_s"],
        "tokens": r["tokens"],
        "wall_s": r["wall_s"],
        "ttft_p50_s": pct(r["ttft"], 50),
        "ttft_p99_s": pct(r["ttft"], 99),
        "itl_p50_s": pct(r["itl"], 50),
        "itl_p99_s": pct(r["itl"], 99),
        "single_tok_per_s": statistics.median(rates) if rates else float("nan"),
        "peak_rss_mib": peak_rss / 2**20,
    }


def medians(runs: list[dict]) -> dict:
    """One server's figures over its rounds: each number's median (NaNs left out)."""
    out = dict(runs[0])
    for key, v in runs[0].items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            vals = [r[key] for r in runs if r[key] == r[key]]
            out[key] = statistics.median(vals) if vals else float("nan")
    out["rounds"] = len(runs)
    return out


def table(res: dict) -> str:
    rows = [
        "| server | tokens/s | TTFT p50 (s) | TTFT p99 (s) | ITL p50 (s) | ITL p99 (s) "
        "| 1-stream tok/s | peak RSS (MiB) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, s in res.items():
        rows.append(
            f"| {name} | {s['tok_per_s']:.1f} | {s['ttft_p50_s']:.2f} | {s['ttft_p99_s']:.2f} "
            f"| {s['itl_p50_s']:.3f} | {s['itl_p99_s']:.3f} | {s['single_tok_per_s']:.1f} "
            f"| {s['peak_rss_mib']:.0f} |"
        )
    a = res.get("offgraph-kv")
    b = res.get("llama-server")
    if a and b:
        rows += [
            "",
            "offgraph-kv / llama-server (targets): "
            f"throughput {ratio(a['tok_per_s'], b['tok_per_s']):.2f}x (>= 2), "
            f"TTFT p50 {ratio(a['ttft_p50_s'], b['ttft_p50_s']):.2f}x (<= 0.5), "
            f"TTFT p99 {ratio(a['ttft_p99_s'], b['ttft_p99_s']):.2f}x (<= 0.2), "
            f"ITL p50 {ratio(a['itl_p50_s'], b['itl_p50_s']):.2f}x (<= 1.0), "
            f"single-stream decode {ratio(a['single_tok_per_s'], b['single_tok_per_s']):.2f}x "
            "(>= 1.0)",
        ]
    for name, s in res.items():
        base = name.removesuffix(STRUCTURED)
        plain, matched = res.get(base), res.get(base + MATCHED)
        if name.endswith(STRUCTURED) and plain:
            rows.append(
                f"{name} / as it is: throughput {ratio(s['tok_per_s'], plain['tok_per_s']):.2f}x, "
                f"ITL p50 {ratio(s['itl_p50_s'], plain['itl_p50_s']):.2f}x (targets: within "
                f"10%), wall time {ratio(s['wall_s'], plain['wall_s']):.2f}x for "
                f"{s['tokens']} tokens against {plain['tokens']} (a complete reply stops); "
                f"constrained replies that parse as JSON: {s['json_valid']:.0%}"
            )
        if name.endswith(STRUCTURED) and matched:
            rows.append(
                f"{name} / token-matched unconstrained: throughput "
                f"{ratio(s['tok_per_s'], matched['tok_per_s']):.2f}x, ITL p50 "
                f"{ratio(s['itl_p50_s'], matched['itl_p50_s']):.2f}x, wall time "
                f"{ratio(s['wall_s'], matched['wall_s']):.2f}x, for {s['tokens']} tokens "
                f"against {matched['tokens']}"
            )
    sa, sb = res.get(NAMES["okv"] + STRUCTURED), res.get(NAMES["llama"] + STRUCTURED)
    if sa and sb:
        rows.append(
            "offgraph-kv / llama-server, both under the structured load (llama-server's "
            f"grammar path): throughput {ratio(sa['tok_per_s'], sb['tok_per_s']):.2f}x (>= 2), "
            f"ITL p50 {ratio(sa['itl_p50_s'], sb['itl_p50_s']):.2f}x, wall time "
            f"{ratio(sa['wall_s'], sb['wall_s']):.2f}x; constrained replies that parse as JSON: "
            f"{sa['json_valid']:.0%} against {sb['json_valid']:.0%}"
        )
    t = res.get("offgraph-kv torch")
    if a and t:
        rows.append(
            f"native / torch path: throughput {ratio(a['tok_per_s'], t['tok_per_s']):.2f}x, "
            f"single-stream decode {ratio(a['single_tok_per_s'], t['single_tok_per_s']):.2f}x"
        )
    return "\n".join(rows)


def plot(res: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(res)
    keys = [
        ("tok_per_s", "generated tokens/s"),
        ("ttft_p50_s", "TTFT p50 (s)"),
        ("itl_p50_s", "inter-token p50 (s)"),
        ("single_tok_per_s", "single-stream tokens/s"),
    ]
    fig, axes = plt.subplots(1, len(keys), figsize=(13, 3.4))
    colours = ["#3b7", "#7ad", "#d84", "#888"]
    for ax, (key, label) in zip(axes, keys):
        ax.bar(names, [res[n][key] for n in names], color=colours[: len(names)])
        ax.set_title(label)
        ax.tick_params(axis="x", labelrotation=20)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def run_one(
    kind: str,
    args,
    tmp: Path,
    convs,
    singles,
    structured: bool = False,
    limits: list[int] | None = None,
) -> tuple[dict, str]:
    """Start server ``kind``, replay the load and the single streams, stop it; ``structured``:
    the load with every other request constrained; ``limits``: each request's max tokens (no
    single streams with either)."""
    cells = args.system_tokens + args.requests * (64 + args.new_tokens + 64)
    log = tmp / f"{kind}.log"
    served = args.model
    if kind in ("okv", "okv-torch"):
        engine = "native" if kind == "okv" else "torch"
        extra = ["--max-batch-tokens", str(args.max_batch_tokens), "--kv-dtype", args.kv_dtype]
        extra += ["--max-prefill-tokens", str(args.max_prefill_tokens)]
        proc = okv_server(args.model, engine, args.threads, cells, log, extra)
        flags = f"--engine {engine} --n-cells {cells} " + " ".join(extra)
    elif kind == "llama":
        if not args.llama_server:
            raise SystemExit("--servers llama needs --llama-server PATH")
        slots = args.concurrency
        per_slot = args.system_tokens + 64 + args.new_tokens + 64
        os.environ.setdefault("OMP_WAIT_POLICY", "passive")
        proc = llama_server(
            args.llama_server,
            args.model,
            args.threads,
            slots * per_slot,
            slots,
            log,
            args.llama_extra.split(),
        )
        flags = llama_flags(proc)
    else:
        proc, served, flags = transformers_server(args, tmp, log)
    try:
        r = asyncio.run(
            replay(proc.url, served, convs, args.concurrency, args.new_tokens, structured, limits)
        )
        rates = (
            []
            if structured or limits
            else asyncio.run(single(proc.url, served, singles, args.new_tokens))
        )
    finally:
        rc = proc.stop()
    out = summary(r, rates, proc.peak_rss)
    out["per_request"] = r["per_request"]
    out["flags"] = flags
    out["exit"] = rc
    return out, flags


def transformers_server(args, tmp: Path, log: Path):
    from offgraph_kv.serve.loading import load
    from serve_load import Proc, free_port

    local = tmp / args.model
    model, tok, _ = load(args.model)
    model.save_pretrained(local)
    tok.save_pretrained(local)
    del model
    port = free_port()
    code = "import sys; from transformers.cli.transformers import main; sys.exit(main())"
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    cmd = [sys.executable, "-c", code, "serve", str(local), "--continuous-batching"]
    cmd += ["--device", "cpu", "--host", "127.0.0.1", "--port", str(port)]
    return Proc(cmd, port, "/health", log), str(local), "--continuous-batching --device cpu"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gemma-3-270m")
    ap.add_argument("--servers", default="okv,okv-torch,llama", help=f"of {','.join(NAMES)}")
    ap.add_argument("--llama-server", default=None, help="llama.cpp's llama-server executable")
    ap.add_argument(
        "--llama-extra",
        default="--poll 0",
        help="more llama-server flags (default --poll 0: its waiting threads sleep rather than "
        "spin, which a shared, loaded machine needs)",
    )
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--system-tokens", type=int, default=1024)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--single", type=int, default=4, help="requests run one at a time")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-batch-tokens", type=int, default=512)
    ap.add_argument("--max-prefill-tokens", type=int, default=128)
    ap.add_argument("--kv-dtype", default="float32")
    ap.add_argument(
        "--rounds", type=int, default=1, help="runs per server, alternating; medians reported"
    )
    ap.add_argument("--quick", action="store_true", help="CI: 8 requests, native engine only")
    ap.add_argument("--json", default=None)
    ap.add_argument("--log-dir", default=None, help="keep the servers' logs here")
    ap.add_argument("--plot", default=None)
    ap.add_argument(
        "--structured",
        action="store_true",
        help="each server also answers the load with every other request under a json_schema",
    )
    args = ap.parse_args(argv)
    if args.quick:
        args.requests, args.concurrency, args.system_tokens, args.new_tokens = 8, 4, 128, 8
        args.single, args.servers = 2, "okv"
    if args.rounds < 1:
        raise SystemExit(f"--rounds: at least 1, got {args.rounds}")
    kinds = [k.strip() for k in args.servers.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in NAMES]
    if unknown:
        raise SystemExit(f"--servers: unknown {unknown}; known: {list(NAMES)}")

    tok = tokenizer(args.model)
    convs = workload(tok, args.requests, args.system_tokens)
    singles = workload(tok, args.single, args.system_tokens, seed=1)
    print(
        f"workload: {args.requests} chat requests, {args.concurrency} concurrent, a shared "
        f"{args.system_tokens}-token system prompt, 32-64 user tokens, {args.new_tokens} new "
        f"tokens, greedy; then {args.single} one at a time; {args.model}, {args.threads} threads",
        flush=True,
    )
    runs: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = args.log_dir or tmp
        Path(tmp).mkdir(parents=True, exist_ok=True)
        loads = ["", STRUCTURED, MATCHED] if args.structured else [""]
        for r in range(args.rounds):
            # Alternate the order from round to round: a busy machine's drift hits every side
            # (the first round runs a structured load before its token-matched twin).
            flip = (lambda xs: xs[::-1]) if r % 2 else (lambda xs: xs)
            for kind in flip(kinds):
                for load in flip(loads):
                    name = NAMES[kind] + load
                    limits = None
                    if load == MATCHED:  # the tokens of this server's first structured run
                        limits = runs[NAMES[kind] + STRUCTURED][0]["per_request"]
                    out, flags = run_one(
                        kind, args, Path(tmp), convs, singles, load == STRUCTURED, limits
                    )
                    runs.setdefault(name, []).append(out)
                    shown = {k: v for k, v in out.items() if k != "per_request"}
                    print(f"round {r + 1} {name} ({flags}): {json.dumps(shown)}", flush=True)
    res = {name: medians(rs) for name, rs in runs.items()}
    print(table(res))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": res}, f, indent=1)
    if args.plot:
        plot(res, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
