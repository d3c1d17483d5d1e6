"""Plots decode attention time and bytes per token per pool dtype.

Decode times are the medians of the last ``cargo bench --bench precision`` run, read from
criterion's output (``target/criterion/precision_threads{1,2}/<dtype>/<ctx>/new``); whatever
cases exist are drawn, each bar labelled with its ratio to float32 in the same case and marked
with the streaming read of its own bytes (the floor) when that was measured. Bytes per token
(K + V, all layers) are what the library's pools hold per slot for a Gemma-3-270M-shaped and a
Llama-3-8B-shaped cache.

    python benches/plot_precision.py                       # -> docs/bench/precision.png
    python benches/plot_precision.py --criterion DIR --out PATH
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
DTYPES = ("float32", "float16", "bfloat16", "q8_0")
THREADS = (1, 2)
CONTEXTS = (2048, 8192)
# name: (layers, kv heads, head_dim); the shapes the precision bench prints bytes/token for.
SHAPES = {"Gemma-3-270M": (18, 1, 256), "Llama-3-8B": (32, 8, 128)}

Case = tuple[int, int]  # (threads, context)


def _median_ms(path: pathlib.Path) -> float | None:
    try:
        doc = json.loads(path.read_text())
        return float(doc["median"]["point_estimate"]) / 1e6
    except (OSError, ValueError, KeyError, TypeError):
        return None


def read_medians(criterion: pathlib.Path) -> dict[Case, dict[str, float]]:
    """``{(threads, ctx): {name: median ms}}`` for the precision bench cases found, where a name
    is a dtype (native decode) or ``floor_<dtype>``. A case without its float32 time is left
    out: every bar is drawn against it."""
    out: dict[Case, dict[str, float]] = {}
    for threads in THREADS:
        group = criterion / f"precision_threads{threads}"
        for ctx in CONTEXTS:
            found = {}
            for name in (*DTYPES, *(f"floor_{d}" for d in DTYPES)):
                ms = _median_ms(group / name / str(ctx) / "new" / "estimates.json")
                if ms is not None:
                    found[name] = ms
            if "float32" in found:
                out[(threads, ctx)] = found
    return out


def bytes_per_token() -> dict[str, dict[str, int]]:
    """``{shape: {dtype: bytes}}``: K + V bytes one token takes in every layer's pool."""
    import numpy as np
    import offgraph_kv as okv

    slots = 64
    out: dict[str, dict[str, int]] = {}
    for shape, (layers, heads, head_dim) in SHAPES.items():
        out[shape] = {}
        for dtype in DTYPES:
            layer = okv.LayerConfig(okv.Flat(), heads, head_dim)
            cfg = okv.CacheConfig(slots, 1, [layer], max_step=slots, dtype=dtype)
            kv = okv.KvSequenceCache(cfg)
            kv.control().begin_step(slots)  # nbytes counts the rows written
            rows = np.zeros((heads, slots, head_dim), dtype=np.float32)
            kv.update(0, rows, rows)
            out[shape][dtype] = layers * kv.nbytes() // slots
    return out


def plot(medians: dict[Case, dict[str, float]], bpt: dict[str, dict[str, int]], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        1, 1 + len(bpt), figsize=(6 + 3.4 * len(bpt), 4.2), width_ratios=[2] + [1] * len(bpt)
    )
    ax = axes[0]
    cases = sorted(medians)
    width = 0.8 / max(len(cases), 1)
    for i, case in enumerate(cases):
        m = medians[case]
        threads, ctx = case
        xs = [j + (i - (len(cases) - 1) / 2) * width for j, d in enumerate(DTYPES) if d in m]
        ys = [m[d] for d in DTYPES if d in m]
        label = f"ctx {ctx}, {threads} thread{'s' if threads > 1 else ''}"
        ax.bar(xs, ys, width, label=label)
        top = max(max(m.values()), 1e-9)
        for x, d in zip(xs, (d for d in DTYPES if d in m)):
            floor = m.get(f"floor_{d}")
            if floor is not None:
                ax.scatter([x], [floor], marker="_", s=120, color="black", zorder=3)
            # The ratio sits above the bar or its floor mark, whichever is higher.
            y = max(m[d], floor or 0.0) + 0.02 * top
            ratio = f"{m[d] / m['float32']:.2f}x"
            ax.text(x, y, ratio, fontsize=6, rotation=90, ha="center", va="bottom")
    ax.scatter([], [], marker="_", s=120, color="black", label="read floor (own bytes)")
    ax.set_xticks(range(len(DTYPES)), DTYPES)
    ax.set_ylabel("decode attention, ms (criterion median)")
    ax.set_title("Decode, 8 KV / 32 q heads x 128, cold cache\n(labels: / float32, same case)")
    ax.margins(y=0.2)
    ax.legend(fontsize=7)
    for ax, (shape, per) in zip(axes[1:], bpt.items()):
        kib = [per[d] / 1024 for d in DTYPES]
        bars = ax.bar(range(len(DTYPES)), kib, 0.6, color="tab:gray")
        ax.bar_label(bars, [f"{per[d]:,}" for d in DTYPES], fontsize=7, padding=2)
        ax.set_xticks(range(len(DTYPES)), DTYPES, fontsize=8)
        ax.set_ylabel("KiB per token (K + V, all layers)")
        ax.set_title(f"{shape}-shaped cache\n(labels: bytes)")
        ax.margins(y=0.15)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--criterion", type=pathlib.Path, default=ROOT / "target" / "criterion")
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "docs" / "bench" / "precision.png")
    args = ap.parse_args(argv)
    medians = read_medians(args.criterion)
    if not medians:
        print(
            f"no precision bench results under {args.criterion} "
            "(run `cargo bench --bench precision` first)",
            file=sys.stderr,
        )
        return 1
    bpt = bytes_per_token()
    for (threads, ctx), m in sorted(medians.items()):
        cells = ", ".join(f"{d} {m[d]:.2f} ms" for d in DTYPES if d in m)
        print(f"{threads} thread(s), ctx {ctx}: {cells}")
    for shape, per in bpt.items():
        print(f"bytes/token {shape}: " + ", ".join(f"{d} {per[d]}" for d in DTYPES))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    plot(medians, bpt, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
