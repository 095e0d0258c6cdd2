"""CPU per MiB of cold reads into a full memory tier: Larder builds (or settings) side by side,
runs alternated, for comparing one change's cost to the miss path on a noisy machine.

    python3 e2e/bench/fill_cpu.py --rounds 4 before:base after:release

Each variant is NAME:PROFILE[:ENV=V,...[:ARG;ARG...]] as in hit_cpu.py. Every Larder has a
memory tier of `--memory` MiB and no disk tier; `--objects` objects of 1 to 20 MiB (seeded sizes,
about 2.5 times that memory at the defaults) are read whole, one at a time on one connection,
every body checked, in the same order each round. Round 0 fills an empty memory tier; from round
1 on the tier is full, so each fill evicts, and most reads are misses (each line says how many
were). Prints the server's CPU time per MiB read (user + system of its process) for each round
and the median of the rounds after the first. Not part of the test suite.
"""

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cold_ab import start_variant  # noqa: E402
from compare import MiB, Reader, content  # noqa: E402
from hit_cpu import median, variant, variant_bench  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--objects", type=int, default=60)
    ap.add_argument("--memory", type=int, default=256, help="memory tier, MiB")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--out", type=Path, default=Path("target/bench/fill-cpu"))
    ap.add_argument("variants", nargs="+", type=variant)
    args = ap.parse_args()
    bench = variant_bench(args)
    rng = random.Random(1)
    sizes = {f"fill-cpu/{i}": rng.randrange(MiB, 20 * MiB) for i in range(args.objects)}
    try:
        bench.start()
        bench.upload(sizes.items())
        targets = []
        for v in args.variants:
            targets.append((v[0], start_variant(bench, v, f"{args.memory}MiB")[1]))
        results = {name: [] for name, _ in targets}
        for n in range(args.rounds):
            for name, t in targets:
                reader, answers = Reader(t), {}
                cpu = t.cpu_seconds()
                for key, size in sizes.items():
                    _, _, answer = reader.get(key, content(key, size))
                    answers[answer] = answers.get(answer, 0) + 1
                cpu = t.cpu_seconds() - cpu
                reader.close()
                per_mib = 1000 * cpu / (sum(sizes.values()) / MiB)
                results[name].append(per_mib)
                print(f"round {n} {name}: CPU {per_mib:.3f} ms per MiB read, {answers}", flush=True)
        for name, rs in results.items():
            later = rs[1:] or rs
            print(f"{name}: CPU ms per MiB {[round(r, 3) for r in rs]}; median after round 0 {median(later):.3f}")
    finally:
        bench.stop()


if __name__ == "__main__":
    main()
