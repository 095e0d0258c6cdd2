"""Cold whole-object reads through Larder builds (or settings) side by side, with direct reads
of the same sizes in the same rounds: when each quarter of the body arrived, for comparing one
change's effect on the miss path on a noisy machine.

    python3 e2e/bench/cold_ab.py --size 8 --objects 6 --rounds 3 before:prev after:release
    python3 e2e/bench/cold_ab.py --capped ...   # each upstream connection at 90 MB/s, as S3
    python3 e2e/bench/cold_ab.py --size 24 --range 16 ...   # a 16 MiB range at a random offset
    python3 e2e/bench/cold_ab.py --tls ...   # the upstream over HTTPS, as S3 speaks

With `--range`, `direct-pieces` reads each range straight from the upstream as Larder's cold
open asks for it (one GET per block it touches, sent at once): the reference that shows what
of Larder's gap to `direct` is the upstream answering several GETs at once.

Each variant is NAME:PROFILE[:ENV=V,...[:ARG;ARG...]] as in hit_cpu.py. The upstream is the
latency proxy with `--delay` ms (default 30, as compare.py's cold steps) before every answer. Each round reads
`--objects` new objects of `--size` MiB through every variant in turn, and as many straight
from the upstream, one at a time, each on a new connection opened beforehand (with
`--keep-alive`, on one connection per target kept from read to read, as compare.py's cold
steps and the SDKs read), every body checked. Prints each read's first byte and quarter marks
(ms), and per variant the p50 of the first byte, the whole read, and the last quarter (from the
3/4 mark to the end), the upstream GETs per read (counted at the latency proxy as each read ends), the machine's busy
CPU per read from request to last byte (every process: upstream, proxy, Larder, this client)
with the share of the machine's CPU time that was busy, and each Larder's own CPU per read
(from one read's start to the next's, so the caching after the last byte counts). Each Larder
has a 4 GiB memory tier, which the reads never fill, unless its ARGS set
`--memory-capacity` (e.g. `--memory-capacity;192MiB`: full after a few reads, as a running
cache is, so fills reuse evicted blocks' buffers). Not part of the test suite.

With `--split`, the upstream (MinIO and the latency proxy) runs on the second half of the cores
and everything else (the Larders, this client) on the first, as when S3 is on other machines:
its work for one read (several GETs at once for a Larder) then no longer takes the cores Larder
and the client run on. Direct reads run the same way, client and upstream apart. Needs two
cores; on two, each side has one (docs/benchmarks.md has what that showed).

With `--tls`, the latency proxy serves the upstream over HTTPS (a self-signed certificate made
for the run, which each Larder trusts through `--upstream-ca-file`): the direct reads decrypt
what they read, as an SDK reading S3 does, and so does each Larder, which serves its client in
the clear.
"""

import argparse
import http.client
import os
import random
import ssl
import threading
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import (  # noqa: E402
    BLOCK, CLIENT_KEY, CLIENT_SECRET, S3_CONNECTION_MBPS, MiB, Bench, Larder, Target, content, percentile, s3_client,
    self_signed)
from hit_cpu import variant, variant_bench  # noqa: E402


# With `--keep-alive`: each target's one connection (by endpoint), kept from read to read.
KEPT: dict[str, http.client.HTTPConnection] = {}


def connection(t: Target) -> http.client.HTTPConnection:
    """A connection to `t`: over TLS to an `https://` target (with `--tls`, the upstream; its
    certificate, the bench's own, is not checked: the handshake is outside the timed reads)."""
    if t.tls:
        return http.client.HTTPSConnection(t.host, t.port, timeout=120, context=ssl._create_unverified_context())
    return http.client.HTTPConnection(t.host, t.port, timeout=120)


def read(t: Target, key: str, size: int, span: tuple[int, int] | None = None,
         keep: bool = False) -> tuple[float, list[float]]:
    """First byte and the times the body's quarters were complete, ms after the request; of the
    bytes `span` (first, length) of the object when given. On a new connection opened
    beforehand, or with `keep` on the target's connection kept from its last read."""
    conn = KEPT.get(t.endpoint) if keep else None
    if conn is None:
        conn = connection(t)
        conn.connect()
        if keep:
            KEPT[t.endpoint] = conn
    expected = content(key, size)
    if span:
        expected = expected[span[0]:span[0] + span[1]]
    # Presigned before the clock starts: boto3 takes a millisecond or two to sign.
    path = t.path(key)
    cpu0 = machine_busy()
    t0 = time.perf_counter()
    conn.putrequest("GET", path, skip_accept_encoding=True)
    if span:
        conn.putheader("Range", f"bytes={span[0]}-{span[0] + span[1] - 1}")
    conn.endheaders()
    resp = conn.getresponse()
    first = resp.read(1)
    t_first = (time.perf_counter() - t0) * 1000
    size = len(expected)
    parts, got, marks, quarter = [first], 1, [], size // 4
    while chunk := resp.read(256 << 10):
        parts.append(chunk)
        got += len(chunk)
        while len(marks) < 4 and got >= quarter * (len(marks) + 1):
            marks.append((time.perf_counter() - t0) * 1000)
    cpu1 = machine_busy()
    LAST_BUSY[:] = [cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]]
    if not keep:
        conn.close()
    if resp.status not in (200, 206) or b"".join(parts) != expected:
        raise RuntimeError(f"{t.name} {key}: status {resp.status}, {got} bytes, expected {size}")
    return t_first, marks


def read_in_pieces(t: Target, key: str, size: int, span: tuple[int, int]) -> tuple[float, list[float]]:
    """A range as Larder's cold open asks the upstream for it: one GET per block it touches, the
    first from the range's first byte, all sent at once, each on a connection opened
    beforehand. The first piece's first byte, and when all were complete (as [`read`]'s last
    quarter mark): what the upstream itself gives a reader that fans out this way."""
    start, end = span[0], span[0] + span[1]
    pieces = [(max(start, b), min(end, b + BLOCK)) for b in range(start - start % BLOCK, end, BLOCK)]
    expected = content(key, size)
    conns = [connection(t) for _ in pieces]
    for c in conns:
        c.connect()
    path = t.path(key)
    firsts = [0.0] * len(pieces)
    cpu0 = machine_busy()
    t0 = time.perf_counter()

    def get(i: int):
        a, b = pieces[i]
        conns[i].putrequest("GET", path, skip_accept_encoding=True)
        conns[i].putheader("Range", f"bytes={a}-{b - 1}")
        conns[i].endheaders()
        resp = conns[i].getresponse()
        first = resp.read(1)
        firsts[i] = (time.perf_counter() - t0) * 1000
        if resp.status != 206 or first + resp.read() != expected[a:b]:
            raise RuntimeError(f"{key} bytes {a}-{b - 1}: status {resp.status}")

    threads = [threading.Thread(target=get, args=(i,)) for i in range(len(pieces))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    done = (time.perf_counter() - t0) * 1000
    cpu1 = machine_busy()
    LAST_BUSY[:] = [cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]]
    for c in conns:
        c.close()
    return firsts[0], [done] * 4


# The machine's busy and all CPU seconds over the last read, from its request to its last byte
# (checking the bytes is not counted; work a Larder does after the last byte, such as caching
# the block, is not either).
LAST_BUSY = [0.0, 0.0]


def machine_busy() -> tuple[float, float]:
    """CPU seconds this machine's CPUs spent busy and in all since boot (`/proc/stat`)."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    idle = ticks[3] + ticks[4]
    return (sum(ticks) - idle) / hz, sum(ticks) / hz


def start_variant(bench: Bench, variant, memory: str = "4GiB") -> tuple[Larder, Target]:
    """A Larder for `variant` (NAME, PROFILE, ENV, ARGS) in front of `bench`'s upstream, with a
    memory tier of `memory` (unless the variant's own arguments set one), stopped with the bench;
    and its target, for SigV4-signing clients."""
    name, profile, env, extra = variant
    os.environ["LARDER_E2E_PROFILE"] = profile
    tier = [] if "--memory-capacity" in extra else ["--memory-capacity", memory]
    if bench.upstream_tls:
        tier += ["--upstream-ca-file", str(bench.upstream_tls[0])]
    larder = Larder(bench.work, bench.upstream_endpoint, *tier, *extra, name=name, env=env)
    bench.stoppers.append(larder.stop)
    presigner = s3_client(larder.endpoint, CLIENT_KEY, CLIENT_SECRET, signature_version="s3v4")
    return larder, Target("Larder", larder.endpoint, presigner, pid=larder.proc.pid)


def start_variants(bench: Bench, variants) -> dict[str, Target]:
    """A Larder per variant, with a 4 GiB memory tier unless it sets its own: their targets by
    name. A tier small enough for the reads to fill is full after a few of them, as a running
    cache's is: each fill then reuses the buffer of a block it evicts instead of fresh memory."""
    return {v[0]: start_variant(bench, v)[1] for v in variants}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=8, help="object size, MiB")
    ap.add_argument("--objects", type=int, default=6, help="objects per variant and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--delay", type=int, default=30, help="ms the upstream waits before each answer")
    ap.add_argument("--capped", action="store_true", help=f"cap each upstream connection at {S3_CONNECTION_MBPS} MB/s")
    ap.add_argument("--range", type=float, default=0,
                    help="read a range of this many MiB at a random offset of each object, not all of it")
    ap.add_argument("--split", action="store_true",
                    help="the upstream on the second half of the cores, the Larders and this client on the first")
    ap.add_argument("--known", action="store_true",
                    help="read each object's last 64 KiB first, untimed, so its size and version are known "
                         "when the range is read (as a Parquet reader's footer read does)")
    ap.add_argument("--keep-alive", action="store_true",
                    help="read on one connection per target kept from read to read, as compare.py's "
                         "cold steps and most SDKs do, instead of a new one per read")
    ap.add_argument("--tls", action="store_true",
                    help="the upstream speaks HTTPS, as S3 does: direct reads and the Larders' GETs go over TLS")
    ap.add_argument("--out", type=Path, default=Path("target/bench/cold-ab"))
    ap.add_argument("variants", nargs="+", type=variant)
    args = ap.parse_args()
    size = args.size * MiB
    bench = variant_bench(args)
    if args.tls:
        bench.upstream_tls = self_signed(bench.work)
    names = ["direct"] + (["direct-pieces"] if args.range else []) + [v[0] for v in args.variants]
    results = {name: [] for name in names}
    gets = {name: 0 for name in names}
    # Machine-wide: busy CPU seconds and all CPU seconds over each variant's reads. Whether the
    # reads were short of CPU (every core busy), and what one costs the whole machine: upstream,
    # latency proxy, Larder and this client together. /proc/stat counts in ticks (10 ms): a
    # read's own figure is coarse, their sum over many reads is not.
    busy = {name: [0.0, 0.0] for name in names}
    # Each Larder's CPU seconds over its reads: from each read's start to the next's.
    larder_cpu, pending = {name: 0.0 for name in names}, {}
    cores = sorted(os.sched_getaffinity(0))
    if args.split:
        if len(cores) < 2:
            raise SystemExit("--split needs two cores")
        # Inherited by MinIO and the latency proxy (and their threads), started next.
        os.sched_setaffinity(0, cores[len(cores) // 2:])
    try:
        bench.start()
        if args.split:
            # The Larders, started from here on, and this client's reads.
            os.sched_setaffinity(0, cores[:len(cores) // 2])
        keys = {name: [f"cold-ab/{name}/{r}/{i}" for r in range(args.rounds) for i in range(args.objects)]
                for name in names}
        bench.upload([(k, size) for ks in keys.values() for k in ks])
        targets = {"direct": bench.direct(), "direct-pieces": bench.direct()}
        targets.update(start_variants(bench, args.variants))
        bench.proxy.latency(delay_ms=args.delay, jitter_ms=0, tail_fraction=0, tail_ms=0)
        if args.capped:
            bench.proxy.control(f"limits?connection_mbps={S3_CONNECTION_MBPS}")
        rng, length = random.Random(11), int(args.range * MiB)
        spans = {k: (rng.randrange(0, size - length + 1), length) if length else None
                 for ks in keys.values() for k in ks}
        for r in range(args.rounds):
            for name in names:
                for key in keys[name][r * args.objects:(r + 1) * args.objects]:
                    how = read_in_pieces if name == "direct-pieces" else read
                    keep = {} if how is read_in_pieces else {"keep": args.keep_alive}
                    if args.known:
                        read(targets[name], key, size, (size - 64 * 1024, 64 * 1024), args.keep_alive)
                    bench.proxy.control("reset")
                    own = targets[name].cpu_seconds()
                    if name in pending and own is not None:
                        larder_cpu[name] += own - pending.pop(name)
                    first, marks = how(targets[name], key, size, spans[key], **keep)
                    if own is not None:
                        # Larder's own, to the start of the next read: what it does after the
                        # last byte (caching the block) is its cost of this read too.
                        pending[name] = own
                    busy[name][0] += LAST_BUSY[0]
                    busy[name][1] += LAST_BUSY[1]
                    results[name].append((first, marks))
                    # Counted once the read is done: a block completed behind it may still come.
                    gets[name] += bench.upstream()["gets"]
                    print(f"round {r} {name}: first {first:.1f}, quarters {[round(m, 1) for m in marks]}", flush=True)
        time.sleep(1)
        for name, started in pending.items():
            larder_cpu[name] += targets[name].cpu_seconds() - started
        for name, reads in results.items():
            firsts = [f for f, _ in reads]
            wholes = [m[3] for _, m in reads]
            lasts = [m[3] - m[2] for _, m in reads]
            read_size = length or size
            print(f"{name}: first byte p50 {percentile(firsts, 50):.2f} ms, whole p50 {percentile(wholes, 50):.1f} ms "
                  f"({read_size / percentile(wholes, 50) / 1e3:.0f} MB/s), last quarter p50 {percentile(lasts, 50):.1f} ms, "
                  f"upstream GETs per read {gets[name] / len(reads):.1f}, machine CPU per read "
                  f"{busy[name][0] / len(reads) * 1e3:.0f} ms ({busy[name][0] / max(busy[name][1], 1e-9):.0%} busy)"
                  + (f", Larder's CPU per read {larder_cpu[name] / len(reads) * 1e3:.1f} ms" if larder_cpu[name] else ""))
    finally:
        bench.stop()


if __name__ == "__main__":
    main()
