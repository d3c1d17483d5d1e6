"""``offgraph-kv bench``: the byte-layer and attention comparisons in one
process, side by side, written as a Markdown table and PNG plots.

- Cache update: per layer-step cost of writing one decode token's K/V and
  getting what attention reads (Llama-3-8B layer shapes: 8 KV heads x 128,
  f32): ``KvSequenceCache.update``, transformers' ``DynamicCache.update``
  (concatenates: O(context)), an in-place torch slice write.
- Decode attention (8 KV heads, 32 query heads, head_dim 128, T = 1, cold
  cache: a buffer larger than the last-level cache is read between
  repetitions): offgraph-kv's backends, torch ``scaled_dot_product_attention``
  (``enable_gqa=True``, and with the query-head group folded into rows), and a
  plain read of the same K and V bytes (the memory floor).

Medians of repeated runs; needs torch, transformers and matplotlib
(``pip install offgraph-kv[hf,bench]``).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from .. import _native as n

HEADS, DIM, LAYERS, Q_HEADS = 8, 128, 32, 32
_FLUSH = None


def _flush() -> None:
    """Evict the caches: read a buffer larger than the last-level cache."""
    global _FLUSH
    if _FLUSH is None:
        _FLUSH = np.ones(96 << 18, np.float32)  # 96 MiB
    _FLUSH.sum()


def _median_us(samples: list[int], per: int = 1) -> float:
    return statistics.median(samples) / per / 1e3


# ---------------------------------------------------------------- cache update


def update_okv(context: int, reps: int) -> float:
    cfg = n.CacheConfig(
        context + 16,
        LAYERS,
        n.LayerConfig(n.Flat(), HEADS, DIM),
        initial_capacity=64,
        max_step=min(512, context + 16),
    )
    kv = n.KvSequenceCache(cfg)
    chunk = np.full((HEADS, 512, DIM), 0.5, np.float32)
    done = 0
    while done < context:
        t = min(512, context - done)
        kv.begin_step(t)
        for layer in range(LAYERS):
            kv.update(layer, chunk[:, :t], chunk[:, :t])
        done += t
    k = np.ones((HEADS, 1, DIM), np.float32)
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        kv.begin_step(1)
        for layer in range(LAYERS):
            kv.update(layer, k, k)
        kv.rewind(context)
        samples.append(time.perf_counter_ns() - t0)
    return _median_us(samples, LAYERS)


def update_dynamic(context: int, reps: int) -> float:
    import torch
    from transformers import DynamicCache

    cache = DynamicCache()
    base = torch.full((1, HEADS, context, DIM), 0.5)
    cache.update(base, base.clone(), 0)
    k = torch.ones((1, HEADS, 1, DIM))
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        out_k, _ = cache.update(k, k, 0)
        samples.append(time.perf_counter_ns() - t0)
        cache.crop(-1)
    assert out_k.shape[2] == context + 1
    return _median_us(samples)


def update_torch_inplace(context: int, reps: int) -> float:
    import torch

    pool_k = torch.zeros((1, HEADS, context + 16, DIM))
    pool_v = torch.zeros((1, HEADS, context + 16, DIM))
    k = torch.ones((1, HEADS, 1, DIM))
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        pool_k[:, :, context : context + 1] = k
        pool_v[:, :, context : context + 1] = k
        views = pool_k[:, :, : context + 1], pool_v[:, :, : context + 1]
        samples.append(time.perf_counter_ns() - t0)
    assert views[0].shape[2] == context + 1
    return _median_us(samples)


# ---------------------------------------------------------------- attention


def decode_spec(context: int, last_step: int = 1):
    """A one-layer flat KvSequenceCache (8 KV heads x 128) filled with random
    rows up to ``context`` tokens, the last ``last_step`` of them in an open
    step; returns the cache and that step's spec."""
    cfg = n.CacheConfig(
        context,
        1,
        n.LayerConfig(n.Flat(), HEADS, DIM),
        initial_capacity=context,
        max_step=min(512, context),
    )
    kv = n.KvSequenceCache(cfg)
    rng = np.random.default_rng(0)
    done = 0
    while done < context - last_step:
        t = min(512, context - last_step - done)
        kv.begin_step(t)
        rows = rng.standard_normal((HEADS, t, DIM)).astype(np.float32)
        kv.update(0, rows, rows)
        done += t
    kv.begin_step(last_step)
    rows = rng.standard_normal((HEADS, last_step, DIM)).astype(np.float32)
    return kv, kv.update(0, rows, rows)


def _timed(fn, reps: int) -> float:
    samples = []
    for _ in range(reps):
        _flush()
        t0 = time.perf_counter_ns()
        fn()
        samples.append(time.perf_counter_ns() - t0)
    return _median_us(samples)


def attention_row(context: int, reps: int, threads: int) -> dict:
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    kv, spec = decode_spec(context)
    q = np.random.default_rng(1).standard_normal((Q_HEADS, 1, DIM)).astype(np.float32)
    k_np, v_np = spec.k[:, :context], spec.v[:, :context]
    kt, vt = torch.from_numpy(k_np.copy())[None], torch.from_numpy(v_np.copy())[None]
    qt = torch.from_numpy(q)[None]  # [1, 32, 1, 128]
    q_fold = qt.reshape(1, HEADS, Q_HEADS // HEADS, DIM)  # group folded into rows
    ref = n.attend(q, spec, backend="native", threads=threads)
    got = F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
    assert np.allclose(ref, got[0].numpy(), atol=1e-4)
    row = {
        "context": context,
        "threads": threads,
        "read floor": _timed(lambda: (k_np.sum(), v_np.sum()), reps),
        "offgraph-kv native": _timed(
            lambda: n.attend(q, spec, backend="native", threads=threads), reps
        ),
        "offgraph-kv xnnpack": _timed(
            lambda: n.attend(q, spec, backend="xnnpack", threads=threads), reps
        ),
        "torch sdpa gqa": _timed(
            lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True), reps
        ),
        "torch sdpa folded": _timed(lambda: F.scaled_dot_product_attention(q_fold, kt, vt), reps),
    }
    del kv
    return row


# ---------------------------------------------------------------- report


def _table(rows: list[dict], cols: list[str], unit: str, ratio_to: str, key: str) -> str:
    head = f"| {key} | " + " | ".join(f"{c} ({unit})" for c in cols) + f" | vs {ratio_to} |"
    out = [head, "|---" * (len(cols) + 2) + "|"]
    for r in rows:
        label = f"{r['context']}" + (f", {r['threads']} thr" if "threads" in r else "")
        cells = " | ".join(f"{r[c]:.2f}" for c in cols)
        ratios = ", ".join(
            f"{c.replace('offgraph-kv ', '')} {r[c] / r[ratio_to]:.2f}x"
            for c in cols
            if c != ratio_to
        )
        out.append(f"| {label} | {cells} | {ratios} |")
    return "\n".join(out)


def _plot(rows: list[dict], cols: list[str], title: str, path: Path, ylabel: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    groups = sorted({r.get("threads", 0) for r in rows})
    for g in groups:
        sub = [r for r in rows if r.get("threads", 0) == g]
        xs = [r["context"] for r in sub]
        for c in cols:
            suffix = f" ({g} thr)" if g else ""
            style = "--" if g and g > 1 else "-"
            ax.plot(xs, [r[c] for r in sub], style, marker="o", label=c + suffix)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(out_dir: Path, quick: bool = False) -> str:
    import torch

    out_dir.mkdir(parents=True, exist_ok=True)
    contexts = [256, 1024] if quick else [512, 2048, 8192]
    reps = 30 if quick else 200
    torch.set_num_threads(1)
    upd = [
        {
            "context": c,
            "offgraph-kv": update_okv(c, reps),
            "torch in-place": update_torch_inplace(c, reps * 4),
            "DynamicCache": update_dynamic(c, max(5, reps // 10)),
        }
        for c in contexts
    ]
    threads = [1] if quick else [1, 2]
    att = [attention_row(c, max(5, reps // 10), t) for t in threads for c in contexts]
    upd_cols = ["offgraph-kv", "torch in-place", "DynamicCache"]
    att_cols = [
        "read floor",
        "offgraph-kv native",
        "offgraph-kv xnnpack",
        "torch sdpa gqa",
        "torch sdpa folded",
    ]
    md = [
        "## Cache update, one decode token, per layer-step (median µs)",
        "",
        _table(upd, upd_cols, "µs", "offgraph-kv", "context"),
        "",
        "## Decode attention, 8 KV / 32 query heads x 128, cold cache (median µs)",
        "",
        _table(att, att_cols, "µs", "read floor", "context"),
        "",
    ]
    text = "\n".join(md)
    (out_dir / "bench.md").write_text(text)
    _plot(upd, upd_cols, "KV cache update per layer-step", out_dir / "update.png", "µs")
    _plot(att, att_cols, "Decode attention (cold cache)", out_dir / "attention.png", "µs")
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="offgraph-kv bench", description=__doc__.splitlines()[0])
    add_arguments(ap)
    args = ap.parse_args(argv)
    return cmd(args)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--quick", action="store_true", help="a reduced set (for CI)")
    ap.add_argument("--out", default="results", help="results folder (default ./results)")


def cmd(args: argparse.Namespace) -> int:
    text = run(Path(args.out), quick=args.quick)
    print(text)
    print(f"wrote {args.out}/bench.md, {args.out}/update.png, {args.out}/attention.png")
    return 0
