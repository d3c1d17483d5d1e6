"""Prints the medians of the last `cargo bench --bench precision` run as a table,
with each dtype's time over the float32 native time and over its own read floor.
`--plot PATH` also draws them (native bars beside each dtype's read floor)."""

import json
import pathlib
import sys

ROOT = pathlib.Path("target/criterion")
DTYPES = ["float32", "float16", "bfloat16", "q8_0"]


def median_ms(group, name, ctx):
    path = ROOT / group / name / str(ctx) / "new" / "estimates.json"
    return json.loads(path.read_text())["median"]["point_estimate"] / 1e6


def plot(path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(14, 3.6))
    cases = [(t, c) for t in (1, 2) for c in (2048, 8192)]
    for ax, (threads, ctx) in zip(axes, cases):
        group = f"precision_threads{threads}"
        native = [median_ms(group, d, ctx) for d in DTYPES]
        floor = [median_ms(group, f"floor_{d}", ctx) for d in DTYPES]
        xs = range(len(DTYPES))
        ax.bar([x - 0.2 for x in xs], native, 0.4, label="native")
        ax.bar([x + 0.2 for x in xs], floor, 0.4, label="read floor (same bytes)")
        ax.set_xticks(list(xs), DTYPES)
        ax.set_title(f"ctx {ctx}, {threads} thread{'s' if threads > 1 else ''}")
        ax.set_ylabel("ms (median)")
    axes[0].legend()
    fig.suptitle("Decode attention per pool dtype (8 KV / 32 q heads x 128, cold cache)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main():
    cols = ["threads", "ctx", "dtype", "native ms", "floor ms", "/ f32 native", "/ own floor"]
    print("| " + " | ".join(cols + ["/ f32 floor"]) + " |")
    print("|---|---|---|---|---|---|---|---|")
    for threads in (1, 2):
        group = f"precision_threads{threads}"
        for ctx in (2048, 8192):
            try:
                f32 = median_ms(group, "float32", ctx)
                f32_floor = median_ms(group, "floor_float32", ctx)
            except FileNotFoundError:
                continue
            rows = [(d, d) for d in DTYPES]
            if (ROOT / group / "q8_0_widen").exists():
                rows.append(("q8_0_widen", "q8_0"))
            for d, floor in rows:
                t, fl = median_ms(group, d, ctx), median_ms(group, f"floor_{floor}", ctx)
                cells = [threads, ctx, d, f"{t:.2f}", f"{fl:.2f}", f"{t / f32:.2f}"]
                cells += [f"{t / fl:.2f}", f"{t / f32_floor:.2f}"]
                print("| " + " | ".join(str(c) for c in cells) + " |")


if __name__ == "__main__":
    main()
    if "--plot" in sys.argv:
        plot(sys.argv[sys.argv.index("--plot") + 1])
