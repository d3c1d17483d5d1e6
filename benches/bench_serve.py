"""``offgraph-kv serve`` against ``transformers serve --continuous-batching`` under one chat load.

The load generator (the ``openai`` async client) replays a chat workload against each server in
turn, on the same model (Gemma 3 270M from its PyPI package; transformers serve loads it from a
local directory this script writes with ``save_pretrained``) and the same torch threads:
``--requests`` requests, ``--concurrency`` at a time, every one sharing a ``--system-tokens``
system prompt and adding 32-64 distinct user tokens, ``--new-tokens`` generated tokens each,
greedy, streamed. Reported per server: generated tokens/s over the wall time, time to first
token p50/p99 and inter-token latency p50/p99 (gaps between streamed chunks, per token). The
targets: offgraph-kv >= 3x the throughput and <= 1/5 the p50 TTFT of transformers serve, and
its own p99 inter-token latency <= 3x its p50.

    python benches/bench_serve.py                       # the full workload, both servers
    python benches/bench_serve.py --requests 16 --concurrency 8 --system-tokens 512 \\
        --new-tokens 16                                 # the same shape, scaled down
    python benches/bench_serve.py --quick               # CI: a small load, offgraph-kv only

Writes a JSON of the figures (``--json``) and a plot (``--plot``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def workload(tok, n: int, system_tokens: int, seed: int = 0):
    """``n`` chat conversations: one shared system prompt of ``system_tokens`` tokens, then a
    distinct user message of 32-64 tokens each."""
    import random

    rng = random.Random(seed)
    text, part = "", 0
    while len(tok(text, add_special_tokens=False)["input_ids"]) < system_tokens:
        part += 1
        text += f"Part {part}. {TEXT}"
    system = tok.decode(tok(text, add_special_tokens=False)["input_ids"][:system_tokens])
    convs = []
    for i in range(n):
        want = rng.randint(32, 64)
        words = [f"Question {i}:"]
        while len(tok(" ".join(words), add_special_tokens=False)["input_ids"]) < want:
            words.append(rng.choice(WORDS))
        user = tok.decode(tok(" ".join(words), add_special_tokens=False)["input_ids"][:want])
        convs.append([{"role": "system", "content": system}, {"role": "user", "content": user}])
    return convs


class Proc:
    """A server process, ready once ``path`` answers 200."""

    def __init__(self, cmd: list[str], port: int, path: str, log: Path, timeout: float = 1800):
        self.log = open(log, "w")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{cmd[:4]} exited {self.proc.returncode}; see {log}")
            try:
                with urllib.request.urlopen(self.url + path, timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{cmd[:4]} did not start; see {log}")
            time.sleep(1)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


async def replay(url: str, model: str, convs, concurrency: int, new_tokens: int) -> dict:
    """Run the workload; per-request TTFT, inter-token gaps and token counts."""
    import openai

    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=7200)
    sem = asyncio.Semaphore(concurrency)
    ttft: list[float] = []
    itl: list[float] = []
    tokens = 0

    async def one(msgs) -> None:
        nonlocal tokens
        async with sem:
            t0 = time.perf_counter()
            stream = await client.chat.completions.create(
                model=model,
                messages=msgs,
                max_tokens=new_tokens,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
            last, chunks, used = None, 0, None
            async for c in stream:
                if c.usage is not None:
                    used = c.usage.completion_tokens
                if not (c.choices and c.choices[0].delta.content):
                    continue
                now = time.perf_counter()
                if last is None:
                    ttft.append(now - t0)
                else:
                    itl.append(now - last)
                last, chunks = now, chunks + 1
            tokens += used if used is not None else chunks

    t0 = time.perf_counter()
    await asyncio.gather(*(one(m) for m in convs))
    wall = time.perf_counter() - t0
    await client.close()
    return {"wall_s": wall, "tokens": tokens, "ttft": ttft, "itl": itl}


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    if not xs:
        return float("nan")
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def summary(r: dict) -> dict:
    return {
        "tok_per_s": r["tokens"] / r["wall_s"],
        "tokens": r["tokens"],
        "wall_s": r["wall_s"],
        "ttft_p50_s": pct(r["ttft"], 50),
        "ttft_p99_s": pct(r["ttft"], 99),
        "itl_p50_s": pct(r["itl"], 50),
        "itl_p99_s": pct(r["itl"], 99),
    }


def table(res: dict) -> str:
    rows = [
        "| server | tokens/s | TTFT p50 (s) | TTFT p99 (s) | ITL p50 (s) | ITL p99 (s) |",
        "|---|---|---|---|---|---|",
    ]
    for name, s in res.items():
        rows.append(
            f"| {name} | {s['tok_per_s']:.2f} | {s['ttft_p50_s']:.2f} | {s['ttft_p99_s']:.2f} "
            f"| {s['itl_p50_s']:.3f} | {s['itl_p99_s']:.3f} |"
        )
    if "offgraph-kv" in res and "transformers" in res:
        a, b = res["offgraph-kv"], res["transformers"]
        rows.append("")
        rows.append(
            f"throughput {a['tok_per_s'] / b['tok_per_s']:.1f}x transformers serve (target >= 3x);"
            f" TTFT p50 {a['ttft_p50_s'] / b['ttft_p50_s']:.3f}x (target <= 0.2x)"
        )
    if "offgraph-kv" in res:
        a = res["offgraph-kv"]
        rows.append(
            f"offgraph-kv ITL p99 / p50 = {a['itl_p99_s'] / a['itl_p50_s']:.2f} (target <= 3)"
        )
    return "\n".join(rows)


def plot(res: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(res)
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.4))
    for ax, (key, label) in zip(
        axes,
        [
            ("tok_per_s", "generated tokens/s"),
            ("ttft_p50_s", "TTFT p50 (s)"),
            ("itl_p99_s", "inter-token p99 (s)"),
        ],
    ):
        ax.bar(names, [res[n][key] for n in names], color=["#3b7", "#888"][: len(names)])
        ax.set_title(label)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--system-tokens", type=int, default=1024)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kv-dtype", default="float32")
    ap.add_argument("--no-transformers", action="store_true", help="offgraph-kv serve only")
    ap.add_argument("--quick", action="store_true", help="CI: 8 requests, offgraph-kv only")
    ap.add_argument("--json", default=None)
    ap.add_argument("--plot", default=None)
    args = ap.parse_args(argv)
    if args.quick:
        args.requests, args.concurrency, args.system_tokens, args.new_tokens = 8, 4, 128, 8
        args.no_transformers = True

    from offgraph_kv.serve.loading import GEMMA3_TEMPLATE, load, load_tokenizer

    name = "gemma-3-270m"
    tok = load_tokenizer(name)
    tok.chat_template = tok.chat_template or GEMMA3_TEMPLATE
    convs = workload(tok, args.requests, args.system_tokens)
    print(
        f"workload: {args.requests} chat requests, {args.concurrency} concurrent, a shared "
        f"{args.system_tokens}-token system prompt, 32-64 user tokens, {args.new_tokens} new "
        f"tokens, greedy; Gemma 3 270M, {args.threads} threads",
        flush=True,
    )
    res: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        cells = args.system_tokens + args.requests * (64 + args.new_tokens + 64)
        okv = Proc(
            [sys.executable, "-m", "offgraph_kv", "serve", "gemma-3-270m", "--port", str(port)]
            + ["--threads", str(args.threads), "--kv-dtype", args.kv_dtype]
            + ["--n-cells", str(cells), "--max-batch-tokens", "512", "--log-level", "warning"],
            port,
            "/health",
            Path(tmp) / "offgraph-kv.log",
        )
        try:
            r = asyncio.run(replay(okv.url, name, convs, args.concurrency, args.new_tokens))
        finally:
            rc = okv.stop()
        res["offgraph-kv"] = summary(r)
        print(f"offgraph-kv serve (exit {rc}): {json.dumps(res['offgraph-kv'])}", flush=True)
        if not args.no_transformers:
            local = Path(tmp) / "gemma-3-270m"
            model, tok, _ = load("gemma-3-270m")
            model.save_pretrained(local)
            tok.save_pretrained(local)
            del model
            port = free_port()
            code = "import sys; from transformers.cli.transformers import main; sys.exit(main())"
            env_threads = {"OMP_NUM_THREADS": str(args.threads)}
            os.environ.update(env_threads)
            tf = Proc(
                [sys.executable, "-c", code, "serve", str(local), "--continuous-batching"]
                + ["--device", "cpu", "--host", "127.0.0.1", "--port", str(port)],
                port,
                "/health",
                Path(tmp) / "transformers.log",
            )
            try:
                r = asyncio.run(
                    replay(tf.url, str(local), convs, args.concurrency, args.new_tokens)
                )
            finally:
                tf.stop()
            res["transformers"] = summary(r)
            print(f"transformers serve: {json.dumps(res['transformers'])}", flush=True)
    print(table(res))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": res}, f, indent=1)
    if args.plot:
        plot(res, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
