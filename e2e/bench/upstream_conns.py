"""How Larder reuses its upstream connections: cold reads through it in phases, counting the
requests and the new connections the upstream (the latency proxy, 30 ms before every answer)
saw in each.

    python3 e2e/bench/upstream_conns.py [--profile release]

Phases: 800 cold 256 KiB objects read by 16 clients, 800 others by 64 clients, six cold 64 MiB
objects (eight block GETs each) by one client, then, after 10 s idle, the first 800 again
(hits). Each client keeps one connection to Larder; every answer is checked to be a 200 and
whole. Not part of the test suite.
"""

import argparse
import http.client
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import CLIENT_KEY, CLIENT_SECRET, KiB, MiB, Bench, Larder, Target, run_threads, s3_client  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default=os.environ.get("LARDER_E2E_PROFILE", "release"))
    ap.add_argument("--out", type=Path, default=Path("target/bench/upstream-conns"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ["LARDER_E2E_PROFILE"] = args.profile
    bench = Bench("quick", args.out)
    try:
        bench.start()
        small = [(f"conns/s/{i}", 256 * KiB) for i in range(1600)]
        big = [(f"conns/b/{i}", 64 * MiB) for i in range(6)]
        bench.upload(small + big)
        larder = Larder(bench.work, bench.proxy.endpoint, "--memory-capacity", "2GiB", name="conns")
        bench.stoppers.append(larder.stop)
        presigner = s3_client(larder.endpoint, CLIENT_KEY, CLIENT_SECRET, signature_version="s3v4")
        target = Target("Larder", larder.endpoint, presigner)
        paths = {k: target.path(k) for k, _ in small + big}
        bench.proxy.latency(delay_ms=30, jitter_ms=0, tail_fraction=0, tail_ms=0)

        def phase(name: str, objects: list, clients: int):
            bench.proxy.control("reset")
            todo, lock = iter(objects), threading.Lock()

            def client():
                conn = http.client.HTTPConnection(target.host, target.port, timeout=120)
                while True:
                    with lock:
                        item = next(todo, None)
                    if item is None:
                        break
                    key, size = item
                    conn.putrequest("GET", paths[key], skip_accept_encoding=True)
                    conn.endheaders()
                    resp = conn.getresponse()
                    body = resp.read()
                    if resp.status != 200 or len(body) != size:
                        raise RuntimeError(f"{key}: status {resp.status}, {len(body)} bytes of {size}")
                conn.close()

            took = run_threads(clients, client, name)
            up = bench.upstream()
            requests = up["gets"] + up["heads"]
            per = f"{requests / up['connections']:.1f} requests each" if up["connections"] else "none new"
            print(f"{name}: {len(objects)} reads in {took:.1f} s; upstream {up['gets']} GETs, {up['heads']} HEADs, "
                  f"{up['connections']} new connections ({per})", flush=True)

        phase("16 clients, 800 cold 256 KiB objects", small[:800], 16)
        phase("64 clients, 800 other cold 256 KiB objects", small[800:], 64)
        phase("1 client, 6 cold 64 MiB objects", big, 1)
        time.sleep(10)
        phase("after 10 s idle, 16 clients, the first 800 again", small[:800], 16)
    finally:
        bench.stop()


if __name__ == "__main__":
    main()
