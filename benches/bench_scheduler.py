"""BatchGenerator's scheduling cost per step against the number of held sequences.

The model's forward is replaced by a stub returning zero logits, so a step's time is the
scheduler's: decoders' tokens, prompt chunks, admissions (finding each new prompt's fork source
among the held sequences), ``begin_step`` and the bookkeeping after the forward.

Workload per configuration: ``held`` finished sequences stay cached (a shared system prompt plus
distinct tokens each); then ``waiting`` prompts arrive at once, each extending one of the held
sequences (so each is admitted as a fork of it), and run to completion. Reported: the median
time of a step over the whole run, at each held count, interleaved over ``--repeats`` rounds;
the ratio of the largest held count's median to the smallest's is what the index keeps flat.

    python benches/bench_scheduler.py                       # held 10 and 1000, 100 waiting
    python benches/bench_scheduler.py --held 10,300 --waiting 30 --repeats 1   # the CI form
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import torch


def tiny_model(vocab: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        num_hidden_layers=1,
        hidden_size=32,
        intermediate_size=32,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        vocab_size=vocab,
    )
    return LlamaForCausalLM(cfg).eval()


def run_one(
    held: int,
    waiting: int,
    system: int,
    distinct: int,
    extra: int,
    new: int,
    mbt: int,
    on_measure=None,
):
    """Median and count of step times (seconds) for one configuration; ``on_measure()`` is
    called once the held sequences are in place, before the waiting prompts arrive."""
    from offgraph_kv.hf import BatchGenerator

    vocab = 1000
    model = tiny_model(vocab)
    rnd = random.Random(held)
    sys_prompt = [rnd.randrange(1, vocab) for _ in range(system)]
    held_prompts = [
        sys_prompt + [rnd.randrange(1, vocab) for _ in range(distinct)] for _ in range(held)
    ]
    cells = held * (system + distinct) + waiting * (system + distinct + extra + new) + 64
    gen = BatchGenerator(model, n_cells=cells, n_seq_max=held + waiting + 1, max_batch_tokens=mbt)

    def stub_forward(tokens, positions, rows):
        return torch.zeros(len(rows), vocab)

    gen._forward = stub_forward
    gen.generate(held_prompts, 1)  # each finishes at once and stays cached
    assert gen.stats["cached_sequences"] == held
    if on_measure is not None:
        on_measure()
    for _ in range(waiting):
        src = held_prompts[rnd.randrange(held)]
        gen.add(src + [rnd.randrange(1, vocab) for _ in range(extra)], new)
    times = []
    while gen.has_work:
        t0 = time.perf_counter()
        gen.step()
        times.append(time.perf_counter() - t0)
    gen.run()
    st = gen.stats
    assert st["forks"] >= waiting, st  # every waiting prompt forked its held source
    return statistics.median(times), len(times), st["prefix_tokens_reused"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--held", default="10,1000", help="held sequence counts, comma separated")
    ap.add_argument("--waiting", type=int, default=100)
    ap.add_argument("--system", type=int, default=32, help="system prompt tokens (shared)")
    ap.add_argument("--distinct", type=int, default=32, help="distinct tokens per held sequence")
    ap.add_argument("--extra", type=int, default=16, help="new prompt tokens per waiting prompt")
    ap.add_argument("--new", type=int, default=8, help="tokens generated per waiting prompt")
    ap.add_argument("--max-batch-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    helds = [int(x) for x in args.held.split(",")]
    meds: dict[int, list[float]] = {h: [] for h in helds}
    steps: dict[int, int] = {}
    for _ in range(args.repeats):  # interleaved: each round runs every held count
        for h in helds:
            med, n, _reused = run_one(
                h,
                args.waiting,
                args.system,
                args.distinct,
                args.extra,
                args.new,
                args.max_batch_tokens,
            )
            meds[h].append(med)
            steps[h] = n
    base = statistics.median(meds[helds[0]])
    print(f"{args.waiting} waiting prompts, max_batch_tokens {args.max_batch_tokens}, stub forward")
    print("| held sequences | steps | median step (ms) | ratio to held " + f"{helds[0]} |")
    print("|---|---|---|---|")
    rows = []
    for h in helds:
        m = statistics.median(meds[h])
        rows.append({"held": h, "steps": steps[h], "median_step_s": m, "ratio": m / base})
        print(f"| {h} | {steps[h]} | {m * 1e3:.3f} | {m / base:.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
