"""A reader beside clients that read slowly: how long a fast client's whole-object read takes
while `--slow` clients each read a large object at `--rate` MB/s, against the same read alone.
Larder builds (or settings) side by side, one after another.

    python3 e2e/bench/slow_readers.py before:base after:release
    python3 e2e/bench/slow_readers.py --cold before:base after:release

Each variant is NAME:PROFILE[:ENV=V,...[:ARG;ARG...]] as in hit_cpu.py, run with the default
`response_buffer` (1 GiB) and `read_window` (8) unless its ARGS say otherwise. The slow clients
(raw sockets, a 64 KiB receive buffer, reading at their rate) each read one `--slow-size` MiB
object; after 3 s the fast client (one keep-alive connection, every body checked) reads a
`--fast-size` MiB object three times. Without `--cold` every object is read once first, so all
reads are memory hits; with it every read is of an object this Larder has not seen. Prints the
fast reads' times alone and beside the slow clients, the responses' buffer held and the waits
for it, and what each slow client got. Not part of the test suite.
"""

import argparse
import socket
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cold_ab import start_variant  # noqa: E402
from compare import MiB, Reader, content  # noqa: E402
from conftest import metric  # noqa: E402
from hit_cpu import variant, variant_bench  # noqa: E402


def slow_client(target, key: str, rate: float, seconds: float, got: list):
    """Reads `key` at `rate` bytes a second for `seconds`, then closes; appends the bytes read."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
    s.settimeout(30)
    s.connect((target.host, target.port))
    s.sendall(f"GET {target.path(key)} HTTP/1.1\r\nHost: {target.host}:{target.port}\r\n\r\n".encode())
    start, n = time.perf_counter(), 0
    while (elapsed := time.perf_counter() - start) < seconds:
        chunk = s.recv(64 << 10)
        if not chunk:
            break
        n += len(chunk)
        ahead = n / rate - elapsed
        if ahead > 0:
            time.sleep(min(ahead, seconds - elapsed))
    got.append(n)
    s.close()


def held(larder) -> tuple[float, float]:
    """Bytes the responses' buffer holds, and the waits for it so far."""
    return metric(larder, "larder_response_buffer_bytes"), metric(larder, "larder_response_buffer_waits_total")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slow", type=int, default=16, help="slow clients")
    ap.add_argument("--rate", type=float, default=2.0, help="each slow client's rate, MB/s")
    ap.add_argument("--slow-size", type=int, default=128, help="MiB")
    ap.add_argument("--fast-size", type=int, default=64, help="MiB")
    ap.add_argument("--seconds", type=float, default=12, help="how long the slow clients read")
    ap.add_argument("--cold", action="store_true", help="every read of an object not yet cached")
    ap.add_argument("--out", type=Path, default=Path("target/bench/slow-readers"))
    ap.add_argument("variants", nargs="+", type=variant)
    args = ap.parse_args()
    bench = variant_bench(args)
    fast_keys = [f"fast/{i}" for i in range(6 if args.cold else 1)]
    sizes = {f"slow/{i}": args.slow_size * MiB for i in range(args.slow)}
    sizes |= {k: args.fast_size * MiB for k in fast_keys}
    try:
        bench.start()
        bench.upload(sizes.items())
        for v in args.variants:
            name = v[0]
            larder, target = start_variant(bench, v, f"{2 * sum(sizes.values()) // MiB}MiB")
            reader = Reader(target)
            if not args.cold:
                for key, size in sizes.items():
                    reader.get(key, content(key, size))
            fast = iter(fast_keys * (1 if args.cold else 6))

            def read_fast():
                key = next(fast)
                return round(1000 * reader.get(key, content(key, args.fast_size * MiB))[1])

            alone = [read_fast() for _ in range(3)]
            got: list = []
            slow = [threading.Thread(target=slow_client, args=(target, key, args.rate * 1e6, args.seconds, got))
                    for key in sizes if key.startswith("slow/")]
            for t in slow:
                t.start()
            time.sleep(3)
            bytes_held, waits_before = held(larder)
            beside = [read_fast() for _ in range(3)]
            waits = held(larder)[1] - waits_before
            for t in slow:
                t.join()
            reader.close()
            rates = sorted(round(n / args.seconds / 1e6, 2) for n in got)
            print(f"{name}: fast {args.fast_size} MiB read alone {alone} ms, beside {args.slow} slow clients "
                  f"{beside} ms; responses' buffer held {bytes_held / MiB:.0f} MiB, {waits:.0f} waits for it during "
                  f"the fast reads; slow clients got {rates[0]}-{rates[-1]} MB/s", flush=True)
            larder.stop()
    finally:
        bench.stop()


if __name__ == "__main__":
    main()
