"""A cold range's first byte through Larder against direct, read by read: each pair reads the
same range (`--range` KiB at a random offset) of two fresh objects, one straight from the
upstream and one through Larder, back to back, so that the machine's drift between rounds (the
larger effect on a shared 2-core VM) falls on both sides alike. Prints each pair and the p50 of
each side and of the differences; with `--cpu`, the upstream answers at once and the figure is
Larder's CPU per cold read (user + system of its process over the reads).

    LARDER_E2E_PROFILE=release python3 e2e/bench/cold_pairs.py [--pairs 40] [--range 64] [--delay 30]

Not part of the test suite.
"""

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import KiB, MiB, Bench  # noqa: E402
from cold_ab import read  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=40)
    ap.add_argument("--range", type=int, default=64, help="KiB read of each 1 MiB object")
    ap.add_argument("--delay", type=int, default=30, help="ms the upstream waits before each answer")
    ap.add_argument("--cpu", action="store_true", help="upstream without delay; report Larder's CPU per cold read")
    ap.add_argument("--out", type=Path, default=Path("target/bench/cold-pairs"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    length = args.range * KiB
    bench = Bench("quick", args.out)
    try:
        bench.start()
        keys = [(f"pairs/direct/{i}", f"pairs/larder/{i}") for i in range(args.pairs)]
        bench.upload([(k, MiB) for pair in keys for k in pair])
        _, larder = bench.larder("larder", "--memory-capacity", "1GiB")
        direct = bench.direct()
        bench.proxy.latency(delay_ms=0 if args.cpu else args.delay, jitter_ms=0, tail_fraction=0, tail_ms=0)
        # A pause between reads lets each start on an idle machine; with --cpu none, so that
        # Larder's CPU over the run is its reads' (its idle timers would count too).
        pause = 0 if args.cpu else 0.05
        rng = random.Random(3)
        firsts = {"direct": [], "larder": [], "difference": []}
        cpu = larder.cpu_seconds()
        for direct_key, larder_key in keys:
            offset = rng.randrange(0, MiB - length + 1)
            d, _ = read(direct, direct_key, MiB, (offset, length))
            time.sleep(pause)
            t, _ = read(larder, larder_key, MiB, (offset, length))
            time.sleep(pause)
            for name, value in (("direct", d), ("larder", t), ("difference", t - d)):
                firsts[name].append(value)
            print(f"direct {d:.2f} ms, Larder {t:.2f} ms ({t - d:+.2f})", flush=True)
        cpu = larder.cpu_seconds() - cpu
        print(", ".join(f"{name} p50 {statistics.median(v):+.2f} ms" if name == "difference"
                        else f"{name} p50 {statistics.median(v):.2f} ms" for name, v in firsts.items()))
        if args.cpu:
            print(f"Larder CPU per cold read: {cpu / args.pairs * 1e3:.3f} ms (the direct reads cost it none)")
    finally:
        bench.stop()


if __name__ == "__main__":
    main()
