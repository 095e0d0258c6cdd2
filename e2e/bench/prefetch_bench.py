"""Read-ahead, measured: one reader reads a large object as consecutive 8 MiB ranged GETs (as a
stream processor or a Parquet scanner does) through Larder with `--prefetch auto` and with
`--prefetch off`, against MinIO behind the test pass-through adding 20-50 ms to every upstream
request (uniform, so misses cost what they cost against real S3).

Usage (after `cargo build --release -p larder`, with MinIO installed by e2e/setup.sh):

    python3 e2e/bench/prefetch_bench.py [--size-mib 1024] [--latency-ms 20] [--jitter-ms 30]

Prints a Markdown table: wall time, throughput, upstream GETs and body bytes (both measured at the
pass-through), read-ahead blocks issued and bytes used (Larder's counters), upstream bytes never
read (measured: what the pass-through sent beyond the bytes the reader received), and the time
ratio.
"""

import argparse
import os
import platform
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from conftest import Larder, Minio, s3_client, CLIENT_KEY, CLIENT_SECRET  # noqa: E402
from counting_proxy import CountingProxy  # noqa: E402

MiB = 1 << 20


def metric(text: str, name: str, labels: str = "") -> float:
    m = re.search(rf"^{name}{re.escape(labels)} ([\d.e+]+)", text, re.M)
    return float(m.group(1)) if m else 0.0


def read_sequentially(larder: Larder, bucket: str, key: str, original: Path, step: int) -> float:
    """Read the object as consecutive ranges, each compared with the uploaded file's bytes (a
    millisecond or two per 8 MiB, inside the timed part: a reader that uses its bytes)."""
    client = s3_client(larder.endpoint, CLIENT_KEY, CLIENT_SECRET)
    size = original.stat().st_size
    started = time.monotonic()
    got = 0
    with open(original, "rb") as want:
        for start in range(0, size, step):
            end = min(start + step, size) - 1
            body = client.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{end}")["Body"].read()
            assert body == want.read(end - start + 1), f"bytes {start}-{end} differ"
            got += len(body)
    assert got == size
    return time.monotonic() - started


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--latency-ms", type=float, default=20)
    ap.add_argument("--jitter-ms", type=float, default=30)
    args = ap.parse_args()
    size = args.size_mib * MiB
    work = Path(tempfile.mkdtemp(prefix="larder-bench-"))
    minio = Minio(work)
    proxy = CountingProxy("127.0.0.1", minio.port)
    bucket, key = "bench-prefetch", "big.bin"
    s3 = s3_client(minio.endpoint)
    s3.create_bucket(Bucket=bucket)
    with open(work / "big.bin", "wb") as f:
        for _ in range(size // MiB):
            f.write(os.urandom(MiB))
    s3.upload_file(str(work / "big.bin"), bucket, key)
    rows = []
    try:
        for mode in ("off", "auto"):
            larder = Larder(work, f"http://127.0.0.1:{proxy.port}", "--prefetch", mode,
                            "--memory-capacity", "1GiB", name=f"prefetch-{mode}")
            try:
                proxy.reset()
                proxy.delay, proxy.jitter = args.latency_ms / 1000, args.jitter_ms / 1000
                took = read_sequentially(larder, bucket, key, work / "big.bin", 8 * MiB)
                proxy.delay = proxy.jitter = 0
                gets = [r for r in proxy.seen("GET", f"/{bucket}/{key}") if r[2]]
                # Measured at the pass-through: the body bytes it sent Larder. The reader read
                # every byte of the object once (checked), so whatever Larder fetched beyond the
                # object's size was fetched and never read (or fetched twice).
                fetched = proxy.body_bytes
                text = larder.metrics()
                used = metric(text, "larder_prefetch_bytes_total", '{outcome="used"}')
                issued = metric(text, "larder_prefetch_blocks_total", '{outcome="issued"}')
                unread = fetched - size
                rows.append((mode, took, len(gets), fetched, issued, used, unread))
            finally:
                larder.stop()
    finally:
        proxy.close()
        minio.stop()
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(f"Machine: {platform.node()}, {cpu}, {os.cpu_count()} cores, Linux {platform.release()}. "
          f"One boto3 reader, {args.size_mib} MiB as consecutive 8 MiB ranged GETs; upstream MinIO behind "
          f"a pass-through adding {args.latency_ms:.0f}-{args.latency_ms + args.jitter_ms:.0f} ms per request; "
          f"8 MiB blocks.\n")
    print("| prefetch | time s | MiB/s | upstream GETs | upstream MiB | read-ahead blocks | read-ahead MiB used | "
          "upstream MiB never read |")
    print("|---|---|---|---|---|---|---|---|")
    for mode, took, gets, fetched, issued, used, unread in rows:
        print(f"| {mode} | {took:.2f} | {size / MiB / took:.0f} | {gets} | {fetched / MiB:.0f} | {issued:.0f} | "
              f"{used / MiB:.0f} | {unread / MiB:.0f} |")
    off, auto = rows[0][1], rows[1][1]
    print(f"\nTime with read-ahead / without: {auto / off:.2f} ({off / auto:.1f}x faster).")


if __name__ == "__main__":
    main()
