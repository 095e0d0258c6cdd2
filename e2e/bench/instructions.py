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


def read(target: Target, key: str, size: int, count: int, headers: dict):
    """`count` GETs of `key` on one keep-alive connection, each body checked; with
    [`CHECKSUM_MODE`] in `headers`, each answer must carry the object's CRC32."""
    want = content(key, size)
    c = http.client.HTTPConnection(target.host, target.port, timeout=120)
    try:
        for _ in range(count):
            c.request("GET", target.path(key), headers=headers)
            r = c.getresponse()
            body = r.read()
            if r.status != 200 or body != want:
                raise RuntimeError(f"{target.name}: {r.status}, {len(body)} bytes")
            if headers and not r.getheader("x-amz-checksum-crc32"):
                raise RuntimeError(f"{target.name}: no checksum sent back")
    finally:
        c.close()


def on_connections(target: Target, key: str, size: int, requests: int, connections: int, headers: dict):
    threads = [threading.Thread(target=read, args=(target, key, size, requests // connections, headers))
               for _ in range(connections)]
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
    ap.add_argument("--out", type=Path, default=Path("target/bench/instructions"))
    ap.add_argument("variants", nargs="+", type=variant)
    args = ap.parse_args()
    headers = CHECKSUM_MODE if args.checksum_mode else {}
    if args.checksum_mode and args.h2:
        ap.error("--checksum-mode counts HTTP/1.1 requests only")
    bench = variant_bench(args)
    key = "instructions/hot"
    requests = args.requests // args.connections * args.connections
    figures = {name: [] for name, *_ in args.variants}
    try:
        bench.start()
        bench.upload([(key, args.size)])
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
                    larder = conftest.Larder(bench.work, bench.proxy.endpoint, "--memory-capacity", "1GiB",
                                             *extra, name=name, env=env)
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
                        c.request("HEAD", target.path(key), headers=headers)
                        c.getresponse().read()
                        c.close()
                    # Warm: the block cached, the metadata known, every connection's first request done.
                    on_connections(target, key, args.size, 50 * args.connections, args.connections, headers)
                    pid = str(larder.proc.pid)
                    subprocess.run(["callgrind_control", "--zero", pid], check=True, capture_output=True)
                    if args.h2:
                        over_h2(target, key, requests, args.connections)
                    else:
                        on_connections(target, key, args.size, requests, args.connections, headers)
                    subprocess.run(["callgrind_control", "--dump", pid], check=True, capture_output=True)
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
