"""Byte-layer comparison: per layer-step cost of writing one decode token's
K/V and fetching what attention reads, Llama-3-8B layer shapes (8 KV heads x
128 dims, f32), at several contexts, side by side in one process:

- offgraph-kv ``KvSequenceCache.update`` from Python (returns the AttendSpec);
- transformers ``DynamicCache.update`` (concatenates: O(context) per step);
- an in-place torch slice write into a preallocated tensor (the floor of what
  any Python-side cache can do).

Prints a Markdown table of medians (microseconds per layer-step) and ratios.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import offgraph_kv as okv

HEADS, DIM, LAYERS = 8, 128, 32


def median_us(samples_ns: list[int], per: int = 1) -> float:
    return statistics.median(samples_ns) / per / 1e3


def bench_okv(context: int, reps: int) -> float:
    cfg = okv.CacheConfig(
        context + 16,
        LAYERS,
        okv.LayerConfig(okv.Flat(), HEADS, DIM),
        initial_capacity=64,
        max_step=512,
    )
    kv = okv.KvSequenceCache(cfg)
    chunk = np.full((HEADS, 512, DIM), 0.5, np.float32)
    done = 0
    while done < context:
        t = min(512, context - done)
        kv.begin_step(t)
        for layer in range(LAYERS):
            kv.update(layer, chunk[:, :t], chunk[:, :t])
        done += t
    k = np.ones((HEADS, 1, DIM), np.float32)
    v = np.ones((HEADS, 1, DIM), np.float32)
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        kv.begin_step(1)
        for layer in range(LAYERS):
            kv.update(layer, k, v)
        kv.rewind(context)
        samples.append(time.perf_counter_ns() - t0)
    return median_us(samples, LAYERS)


def bench_dynamic(context: int, reps: int) -> float:
    import torch
    from transformers import DynamicCache

    cache = DynamicCache()
    base_k = torch.full((1, HEADS, context, DIM), 0.5)
    cache.update(base_k, base_k.clone(), 0)
    k = torch.ones((1, HEADS, 1, DIM))
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        out_k, _ = cache.update(k, k, 0)
        samples.append(time.perf_counter_ns() - t0)
        cache.crop(-1)
    assert out_k.shape[2] == context + 1
    return median_us(samples)


def bench_torch_inplace(context: int, reps: int) -> float:
    import torch

    pool_k = torch.zeros((1, HEADS, context + 16, DIM))
    pool_v = torch.zeros((1, HEADS, context + 16, DIM))
    k = torch.ones((1, HEADS, 1, DIM))
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        pool_k[:, :, context : context + 1] = k
        pool_v[:, :, context : context + 1] = k
        view_k, view_v = pool_k[:, :, : context + 1], pool_v[:, :, : context + 1]
        samples.append(time.perf_counter_ns() - t0)
    assert view_k.shape[2] == context + 1 and view_v.shape[2] == context + 1
    return median_us(samples)


def run(contexts: list[int], reps: int) -> list[dict]:
    import torch

    torch.set_num_threads(1)
    rows = []
    for ctx in contexts:
        rows.append(
            {
                "context": ctx,
                "offgraph-kv": bench_okv(ctx, reps),
                "torch in-place": bench_torch_inplace(ctx, reps * 4),
                "DynamicCache": bench_dynamic(ctx, max(5, reps // 20)),
            }
        )
    return rows


def table(rows: list[dict]) -> str:
    cols = ["offgraph-kv", "torch in-place", "DynamicCache"]
    out = [
        "| context | " + " | ".join(f"{c} (µs)" for c in cols) + " | DynamicCache / offgraph-kv |",
        "|---" * (len(cols) + 2) + "|",
    ]
    for r in rows:
        cells = " | ".join(f"{r[c]:.2f}" for c in cols)
        out.append(f"| {r['context']} | {cells} | {r['DynamicCache'] / r['offgraph-kv']:.0f}x |")
    first, last = rows[0]["offgraph-kv"], rows[-1]["offgraph-kv"]
    out.append(
        f"\noffgraph-kv at {rows[-1]['context']} / at {rows[0]['context']}: {last / first:.2f}x"
    )
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", type=int, nargs="+", default=[512, 2048, 8192])
    ap.add_argument("--reps", type=int, default=400)
    args = ap.parse_args()
    print(table(run(args.contexts, args.reps)))


if __name__ == "__main__":
    main()
