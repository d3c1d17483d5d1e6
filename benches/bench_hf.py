"""Decode speed of a small wide Llama with OffgraphCache against DynamicCache and StaticCache.

The model: 4 layers, hidden 1024, intermediate 2048, 8 heads and 8 KV heads x 128, vocabulary
1024 (so the layer weights dominate), random weights, in ``--dtype`` (float32 by default), one
thread. For each context length every cache is filled with the same random K/V rows
(``cache.update`` per layer, what a prefill does; prefilling 8K tokens through the model on one
thread would take minutes and is not what is measured), then the caches take decode steps
round-robin, one token each, the order rotating every step, so they share the machine's noise.
OffgraphCache keeps its default pools (the model's dtype) under sdpa and under the ``offgraph``
attention; with a 16-bit model it also runs with float32 pools (``kv_dtype="float32"``), what every
pool was before low-precision pools, whose sdpa views are converted to the model's dtype per step.
Reported: the median ms/token of each, the ratios, and the bytes each cache holds.

    python benches/bench_hf.py                     # float32, 2K and 8K context
    python benches/bench_hf.py --dtype bfloat16    # bfloat16 model (and pools)
    python benches/bench_hf.py --quick             # 256 and 1K, a smoke run, nothing written

Full runs write ``docs/bench/hf-decode-<dtype>.json`` and ``.md`` (``--out PREFIX`` to change).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import time

import torch
import transformers
from offgraph_kv.hf import ATTN_NAME, OffgraphCache
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM, StaticCache

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DYNAMIC, STATIC = "DynamicCache (sdpa)", "StaticCache (sdpa)"
OG_SDPA, OG_ATTN = "OffgraphCache (sdpa)", "OffgraphCache (offgraph attn)"
F32_SDPA, F32_ATTN = "OffgraphCache f32 pools (sdpa)", "OffgraphCache f32 pools (offgraph attn)"


def build_model(dtype: torch.dtype) -> LlamaForCausalLM:
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
    model = LlamaForCausalLM(cfg).to(dtype).eval()
    model.generation_config.eos_token_id = None
    return model


def variants(model_dtype: str) -> list[tuple[str, str, str | None]]:
    """(name, attn_implementation, OffgraphCache kv_dtype or None for a transformers cache)."""
    out = [(DYNAMIC, "sdpa", None), (STATIC, "sdpa", None)]
    out += [(OG_SDPA, "sdpa", model_dtype), (OG_ATTN, ATTN_NAME, model_dtype)]
    if model_dtype != "float32":
        out += [(F32_SDPA, "sdpa", "float32"), (F32_ATTN, ATTN_NAME, "float32")]
    return out


def make_cache(model, name: str, attn: str, kv_dtype: str | None, max_len: int):
    # OffgraphCache reads the attention implementation from the config when it is built (the
    # offgraph attention takes the pools as they are, without the per-step dtype conversion).
    model.set_attn_implementation(attn)
    if name == DYNAMIC:
        return DynamicCache(config=model.config)
    if name == STATIC:
        return StaticCache(config=model.config, max_cache_len=max_len)
    return OffgraphCache(model.config, kv_dtype=kv_dtype)


def held_bytes(cache) -> int:
    if isinstance(cache, OffgraphCache):
        return cache.nbytes()
    return sum(t.nbytes for layer in cache.layers for t in (layer.keys, layer.values))


def run_context(model, ctx: int, steps: int, warmup: int, dtype: torch.dtype) -> dict:
    cfg = model.config
    h, d = cfg.num_key_value_heads, cfg.head_dim
    g = torch.Generator().manual_seed(ctx)
    rows = [
        (
            torch.randn(1, h, ctx, d, generator=g).to(dtype),
            torch.randn(1, h, ctx, d, generator=g).to(dtype),
        )
        for _ in range(cfg.num_hidden_layers)
    ]
    model_dtype = str(dtype).removeprefix("torch.")
    caches = {}
    for name, attn, kv_dtype in variants(model_dtype):
        cache = make_cache(model, name, attn, kv_dtype, ctx + steps + warmup + 1)
        for layer, (k, v) in enumerate(rows):
            cache.update(k, v, layer)
        caches[name] = (cache, attn)
    del rows
    names = list(caches)
    times: dict[str, list[float]] = {n: [] for n in names}
    warm: dict[str, list[float]] = {n: [] for n in names}
    tok = torch.tensor([[7]])
    with torch.no_grad():
        for step in range(warmup + steps):
            order = names[step % len(names) :] + names[: step % len(names)]
            for name in order:
                cache, attn = caches[name]
                model.set_attn_implementation(attn)
                t0 = time.perf_counter()
                model(input_ids=tok, cache=cache, use_cache=True)
                dt = time.perf_counter() - t0
                (times if step >= warmup else warm)[name].append(dt * 1e3)
    return {
        "median_ms": {n: statistics.median(ts) for n, ts in times.items()},
        "samples_ms": times,
        "warmup_ms": warm,
        "held_bytes": {n: held_bytes(c) for n, (c, _) in caches.items()},
    }


def table(dtype: str, steps: int, results: dict[int, dict]) -> str:
    names = list(next(iter(results.values()))["median_ms"])
    lines = [
        f"Decode, 4x1024 Llama, {dtype} model, 1 thread, median of {steps} steps (ms/token); "
        f"ratios: the baseline's median over {OG_ATTN}'s (above 1: the offgraph attention is "
        "faster).",
        "",
        "| context | "
        + " | ".join(names)
        + " | Dynamic / offgraph attn | Static / offgraph attn |",
        "|---" * (len(names) + 3) + "|",
    ]
    for ctx, r in results.items():
        m = r["median_ms"]
        cells = " | ".join(f"{m[n]:.1f}" for n in names)
        vs_dyn, vs_sta = m[DYNAMIC] / m[OG_ATTN], m[STATIC] / m[OG_ATTN]
        lines.append(f"| {ctx} | {cells} | {vs_dyn:.2f}x | {vs_sta:.2f}x |")
    lines += ["", "Bytes held by each cache (MiB, all layers):", ""]
    lines.append("| context | " + " | ".join(names) + " |")
    lines.append("|---" * (len(names) + 1) + "|")
    for ctx, r in results.items():
        cells = " | ".join(f"{r['held_bytes'][n] / 2**20:.1f}" for n in names)
        lines.append(f"| {ctx} | {cells} |")
    lines += [
        "",
        "Every cache holds context + decode steps tokens. StaticCache is allocated for exactly "
        "that many; OffgraphCache pools reserve `max_cache_len` rows of address space once and "
        "the OS commits a page when a row on it is first written, so they hold the rows' bytes "
        "(`nbytes()`) and no step pays a copy (see `benches/bench_pools.py`).",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small contexts, few steps")
    ap.add_argument("--dtype", choices=list(DTYPES), default="float32", help="model dtype")
    ap.add_argument("--steps", type=int, default=None, help="decode steps per cache")
    ap.add_argument("--contexts", type=int, nargs="*", default=None)
    ap.add_argument("--out", default=None, help="path prefix of the .json/.md written")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    contexts = args.contexts or ([256, 1024] if args.quick else [2048, 8192])
    steps = args.steps or (6 if args.quick else 24)
    warmup = 2

    model = build_model(DTYPES[args.dtype])
    results: dict[int, dict] = {}
    for ctx in contexts:
        results[ctx] = run_context(model, ctx, steps, warmup, DTYPES[args.dtype])
        med = results[ctx]["median_ms"]
        print(f"context {ctx}: " + ", ".join(f"{n} {m:.1f} ms" for n, m in med.items()))

    md = table(args.dtype, steps, results)
    print()
    print(md)
    out = args.out or (None if args.quick else f"docs/bench/hf-decode-{args.dtype}")
    if out is None:
        return
    meta = {
        "model": "Llama 4 layers x 1024, 8 heads / 8 KV heads x 128, random weights",
        "dtype": args.dtype,
        "threads": 1,
        "steps": steps,
        "warmup": warmup,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "machine": platform.processor() or platform.machine(),
        "load_average_at_end": os.getloadavg(),
    }
    pathlib.Path(out).parent.mkdir(parents=True, exist_ok=True)
    doc = {"meta": meta, "contexts": {str(c): r for c, r in results.items()}}
    pathlib.Path(out + ".json").write_text(json.dumps(doc, indent=1) + "\n")
    pathlib.Path(out + ".md").write_text(md)
    print(f"wrote {out}.json and {out}.md")


if __name__ == "__main__":
    main()
