"""What constrained decoding costs per token, on the two real GGUF vocabularies (SmolLM2's 49,152
tokens, Gemma 3's 262,144), and whether computing the masks during the forward matters.

1. The grammar tokenizer's build time (once per generator), then, walking a JSON reply token by
   token under a JSON schema: llguidance's mask per token (``fill``) and the mask applied to a
   logits row (``apply``: unpack the bits, ``-inf`` the rest), median and p99.
2. BatchGenerator on the model: ``--streams`` greedy requests decoding together, half of them
   under the schema, with the masks computed on a thread during the forward and then after it
   (``gen.masks.overlap = False``): per step, the masks' compute time and the part of it the
   step waited for (all of it when computed after the forward), and the step's time.

    python benches/bench_constraint.py [--model smollm2-135m] [--streams 16] [--new-tokens 48]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
REPLY = '{"name": "Ada Lovelace", "age": 36, "tags": ["mathematics", "engines", "poetry"]}'


def gguf(name: str) -> str:
    from offgraph_kv.serve.loading import resolve

    where, file, _ = resolve(name)
    return os.path.join(where, file)


def mask_costs(model) -> dict:
    from offgraph_kv.batch import Constraint
    from offgraph_kv.batch.guide import Guide, StepMasks, grammar_tokenizer, masked

    t0 = time.perf_counter()
    llt = grammar_tokenizer(model.tokenizer, model.vocab_size, model.eos_token_ids)
    build = time.perf_counter() - t0
    guide = Guide(llt, Constraint.json_schema(SCHEMA))
    masks = StepMasks(model.vocab_size, overlap=False)
    row = np.zeros(model.vocab_size, np.float32)
    fill, apply = [], []
    for tok in model.tokenizer.encode(REPLY, False):  # the reply the schema allows
        t0 = time.perf_counter()
        masks.start([guide])
        m = masks.rows()
        t1 = time.perf_counter()
        masked(row, m[0])
        t2 = time.perf_counter()
        guide.advance(tok)
        fill.append(t1 - t0)
        apply.append(t2 - t1)
    return {
        "vocab": model.vocab_size,
        "build_s": build,
        "fill_p50_us": statistics.median(fill) * 1e6,
        "fill_p99_us": float(np.percentile(fill, 99)) * 1e6,
        "apply_p50_us": statistics.median(apply) * 1e6,
        "tokens": len(fill),
    }


def step_time(model, streams: int, new: int, overlap: bool) -> dict:
    from offgraph_kv.batch import BatchGenerator, Constraint

    tok = model.tokenizer
    gen = BatchGenerator(model, n_cells=4096, max_batch_tokens=512)
    gen.masks.overlap = overlap
    gen.prepare_constraints()
    c = Constraint.json_schema(SCHEMA)
    rids = []
    for i in range(streams):
        ids = tok.encode(f"Person number {i}, described as JSON with name, age and tags:", False)
        rids.append(gen.add(ids, new, constraint=c if i % 2 == 0 else None))
    while gen.has_work and any(gen.request_info(r)["generated_tokens"] == 0 for r in rids):
        gen.step()  # past the prompts: time decode steps only
    compute, waited, steps = [0.0], [0.0], []
    inner_compute, inner_rows = gen.masks._compute, gen.masks.rows

    def timed_compute(guides):
        t0 = time.perf_counter()
        try:
            return inner_compute(guides)
        finally:
            compute[0] += time.perf_counter() - t0

    def timed_rows():
        t0 = time.perf_counter()
        try:
            return inner_rows()
        finally:
            waited[0] += time.perf_counter() - t0

    gen.masks._compute, gen.masks.rows = timed_compute, timed_rows
    while gen.has_work:
        t0 = time.perf_counter()
        gen.step()
        steps.append(time.perf_counter() - t0)
    n = len(steps)
    exposed = waited[0] if overlap else compute[0]
    return {
        "steps": n,
        "compute_ms": compute[0] / n * 1e3,
        "exposed_ms": exposed / n * 1e3,
        "step_ms": statistics.median(steps) * 1e3,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    from offgraph_kv.gguf_model import GgufModel

    for name in ("smollm2-135m", "gemma-3-270m"):
        r = mask_costs(GgufModel(gguf(name), threads=args.threads))
        print(
            f"{name}: vocab {r['vocab']}, grammar tokenizer built in {r['build_s']:.2f} s; "
            f"per token over {r['tokens']} tokens: mask {r['fill_p50_us']:.0f} us p50 "
            f"({r['fill_p99_us']:.0f} p99), applied to the row {r['apply_p50_us']:.0f} us p50",
            flush=True,
        )
    model = GgufModel(gguf(args.model), threads=args.threads)
    for overlap in (True, False):
        r = step_time(model, args.streams, args.new_tokens, overlap)
        print(
            f"{args.model}, {args.streams} streams decoding, half constrained, masks "
            f"{'during' if overlap else 'after'} the forward: per step (over {r['steps']}) masks "
            f"{r['compute_ms']:.3f} ms computed, {r['exposed_ms']:.3f} ms added to the step; "
            f"step {r['step_ms']:.1f} ms p50",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
