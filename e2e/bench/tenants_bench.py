"""Two teams on one Larder: an interactive key reading small objects one after another while a
batch key reads large ones as fast as it can, with the batch key unlimited and then limited by
its policy (`bytes_per_second`, `auth_policies`).

    python3 e2e/bench/tenants_bench.py [--seconds 20] [--batch-readers 6] [--limit 100MiB] [--out DIR]

after `cargo build --release -p larder -p larder-latency-proxy` (and e2e/setup.sh for MinIO and
boto3); about 2 minutes with the defaults. Every object is read once before the timed part, so
both keys read memory hits: what the batch key takes is Larder's CPU and the machine's, not the
upstream. The batch readers are processes of their own (keep-alive HTTP/1.1, presigned with the
batch key, every body checked), so the interactive reader's clock is not held by their
interpreter lock. Three setups, each `--seconds` long: the interactive key alone, beside an
unlimited batch key, and beside a batch key limited to `--limit` a second. Prints a table and
writes results.json to DIR.
"""

import argparse
import json
import multiprocessing
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import (  # noqa: E402
    MiB, Bench, Reader, Target, content, machine, percentile, s3_client,
)
from conftest import CLIENT_KEY, CLIENT_SECRET, READER_KEY, READER_SECRET  # noqa: E402

BATCH = [f"batch/{i}" for i in range(6)]
BATCH_SIZE = 8 * MiB
SMALL = [f"small/{i}" for i in range(200)]
SMALL_SIZE = 64 << 10


def batch_reader(endpoint: str, pid: int, seconds: float, expected: dict, ready, go, done):
    """One batch process: reads the large objects in turn until `seconds` have passed, each
    body checked against `expected` (the objects' bytes are random per process, so they are
    handed over)."""
    target = Target("batch", endpoint, s3_client(endpoint, READER_KEY, READER_SECRET, signature_version="s3v4"),
                    pid=pid)
    reader = Reader(target)
    ready.put(True)
    go.wait(timeout=300)
    got, i = 0, 0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        key = BATCH[i % len(expected)]
        reader.get(key, expected[key])
        got += BATCH_SIZE
        i += 1
    reader.close()
    done.put(got)


class TenantsBench(Bench):
    def run_setup(self, label: str, limit: str | None, readers: int, seconds: float) -> dict:
        name = "".join(c if c.isalnum() else "-" for c in label)
        policy = self.work / f"{name}.toml"
        rates = f'bytes_per_second = "{limit}"\n' if limit else ""
        policy.write_text(f'[[auth_policies]]\naccess_key = "{READER_KEY}"\n{rates}')
        node, _ = self.larder(name, "--config", str(policy), "--memory-capacity", "1GiB")
        presigner = s3_client(node.endpoint, CLIENT_KEY, CLIENT_SECRET, signature_version="s3v4")
        interactive = Target("interactive", node.endpoint, presigner, pid=node.proc.pid)
        warm = Reader(interactive)
        large = {k: bytes(content(k, BATCH_SIZE)) for k in BATCH}
        for k in BATCH:
            warm.get(k, large[k])
        small = {k: bytes(content(k, SMALL_SIZE)) for k in SMALL}
        for k in SMALL:
            warm.get(k, small[k])
        warm.close()
        # Spawned, not forked: this process runs threads (MinIO's event relay).
        spawn = multiprocessing.get_context("spawn")
        ready, go, done = spawn.Queue(), spawn.Event(), spawn.Queue()
        procs = [spawn.Process(target=batch_reader,
                               args=(node.endpoint, node.proc.pid, seconds, large, ready, go, done))
                 for _ in range(readers if label != "interactive alone" else 0)]
        for p in procs:
            p.start()
        for _ in procs:
            ready.get(timeout=300)
        cpu_before = interactive.cpu_seconds()
        started = time.perf_counter()
        go.set()
        reader = Reader(interactive)
        latencies = []
        i = 0
        deadline = started + seconds
        while time.perf_counter() < deadline:
            key = SMALL[i % len(SMALL)]
            _, total, status = reader.get(key, small[key])
            if not status.startswith("hit"):
                raise RuntimeError(f"{key}: {status}, expected a hit")
            latencies.append(total * 1000)
            i += 1
        reader.close()
        batch_bytes = sum(done.get(timeout=120) for _ in procs)
        for p in procs:
            p.join(timeout=60)
        elapsed = time.perf_counter() - started
        cpu = interactive.cpu_seconds() - cpu_before
        node.stop()
        self.stoppers.remove(node.stop)
        row = {"setup": label, "limit": limit, "batch_readers": len(procs),
               "batch_mib_per_s": batch_bytes / MiB / elapsed,
               "interactive_requests": len(latencies),
               "p50": percentile(latencies, 50), "p99": percentile(latencies, 99),
               "p999": percentile(latencies, 99.9), "larder_cpu_share": cpu / elapsed}
        print(f"  {label}: batch {row['batch_mib_per_s']:.0f} MiB/s; interactive {len(latencies)} reads, "
              f"p50 {row['p50']:.2f} p99 {row['p99']:.2f} p99.9 {row['p999']:.2f} ms; "
              f"Larder's CPU {row['larder_cpu_share']:.2f} cores", flush=True)
        return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--batch-readers", type=int, default=6)
    ap.add_argument("--limit", default="100MiB")
    ap.add_argument("--out", type=Path, default=Path("target/bench/tenants"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    bench = TenantsBench("quick", args.out)
    bench.results["machine"] = machine()
    rows = []
    try:
        bench.start()
        bench.upload([(k, BATCH_SIZE) for k in BATCH] + [(k, SMALL_SIZE) for k in SMALL])
        for label, limit in (("interactive alone", None), ("batch unlimited", None),
                             (f"batch at {args.limit}/s", args.limit)):
            rows.append(bench.run_setup(label, limit, args.batch_readers, args.seconds))
    finally:
        bench.stop()
    bench.results["workloads"]["tenants"] = rows
    (args.out / "results.json").write_text(json.dumps(bench.results, indent=1))
    print("\n| setup | batch MiB/s | interactive reads | p50 ms | p99 ms | p99.9 ms | Larder's CPU (cores) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['setup']} | {r['batch_mib_per_s']:.0f} | {r['interactive_requests']} | {r['p50']:.2f} | "
              f"{r['p99']:.2f} | {r['p999']:.2f} | {r['larder_cpu_share']:.2f} |")
    print(f"results in {args.out}")


if __name__ == "__main__":
    main()
