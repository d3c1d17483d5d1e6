"""Does ``okv.attend`` release the GIL? Two Python threads each run the same
attention calls; with the GIL released they overlap on 2 cores and finish
faster than the same calls run one after the other. Prints medians and the
ratio (serial / concurrent), measured side by side in one run."""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import numpy as np
import offgraph_kv as okv
from offgraph_kv.tools.bench import decode_spec


def make_spec(context: int):
    kv, spec = decode_spec(context, last_step=64)
    q = np.random.default_rng(1).standard_normal((32, 64, 128)).astype(np.float32)
    return kv, spec, q


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--calls", type=int, default=4, help="attend calls per thread")
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    kv, spec, q = make_spec(args.context)

    def work():
        for _ in range(args.calls):
            okv.attend(q, spec, threads=1)

    serial, concurrent = [], []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        work()
        work()
        serial.append(time.perf_counter() - t0)
        ts = [threading.Thread(target=work) for _ in range(2)]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        concurrent.append(time.perf_counter() - t0)
    s, c = statistics.median(serial), statistics.median(concurrent)
    print("| run | median (ms) |\n|---|---|")
    print(f"| 2 x {args.calls} attend calls, serial | {s * 1e3:.1f} |")
    print(f"| 2 threads x {args.calls} attend calls | {c * 1e3:.1f} |")
    print(f"\nserial / concurrent: {s / c:.2f}x (2 cores; > 1 means the calls overlapped)")


if __name__ == "__main__":
    main()
