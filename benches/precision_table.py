"""Prints the medians of the last `cargo bench --bench precision` run as a table,
with each dtype's time over the float32 native time and over its own read floor."""

import json
import pathlib
import sys

ROOT = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "target/criterion")
DTYPES = ["float32", "float16", "bfloat16", "q8_0"]


def median_ms(group, name, ctx):
    path = ROOT / group / name / str(ctx) / "new" / "estimates.json"
    return json.loads(path.read_text())["median"]["point_estimate"] / 1e6


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
            for d in DTYPES:
                t, fl = median_ms(group, d, ctx), median_ms(group, f"floor_{d}", ctx)
                cells = [threads, ctx, d, f"{t:.2f}", f"{fl:.2f}", f"{t / f32:.2f}"]
                cells += [f"{t / fl:.2f}", f"{t / f32_floor:.2f}"]
                print("| " + " | ".join(str(c) for c in cells) + " |")


if __name__ == "__main__":
    main()
