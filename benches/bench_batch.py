"""Many requests sharing a prefix on Gemma 3 270M (float32, CPU), side by side in one run.

Workload: N requests, a shared prefix of P tokens plus D distinct tokens each, M new tokens each,
greedy. Compared, in one process on one loaded model:

* ``BatchGenerator`` (one KvCellCache, one forward per step, prefix forks);
* ``model.generate`` one request at a time with ``DynamicCache``;
* one left-padded batch (all prompts have the same length here) with ``OffgraphCache``;
* transformers' ``generate_batch`` (continuous batching, paged cache), if it exists; run last
  because it may switch the model's attention implementation.

Then ``BatchGenerator`` alone at other request counts (``--sweep``): wall time, tokens/s and the
cells held against what unshared sequences would hold. Prints a markdown table (and writes JSON
with ``--json``); ``--plot`` draws wall times and the sweep.

    python benches/bench_batch.py                      # 16 requests, 1024 + 32 tokens, 32 new
    python benches/bench_batch.py --sweep 4,16,64 --json batch.json --plot batch.png
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch


def load_model():
    from offgraph_kv.serve.loading import load

    model = load("gemma-3-270m")[0]
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def workload(n: int, prefix: int, distinct: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    shared = torch.randint(100, 20000, (prefix,), generator=g).tolist()
    return [shared + torch.randint(100, 20000, (distinct,), generator=g).tolist() for _ in range(n)]


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def run_batch_generator(model, prompts, new, max_batch_tokens):
    from offgraph_kv.hf import BatchGenerator

    cells = sum(len(p) + new for p in prompts)  # enough for every request unshared
    gen = BatchGenerator(
        model, n_cells=cells, n_seq_max=len(prompts) + 1, max_batch_tokens=max_batch_tokens
    )
    peak = {"cells_used": 0, "cells_unshared": 0}

    def go():
        for p in prompts:
            gen.add(p, new)
        out: dict[int, list[int]] = {}
        while gen.has_work:
            for rid, tok in gen.step():
                out.setdefault(rid, []).append(tok)
            st = gen.stats
            if st["cells_used"] > peak["cells_used"]:
                peak.update(cells_used=st["cells_used"], cells_unshared=st["cells_unshared"])
        gen.run()
        return [out[r] for r in sorted(out)]

    secs, outs = timed(go)
    return secs, outs, {**gen.stats, **{f"peak_{k}": v for k, v in peak.items()}}


def run_one_at_a_time(model, prompts, new):
    from transformers import DynamicCache

    def go():
        outs = []
        for p in prompts:
            with torch.no_grad():
                o = model.generate(
                    torch.tensor([p]),
                    cache=DynamicCache(config=model.config),
                    max_new_tokens=new,
                    do_sample=False,
                )
            outs.append(o[0, len(p) :].tolist())
        return outs

    return timed(go)


def run_padded_offgraph(model, prompts, new):
    from offgraph_kv.hf import OffgraphCache

    width = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1

    def go():
        with torch.no_grad():
            o = model.generate(
                ids,
                attention_mask=mask,
                cache=OffgraphCache(model.config),
                max_new_tokens=new,
                do_sample=False,
            )
        return [row[width:].tolist() for row in o]

    return timed(go)


def run_generate_batch(model, prompts, new):
    from transformers import GenerationConfig

    if not hasattr(model, "generate_batch"):
        return None, None
    cfg = GenerationConfig(max_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=0)

    def go():
        with torch.no_grad():
            res = model.generate_batch(prompts, generation_config=cfg, progress_bar=False)
        order = sorted(res.values(), key=lambda r: int(str(r.request_id).split("_")[-1]))
        return [list(r.generated_tokens) for r in order]

    return timed(go)


def sweep_row(n, secs, st, new):
    return {
        "requests": n,
        "seconds": secs,
        "tokens_per_s": n * new / secs,
        "peak_cells_used": st["peak_cells_used"],
        "peak_cells_unshared": st["peak_cells_unshared"],
        "prefix_tokens_reused": st["prefix_tokens_reused"],
        "steps": st["steps"],
    }


def mismatches(ref, got):
    if got is None:
        return None
    return sum(a != b for a, b in zip(ref, got))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--prefix", type=int, default=1024)
    ap.add_argument("--distinct", type=int, default=32)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--max-batch-tokens", type=int, default=512)
    ap.add_argument("--sweep", default="4,64", help="request counts for BatchGenerator alone")
    ap.add_argument("--skip", default="", help="comma list of: one,padded,generate_batch")
    ap.add_argument(
        "--subset",
        type=int,
        default=0,
        help="time the one-at-a-time and padded baselines on the first K requests only and "
        "scale by N/K (labelled in the table); 0: all",
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json")
    ap.add_argument("--plot")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    skip = set(filter(None, args.skip.split(",")))
    model = load_model()
    prompts = workload(args.requests, args.prefix, args.distinct)
    n_tok = args.requests * args.new
    rows = []

    warm = workload(2, 16, 4, seed=1)  # first-call costs out of the timings
    run_batch_generator(model, warm, 2, args.max_batch_tokens)
    run_one_at_a_time(model, warm[:1], 2)

    secs, bg_out, st = run_batch_generator(model, prompts, args.new, args.max_batch_tokens)
    rows.append({"method": "BatchGenerator", "seconds": secs, "mismatches": 0, "stats": st})
    print(f"BatchGenerator: {secs:.1f} s", file=sys.stderr)
    sweep = [sweep_row(args.requests, secs, st, args.new)]  # the headline run is a point too
    for n in [int(x) for x in args.sweep.split(",") if x and int(x) != args.requests]:
        ps = workload(n, args.prefix, args.distinct, seed=2)
        secs, _, s = run_batch_generator(model, ps, args.new, args.max_batch_tokens)
        sweep.append(sweep_row(n, secs, s, args.new))
        print(f"sweep {n}: {secs:.1f} s", file=sys.stderr)
    sweep.sort(key=lambda r: r["requests"])
    k = args.subset if 0 < args.subset < args.requests else args.requests
    scale = args.requests / k
    label = "" if k == args.requests else f" ({k} of {args.requests} timed, x{scale:g})"
    if "one" not in skip:
        secs, out = run_one_at_a_time(model, prompts[:k], args.new)
        secs *= scale
        rows.append(
            {
                "method": "generate, one at a time, DynamicCache" + label,
                "seconds": secs,
                "mismatches": mismatches(out, bg_out),
            }
        )
        print(f"one at a time: {secs:.1f} s", file=sys.stderr)
    if "padded" not in skip:
        secs, out = run_padded_offgraph(model, prompts[:k], args.new)
        secs *= scale
        rows.append(
            {
                "method": "generate, left-padded batch, OffgraphCache" + label,
                "seconds": secs,
                "mismatches": mismatches(out, bg_out),
            }
        )
        print(f"padded batch: {secs:.1f} s", file=sys.stderr)
    if "generate_batch" not in skip:
        try:
            secs, out = run_generate_batch(model, prompts, args.new)
        except Exception as e:  # report, do not hide: the row says it failed
            secs, out = None, None
            print(f"generate_batch failed: {e!r}", file=sys.stderr)
        if secs is not None:
            rows.append(
                {
                    "method": "transformers generate_batch",
                    "seconds": secs,
                    "mismatches": mismatches(out, bg_out),
                }
            )
            print(f"generate_batch: {secs:.1f} s", file=sys.stderr)

    base = rows[0]["seconds"]
    print(
        f"\n{args.requests} requests, {args.prefix}-token shared prefix + {args.distinct} "
        f"distinct tokens, {args.new} new tokens each, greedy, Gemma 3 270M float32, "
        f"{args.threads} threads\n"
    )
    print(
        "| method | wall s | new tokens/s | time / BatchGenerator "
        "| outputs differing from BatchGenerator |"
    )
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['method']} | {r['seconds']:.1f} | {n_tok / r['seconds']:.1f} | "
            f"{r['seconds'] / base:.2f}x | {r['mismatches']} |"
        )

    if sweep:
        print(
            "\n| requests | wall s | new tokens/s | prefix tokens reused | steps "
            "| peak cells held | unshared |"
        )
        print("|---:|---:|---:|---:|---:|---:|---:|")
        for r in sweep:
            print(
                f"| {r['requests']} | {r['seconds']:.1f} | {r['tokens_per_s']:.1f} | "
                f"{r['prefix_tokens_reused']} | {r['steps']} | {r['peak_cells_used']} | "
                f"{r['peak_cells_unshared']} |"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows, "sweep": sweep}, f, indent=1)
    if args.plot:
        plot(rows, sweep, args.plot)
    return 0


def plot(rows, sweep, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    a.barh([r["method"] for r in rows], [r["seconds"] for r in rows])
    a.set_xlabel("wall time, s (lower is better)")
    a.invert_yaxis()
    if sweep:
        n = [r["requests"] for r in sweep]
        b.plot(n, [r["peak_cells_used"] for r in sweep], "o-", label="cells held")
        b.plot(n, [r["peak_cells_unshared"] for r in sweep], "o--", label="unshared")
        b.set_xlabel("requests")
        b.set_ylabel("cells")
        b.legend()
    fig.tight_layout()
    fig.savefig(path)


if __name__ == "__main__":
    raise SystemExit(main())
