"""Instructions per request of memory hits, counted by valgrind's callgrind: Larder builds (or
settings) side by side, for a change too small for CPU time to show.

    python3 e2e/bench/instructions.py --size 65536 --requests 2000 --rounds 2 \\
        'before:base::--auth;none' 'after:release::--auth;none'

On this kind of VM the CPU time per request of the same build moves by 20 % from one `hit_cpu.py`
round to the next, so a change worth 2 % cannot be seen there. The instructions a build runs per
request repeat to about 0.5 % (user space only: the kernel's share, the copies into the socket,
is not counted, and nor is anything that waits). Each variant (hit_cpu.py's NAME:PROFILE[:ENV=V,...
[:ARG;ARG...]]) runs under callgrind, is warmed, has its counters zeroed, serves `--requests`
reads of one cached object over `--connections` keep-alive connections, and is dumped; the
instructions of that dump divided by the requests are its figure. `--top N` prints the N
functions with the most instructions (inclusive) of each variant's last round.

`--h2` sends the counted requests over HTTP/2 with h2load (cleartext, prior knowledge, one stream
at a time on each of `--connections` connections, opened for the count: their set-up is in it,
spread over the requests); the warm-up stays HTTP/1.1. h2load checks statuses, not bodies.

`--checksum-mode` sends `x-amz-checksum-mode: ENABLED` with every request (as boto3 and the other
AWS SDKs do since 2025), after a HEAD that brings the object's checksum into the metadata, and
checks that every answer carries it: the cost of sending the stored checksum back. Unsigned
variants only (`--auth none`): a presigned URL does not sign the header.

`--disk N` counts disk hits instead: N objects of `--size`, each Larder with an 8 MiB memory tier
in front of a disk tier twice their total (hit_cpu.py's disk setup), warmed through its admin
API, every connection reading the N keys in turn. With N × size well past 8 MiB nearly every
counted read is a disk hit (a page-cache read, CRC-checked); each variant's disk and memory hit
counters are printed after its count.

Needs valgrind (`apt-get install valgrind`). Not part of the test suite: it measures, it does not
judge. Requests are signed (SigV4 presigned URLs) unless the variant runs with `--auth none`.
"""

import argparse
import http.client
import re
import subprocess
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import CLIENT_KEY, CLIENT_SECRET, Target, content, s3_client  # noqa: E402
import conftest  # noqa: E402  (on the path once compare is imported)
from hit_cpu import median, variant, variant_bench  # noqa: E402


CHECKSUM_MODE = {"x-amz-checksum-mode": "ENABLED"}


def read(target: Target, keys: list, size: int, count: int, headers: dict):
    """`count` GETs of `keys` in turn on one keep-alive connection, each body checked; with
    [`CHECKSUM_MODE`] in `headers`, each answer must carry the object's CRC32."""
    wants = [content(key, size) for key in keys]
    c = http.client.HTTPConnection(target.host, target.port, timeout=120)
    try:
        for i in range(count):
            key, want = keys[i % len(keys)], wants[i % len(keys)]
            c.request("GET", target.path(key), headers=headers)
            r = c.getresponse()
            body = r.read()
            if r.status != 200 or body != want:
                raise RuntimeError(f"{target.name}: {r.status}, {len(body)} bytes")
            if headers and not r.getheader("x-amz-checksum-crc32"):
                raise RuntimeError(f"{target.name}: no checksum sent back")
    finally:
        c.close()


def on_connections(target: Target, keys: list, size: int, requests: int, connections: int, headers: dict):
    # Each connection starts at its own place in the keys, so they do not read one object at once.
    threads = [threading.Thread(target=read, args=(target, keys[i % len(keys):] + keys[:i % len(keys)], size,
                                                   requests // connections, headers))
               for i in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def over_h2(target: Target, key: str, requests: int, connections: int):
    """`requests` GETs of `key` over `connections` HTTP/2 connections (h2load), every one 2xx."""
    out = subprocess.run(["h2load", "-n", str(requests), "-c", str(connections), "-m", "1",
                          target.endpoint + target.path(key)],
                         capture_output=True, text=True, check=True).stdout
    ok = re.search(r"status codes: (\d+) 2xx", out)
    if not ok or int(ok.group(1)) != requests:
        raise RuntimeError(f"h2load against {target.name}: not every request answered 2xx:\n{out}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=65536, help="object size in bytes")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--connections", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--top", type=int, default=0, metavar="N")
    ap.add_argument("--h2", action="store_true", help="count HTTP/2 requests (h2load)")
    ap.add_argument("--checksum-mode", action="store_true",
                    help="send x-amz-checksum-mode: ENABLED (unsigned variants only)")
    ap.add_argument("--disk", type=int, default=0, metavar="N",
                    help="disk hits of N objects (8 MiB memory tier) instead of memory hits of one")
    ap.add_argument("--out", type=Path, default=Path("target/bench/instructions"))
    ap.add_argument("variants", nargs="+", type=variant)
    args = ap.parse_args()
    headers = CHECKSUM_MODE if args.checksum_mode else {}
    if args.checksum_mode and args.h2:
        ap.error("--checksum-mode counts HTTP/1.1 requests only")
    bench = variant_bench(args)
    if args.disk and (args.h2 or args.checksum_mode):
        ap.error("--disk counts HTTP/1.1 requests without --checksum-mode")
    keys = [f"instructions/disk/{i}" for i in range(args.disk)] if args.disk else ["instructions/hot"]
    requests = args.requests // args.connections * args.connections
    figures = {name: [] for name, *_ in args.variants}
    try:
        bench.start()
        bench.upload([(key, args.size) for key in keys])
        for rnd in range(args.rounds):
            for name, profile, env, extra in args.variants:
                dump = args.out / f"{name}-{rnd}.callgrind"
                wrapper = args.out / f"{name}-valgrind.sh"
                binary = conftest.ROOT / "target" / profile / "larder"
                wrapper.write_text("#!/bin/sh\nexec valgrind --tool=callgrind --dump-instr=no "
                                   f"--callgrind-out-file={dump} {binary} \"$@\"\n")
                wrapper.chmod(0o755)
                # conftest's Larder starts `binary("larder")`: here, the wrapper.
                plain = conftest.binary
                conftest.binary = lambda n, w=wrapper, plain=plain: str(w) if n == "larder" else plain(n)
                try:
                    if args.disk:
                        cache = bench.work / f"{name}-{rnd}.cache"
                        tiers = ("--memory-capacity", "8MiB", "--disk-path", str(cache), "--disk-capacity",
                                 f"{max(512, 2 * args.disk * args.size >> 20)}MiB")
                    else:
                        tiers = ("--memory-capacity", "1GiB")
                    larder = conftest.Larder(bench.work, bench.proxy.endpoint, *tiers, *extra, name=name, env=env)
                finally:
                    conftest.binary = plain
                try:
                    unsigned = "none" in (extra[i + 1] for i, a in enumerate(extra[:-1]) if a == "--auth")
                    presigner = None if unsigned else s3_client(larder.endpoint, CLIENT_KEY, CLIENT_SECRET,
                                                                signature_version="s3v4")
                    target = Target(name, larder.endpoint, presigner)
                    if headers:
                        if presigner:
                            raise SystemExit("--checksum-mode needs unsigned variants (--auth;none)")
                        # The metadata from a HEAD that asks: a GET that opens the object learns
                        # no checksum.
                        c = http.client.HTTPConnection(target.host, target.port, timeout=120)
                        c.request("HEAD", target.path(keys[0]), headers=headers)
                        c.getresponse().read()
                        c.close()
                    # Warm: the blocks cached (on disk: through the admin API, as compare.py's disk
                    # step does), the metadata known, every connection's first request done.
                    if args.disk:
                        bench.warm_prefix(larder, "instructions/disk/")
                    warm = max(50 * args.connections, len(keys))
                    on_connections(target, keys, args.size, warm, args.connections, headers)
                    pid = str(larder.proc.pid)
                    subprocess.run(["callgrind_control", "--zero", pid], check=True, capture_output=True)
                    if args.h2:
                        over_h2(target, keys[0], requests, args.connections)
                    else:
                        on_connections(target, keys, args.size, requests, args.connections, headers)
                    subprocess.run(["callgrind_control", "--dump", pid], check=True, capture_output=True)
                    if args.disk:
                        print(f"{name}: " + ", ".join(
                            line for line in larder.metrics().splitlines()
                            if line.startswith(("larder_disk_hits_total", "larder_memory_hits",
                                                "larder_disk_page_cache", "larder_cache_lookups_total"))))
                finally:
                    larder.stop()
                part = Path(f"{dump}.1")
                total = next(int(line.split()[1]) for line in part.read_text().splitlines()
                             if line.startswith("summary:"))
                figures[name].append(total / requests)
                print(f"round {rnd} {name}: {total / requests:,.0f} instructions per request", flush=True)
                if args.top and rnd == args.rounds - 1:
                    report = subprocess.run(["callgrind_annotate", "--inclusive=yes", str(part)],
                                            capture_output=True, text=True, check=True).stdout
                    rows = [r for r in report.split("file:function", 1)[1].splitlines() if "%)" in r]
                    print("\n".join(r[:200] for r in rows[:args.top]))
        for name, values in figures.items():
            print(f"{name}: instructions per request {[round(v) for v in values]}, median {median(values):,.0f}")
    finally:
        bench.stop()


if __name__ == "__main__":
    main()
