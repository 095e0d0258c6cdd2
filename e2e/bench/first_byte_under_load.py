"""A new reader's cold first byte while other readers stream large cold objects, through Larder
builds (or settings) side by side: how long a reader that arrives at a busy cache waits.

    python3 e2e/bench/first_byte_under_load.py before:prev after:release
    python3 e2e/bench/first_byte_under_load.py --readers 10 --size 64 --probes 6 --rounds 3 ...
    # the same at an eighth of the scale, where a 2-core machine's CPU is not what binds:
    python3 e2e/bench/first_byte_under_load.py --readers 2 --connection-mbps 20 \
        before:prev::--upstream-concurrency=8 after:release::--upstream-concurrency=8

Each variant is NAME:PROFILE[:ENV=V,...[:ARG;ARG...]] as in hit_cpu.py. The upstream is the
latency proxy (30 ms before every answer, each connection capped at `--connection-mbps`, S3's
90 MB/s by default). In each
round, for each variant in turn, `--readers` threads each read a new `--size` MiB object whole,
enough blocks opened ahead to hold every upstream slot (64 by default, 8 blocks ahead per
response); once they have started, a probe reads `--probes` new 1 MiB objects one after
another, timing each first byte; the large reads are timed too. Direct reads of new 1 MiB objects, with no load, are the
floor. Every body is checked. Not part of the test suite.
"""

import argparse
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import S3_CONNECTION_MBPS, MiB, percentile  # noqa: E402
from cold_ab import read, start_variants  # noqa: E402
from hit_cpu import variant, variant_bench  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--readers", type=int, default=10, help="readers streaming large cold objects")
    ap.add_argument("--size", type=int, default=64, help="their objects' size, MiB")
    ap.add_argument("--probes", type=int, default=6, help="1 MiB cold reads per variant and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--connection-mbps", type=int, default=S3_CONNECTION_MBPS,
                    help="cap on each upstream connection (MB/s; S3's by default)")
    ap.add_argument("--out", type=Path, default=Path("target/bench/first-byte-under-load"))
    ap.add_argument("variants", nargs="+", type=variant)
    args = ap.parse_args()
    size, probe_size = args.size * MiB, MiB
    bench = variant_bench(args)
    names = [v[0] for v in args.variants]
    firsts = {name: [] for name in ["direct"] + names}
    wholes = {name: [] for name in names}
    try:
        bench.start()
        big = {(n, r): [f"under-load/{n}/{r}/big-{i}" for i in range(args.readers)]
               for n in names for r in range(args.rounds)}
        probes = {(n, r): [f"under-load/{n}/{r}/probe-{i}" for i in range(args.probes)]
                  for n in ["direct"] + names for r in range(args.rounds)}
        bench.upload([(k, size) for ks in big.values() for k in ks]
                     + [(k, probe_size) for ks in probes.values() for k in ks])
        targets = {"direct": bench.direct()}
        targets.update(start_variants(bench, args.variants))
        bench.proxy.latency(delay_ms=30, jitter_ms=0, tail_fraction=0, tail_ms=0)
        bench.proxy.control(f"limits?connection_mbps={args.connection_mbps}")
        for r in range(args.rounds):
            for key in probes[("direct", r)]:
                firsts["direct"].append(read(targets["direct"], key, probe_size)[0])
            for name in names:
                errors, took = [], []

                def stream(key, t=targets[name]):
                    try:
                        took.append(read(t, key, size)[1][3])
                    except Exception as e:  # noqa: BLE001 - reported after the round
                        errors.append(e)

                readers = [threading.Thread(target=stream, args=(k,)) for k in big[(name, r)]]
                for t in readers:
                    t.start()
                # Their first blocks asked, their windows filling the slots.
                time.sleep(0.3)
                got = []
                for key in probes[(name, r)]:
                    got.append(read(targets[name], key, probe_size)[0])
                busy = sum(t.is_alive() for t in readers)
                for t in readers:
                    t.join(timeout=600)
                if errors:
                    raise errors[0]
                firsts[name] += got
                wholes[name] += took
                print(f"round {r} {name}: probe first bytes {[round(f, 1) for f in got]} ms "
                      f"({busy} of {args.readers} readers still streaming after them; they took "
                      f"{[round(w) for w in took]} ms)", flush=True)
        for name, values in firsts.items():
            streams = (f"; the large reads took {percentile(wholes[name], 50):.0f} ms at p50"
                       if name in wholes else "")
            print(f"{name}: first byte p50 {percentile(values, 50):.1f} ms, p90 {percentile(values, 90):.1f} ms, "
                  f"max {max(values):.1f} ms ({len(values)} reads){streams}")
    finally:
        bench.stop()


if __name__ == "__main__":
    main()
