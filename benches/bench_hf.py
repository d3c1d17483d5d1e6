"""Decode speed of a small wide Llama with OffgraphCache against DynamicCache and StaticCache.

The model: 4 layers, hidden 1024, intermediate 2048, 8 heads and 8 KV heads x 128, vocabulary
1024 (so the ~160 MB of layer weights dominate), random weights, float32, one thread. For each
context length every cache is filled with the same random K/V rows (``cache.update`` per layer, what
a prefill does; prefilling 8K tokens through the model on one thread would take minutes and is not
what is measured), then the caches take decode steps round-robin, one token each, so they share the
machine's noise. Reported: the median ms/token of each and the ratios.

    python benches/bench_hf.py            # 2K and 8K context
    python benches/bench_hf.py --quick    # 256 and 1K, a smoke run
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from offgraph_kv.hf import ATTN_NAME, OffgraphCache
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM, StaticCache


def build_model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(
        num_hidden_layers=4,
        hidden_size=1024,
        intermediate_size=2048,
        num_attention_heads=8,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=1024,
        max_position_embeddings=16384,
    )
    model = LlamaForCausalLM(cfg).eval()
    model.generation_config.eos_token_id = None
    return model


def fill(cache, rows: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    for layer, (k, v) in enumerate(rows):
        cache.update(k, v, layer)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small contexts, few steps")
    ap.add_argument("--steps", type=int, default=None, help="decode steps per cache")
    ap.add_argument("--contexts", type=int, nargs="*", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    contexts = args.contexts or ([256, 1024] if args.quick else [2048, 8192])
    steps = args.steps or (6 if args.quick else 24)
    warmup = 2

    model = build_model()
    cfg = model.config
    h, d = cfg.num_key_value_heads, cfg.head_dim
    names = ["DynamicCache", "StaticCache", "OffgraphCache (sdpa)", "OffgraphCache + attend"]
    results: dict[int, dict[str, float]] = {}
    for ctx in contexts:
        g = torch.Generator().manual_seed(ctx)
        rows = [
            (torch.randn(1, h, ctx, d, generator=g), torch.randn(1, h, ctx, d, generator=g))
            for _ in range(cfg.num_hidden_layers)
        ]
        caches = {
            names[0]: (DynamicCache(config=cfg), "sdpa"),
            names[1]: (StaticCache(config=cfg, max_cache_len=ctx + steps + warmup + 1), "sdpa"),
            names[2]: (OffgraphCache(cfg), "sdpa"),
            names[3]: (OffgraphCache(cfg), ATTN_NAME),
        }
        for cache, _ in caches.values():
            fill(cache, rows)
        del rows
        times: dict[str, list[float]] = {n: [] for n in names}
        tok = torch.tensor([[7]])
        with torch.no_grad():
            for step in range(warmup + steps):
                for name, (cache, attn) in caches.items():
                    model.set_attn_implementation(attn)
                    t0 = time.perf_counter()
                    model(input_ids=tok, cache=cache, use_cache=True)
                    dt = time.perf_counter() - t0
                    if step >= warmup:
                        times[name].append(dt * 1e3)
        results[ctx] = {n: statistics.median(ts) for n, ts in times.items()}
        print(f"context {ctx}: " + ", ".join(f"{n} {m:.1f} ms" for n, m in results[ctx].items()))
        del caches

    print()
    print(f"Decode, 1 thread, f32, median of {steps} steps (ms/token); ratios are speed-ups.")
    print()
    print("| context | " + " | ".join(names) + " | + attend vs Dynamic | + attend vs Static |")
    print("|---" * (len(names) + 3) + "|")
    for ctx, r in results.items():
        cells = " | ".join(f"{r[n]:.1f}" for n in names)
        vs_dyn = r[names[0]] / r[names[3]]
        vs_sta = r[names[1]] / r[names[3]]
        print(f"| {ctx} | {cells} | {vs_dyn:.2f}x | {vs_sta:.2f}x |")


if __name__ == "__main__":
    main()
