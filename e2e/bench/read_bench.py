"""Memory-hit GET throughput and latency: Larder vs reading the S3 server (MinIO) directly.

Usage (after `cargo build --release -p larder`, with MinIO installed by e2e/setup.sh):

    python3 e2e/bench/read_bench.py [--seconds 10]

Starts MinIO and Larder on loopback, uploads a 1 MiB and a 64 MiB object into a bucket that allows
anonymous reads (so `hey` can send plain GETs to both), warms Larder's memory tier, then drives
each target with `hey` for the same duration and concurrency, one after the other in one run.
Prints a Markdown table with absolute figures and Larder/direct ratios.
"""

import argparse
import json
import platform
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from conftest import Larder, Minio, s3_client  # noqa: E402

MiB = 1 << 20


def hey(url: str, seconds: int, concurrency: int) -> dict:
    out = subprocess.run(["hey", "-z", f"{seconds}s", "-c", str(concurrency), "-disable-compression", url],
                         check=True, capture_output=True, text=True).stdout
    statuses = re.findall(r"\[(\d+)\]\s+(\d+) responses", out)
    if not statuses or any(code != "200" for code, _ in statuses):
        raise RuntimeError(f"non-200 answers from {url}:\n{out}")
    pct = dict(re.findall(r"(\d+)%+ in ([\d.]+) secs", out))
    return {
        "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
        "p50_ms": float(pct["50"]) * 1000,
        "p99_ms": float(pct["99"]) * 1000,
        "requests": sum(int(n) for _, n in statuses),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=10)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="larder-bench-"))
    minio = Minio(work)
    larder = Larder(work, minio.endpoint, "--memory-capacity", "1GiB")
    try:
        s3 = s3_client(minio.endpoint)
        bucket = "bench-reads"
        s3.create_bucket(Bucket=bucket)
        s3.put_bucket_policy(Bucket=bucket, Policy=json.dumps({
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Principal": {"AWS": ["*"]}, "Action": ["s3:GetObject"],
                           "Resource": [f"arn:aws:s3:::{bucket}/*"]}],
        }))
        cases = [("1 MiB", 1 * MiB, 16), ("64 MiB", 64 * MiB, 4)]
        for name, size, _ in cases:
            s3.put_object(Bucket=bucket, Key=f"obj-{size}", Body=bytes(size))
            url = f"{larder.endpoint}/{bucket}/obj-{size}"
            for _ in range(50):  # warm: wait until every block is in memory
                with urllib.request.urlopen(url) as r:
                    r.read()
                    if r.headers["x-cache"] == "hit-memory":
                        break
                time.sleep(0.1)
        rows = []
        for name, size, conc in cases:
            direct = hey(f"{minio.endpoint}/{bucket}/obj-{size}", args.seconds, conc)
            cached = hey(f"{larder.endpoint}/{bucket}/obj-{size}", args.seconds, conc)
            rows.append((name, conc, direct, cached, size))
        cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
        print(f"Machine: {platform.node()}, {cpu}, {len(open('/proc/cpuinfo').read().split('processor')) - 1} cores, "
              f"Linux {platform.release()}; hey -z {args.seconds}s; Larder and MinIO on loopback, memory-hit reads.\n")
        print("| object | clients | target | req/s | MiB/s | p50 ms | p99 ms |")
        print("|---|---|---|---|---|---|---|")
        for name, conc, d, c, size in rows:
            for label, r in (("MinIO direct", d), ("Larder (hit-memory)", c)):
                print(f"| {name} | {conc} | {label} | {r['rps']:.0f} | {r['rps'] * size / MiB:.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} |")
            print(f"| {name} | {conc} | **Larder / direct** | **{c['rps'] / d['rps']:.2f}x** | | "
                  f"**{c['p50_ms'] / d['p50_ms']:.2f}x** | **{c['p99_ms'] / d['p99_ms']:.2f}x** |")
    finally:
        larder.stop()
        minio.stop()


if __name__ == "__main__":
    main()
