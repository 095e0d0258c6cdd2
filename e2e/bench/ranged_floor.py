"""The floor for a cold one-block object on the capped upstream: an 8 MiB object read as N ranged
GETs at once straight from the latency proxy (30 ms, 90 MB/s per connection, as compare.py's
capped step), no cache in between, each piece on a connection of its own opened beforehand.
What `upstream_fetch_pieces = N` could reach at best on this machine. Not part of the test suite.

    python3 e2e/bench/ranged_floor.py [--objects 8] [--pieces 1,4,8]
"""

import argparse
import http.client
import statistics
import sys
import threading
import time
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import BUCKET, MiB, S3_CONNECTION_MBPS, Bench, content  # noqa: E402

SIZE = 8 * MiB


def read_in_pieces(conns: list, key: str) -> float:
    """Milliseconds until every piece of `key` has arrived, each checked."""
    n = len(conns)
    piece = SIZE // n
    got = [None] * n

    def get(i: int):
        c = conns[i]
        c.request("GET", f"/{BUCKET}/{key}", headers={"Range": f"bytes={i * piece}-{(i + 1) * piece - 1}"})
        r = c.getresponse()
        got[i] = (r.status, r.read())

    t0 = time.perf_counter()
    threads = [threading.Thread(target=get, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    took = (time.perf_counter() - t0) * 1000
    # Checked after the clock stops: the check is the client's work, not the upstream's.
    for i, answer in enumerate(got):
        if answer is None or answer[0] != 206 or answer[1] != content(key, SIZE)[i * piece:(i + 1) * piece]:
            raise RuntimeError(f"{key} piece {i}: {answer and (answer[0], len(answer[1]))}")
    return took


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--objects", type=int, default=8)
    ap.add_argument("--pieces", default="1,4,8")
    args = ap.parse_args()
    bench = Bench("quick", Path(tempfile.mkdtemp(prefix="ranged-floor-")))
    try:
        bench.start()
        keys = [f"floor/{i}" for i in range(args.objects)]
        bench.upload([(k, SIZE) for k in keys] + [("hello", 1024)])
        bench.proxy.latency(delay_ms=30, jitter_ms=0, tail_fraction=0, tail_ms=0)
        bench.proxy.control(f"limits?connection_mbps={S3_CONNECTION_MBPS}")
        for n in (int(p) for p in args.pieces.split(",")):
            conns = [http.client.HTTPConnection("127.0.0.1", bench.proxy.port, timeout=60) for _ in range(n)]
            for c in conns:  # opened before the clock starts, as a cache's pool would hold them
                c.request("GET", f"/{BUCKET}/hello")
                c.getresponse().read()
            times = [read_in_pieces(conns, k) for k in keys]
            for c in conns:
                c.close()
            print(f"8 MiB in {n} ranged GETs at once: p50 {statistics.median(times):.1f} ms "
                  f"(each: {', '.join(f'{t:.0f}' for t in times)})", flush=True)
    finally:
        bench.stop()


if __name__ == "__main__":
    main()
