"""Three Larder replicas as one fleet (in clear and over TLS) vs three independent Larders, on the
same Zipf workload.

    python3 e2e/bench/fleet_bench.py [--objects 600] [--requests 12000] [--out DIR]

after `cargo build --release -p larder -p larder-latency-proxy` (and e2e/setup.sh for MinIO and
boto3); about 6 minutes with the defaults. MinIO behind the latency proxy
(20-50 ms per request, 1 % 200 ms more, every request counted where it lands), 1 MiB objects read
with Zipf popularity (exponent 1.0), requests spread round-robin over the three replicas by 12
threads, every body checked. Each replica has the same memory in both setups: in the fleet, 1/8 of
it holds copies of blocks fetched from their owners, the rest is its memory tier. The TLS fleet
uses a CA and a certificate made here with openssl, as the Helm chart's. The replicas' CPU time
(user + system, all three) is counted per setup. Prints a table and writes results.json to DIR.
"""

import argparse
import bisect
import json
import random
import sys
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import (  # noqa: E402
    GET_PRICE, MiB, Bench, Reader, Target, content, machine, percentile, run_threads, s3_client,
)
from conftest import (  # noqa: E402
    CLIENT_KEY, CLIENT_SECRET, Larder, fleet_tls_flags, free_port, issue_certificate, make_ca,
)

SECRET = "fleet-benchmark-shared-secret-000"


def zipf_sequence(keys, requests, s=1.0, seed=20261123):
    rng = random.Random(seed)
    order = keys[:]
    rng.shuffle(order)
    weights = [1 / (rank + 1) ** s for rank in range(len(keys))]
    cdf, acc = [], 0.0
    for w in weights:
        acc += w
        cdf.append(acc)
    return [order[bisect.bisect_left(cdf, rng.random() * acc)] for _ in range(requests)]


class FleetBench(Bench):
    def certificates(self) -> Path:
        certs = self.work / "fleet-certs"
        if not certs.exists():
            certs.mkdir()
            make_ca(certs, "fleet-ca")
            issue_certificate(certs, "fleet-ca", "fleet", "DNS:larder-fleet")
        return certs

    def replicas(self, name, fleet: bool, memory: int, tls: bool = False):
        peer_port = free_port()
        secret = self.work / f"{name}.secret"
        secret.write_text(SECRET)
        peers = ",".join(f"127.0.0.{i + 1}:{peer_port}" for i in range(3))
        nodes, targets = [], []
        for i in range(3):
            if fleet:
                copies = memory // 8
                extra = ["--memory-capacity", f"{(memory - copies) // MiB}MiB",
                         "--fleet-copy-capacity", f"{copies // MiB}MiB",
                         "--fleet-peers", peers, "--fleet-listen", f"127.0.0.{i + 1}:{peer_port}",
                         "--fleet-secret-file", str(secret), "--fleet-refresh", "500ms"]
                if tls:
                    extra += fleet_tls_flags(self.certificates())
            else:
                extra = ["--memory-capacity", f"{memory // MiB}MiB"]
            node = Larder(self.work, self.proxy.endpoint, *extra, name=f"{name}-{i}", host=f"127.0.0.{i + 1}")
            self.stoppers.append(node.stop)
            nodes.append(node)
            targets.append(Target(f"{name}-{i}", node.endpoint, s3_client(node.endpoint, CLIENT_KEY, CLIENT_SECRET),
                                  pid=node.proc.pid))
        if fleet:
            for _ in range(200):
                sizes = []
                for node in nodes:
                    with urllib.request.urlopen(f"{node.admin}/fleet", timeout=5) as r:
                        sizes.append(len(json.loads(r.read())["members"]))
                if sizes == [3, 3, 3]:
                    break
                time.sleep(0.1)
            else:
                raise RuntimeError(f"the fleet never formed: {sizes}")
        return nodes, targets

    def run_setup(self, label, targets, sequence, size, threads=12):
        self.proxy.control("reset")
        lock = threading.Lock()
        statuses: dict = {}
        latencies = []
        nxt = iter(range(len(sequence)))

        def worker():
            readers = [Reader(t) for t in targets]
            try:
                while True:
                    with lock:
                        i = next(nxt, None)
                    if i is None:
                        return
                    key = sequence[i]
                    _, total, status = readers[i % len(readers)].get(key, content(key, size))
                    with lock:
                        statuses[status] = statuses.get(status, 0) + 1
                        latencies.append(total * 1000)
            finally:
                for r in readers:
                    r.close()

        cpu_before = sum(t.cpu_seconds() for t in targets)
        elapsed = run_threads(threads, worker, label)
        cpu = sum(t.cpu_seconds() for t in targets) - cpu_before
        up = self.upstream()
        requests = len(sequence)
        local_hits = sum(v for k, v in statuses.items() if k.startswith("hit"))
        upstream_requests = up["gets"] + up["heads"]
        row = {"setup": label, "requests": requests, "cache": statuses,
               "local_hit_ratio": local_hits / requests,
               "upstream_gets": up["gets"], "upstream_heads": up["heads"], "upstream_mib": up["bytes"] / MiB,
               "requests_avoided": 1 - upstream_requests / requests,
               "byte_hit_ratio": 1 - up["bytes"] / (requests * size),
               "dollars_per_million": 1e6 * GET_PRICE * upstream_requests / requests,
               "p50": percentile(latencies, 50), "p99": percentile(latencies, 99), "seconds": elapsed,
               "cpu_ms_per_request": 1000 * cpu / requests}
        print(f"  {label}: {up['gets']} GETs + {up['heads']} HEADs upstream ({row['upstream_mib']:.0f} MiB) for "
              f"{requests} requests; avoided {row['requests_avoided']:.3f}; local hits {row['local_hit_ratio']:.3f}; "
              f"p50 {row['p50']:.1f} p99 {row['p99']:.1f} ms; CPU {row['cpu_ms_per_request']:.2f} ms a request; {statuses}",
              flush=True)
        return row

    def compare(self, objects, requests):
        size = 1 * MiB
        keys = [f"fleet/{i}" for i in range(objects)]
        self.upload([(k, size) for k in keys])
        sequence = zipf_sequence(keys, requests)
        memory = max(16 * MiB, objects * size // 10)
        rows = []
        for label, fleet, tls in (("3 independent", False, False), ("fleet of 3", True, False),
                                  ("fleet of 3 over TLS", True, True)):
            nodes, targets = self.replicas(label.replace(" ", "-"), fleet, memory, tls)
            rows.append(self.run_setup(label, targets, sequence, size))
            for node in nodes:
                node.stop()
                self.stoppers.remove(node.stop)
        self.results["workloads"]["fleet"] = rows
        self.results["fleet_setup"] = {"objects": objects, "object_size": size, "exponent": 1.0,
                                       "requests": requests, "memory_per_replica": memory, "threads": 12}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--objects", type=int, default=600)
    ap.add_argument("--requests", type=int, default=12000)
    ap.add_argument("--out", type=Path, default=Path("target/bench/fleet"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    bench = FleetBench("quick", args.out)
    bench.results["machine"] = machine()
    try:
        bench.start()
        bench.compare(args.objects, args.requests)
    finally:
        bench.stop()
    (args.out / "results.json").write_text(json.dumps(bench.results, indent=1))
    rows = bench.results["workloads"]["fleet"]
    print("\n| setup | upstream GETs | upstream HEADs | upstream MiB | requests avoided | local hit ratio | p50 ms "
          "| p99 ms | CPU ms a request |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['setup']} | {r['upstream_gets']} | {r['upstream_heads']} | {r['upstream_mib']:.0f} | "
              f"{r['requests_avoided']:.3f} | {r['local_hit_ratio']:.3f} | {r['p50']:.1f} | {r['p99']:.1f} | "
              f"{r['cpu_ms_per_request']:.2f} |")
    print(f"results in {args.out}")


if __name__ == "__main__":
    main()
