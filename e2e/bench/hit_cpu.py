"""CPU per request of memory hits: Larder builds (or settings) side by side with nginx, runs
alternated, for comparing one change's cost on a noisy machine.

    python3 e2e/bench/hit_cpu.py --size 4096 --clients 16 --seconds 5 --rounds 5 \\
        before:base after:release 'one-worker:release:TOKIO_WORKER_THREADS=1'

Each variant is NAME:PROFILE[:ENV=V,...[:ARG;ARG...]]: the `larder` binary of target/PROFILE, with
those environment variables and extra `serve` arguments. Every round reads one cached object with
wrk against each variant and nginx in turn (every body checked, as compare.py's hits are), and
prints requests per second, the server's CPU time per 1,000 requests (user + system of its
processes), latency percentiles, and its context switches per request (voluntary and involuntary,
of every thread of its processes). The medians per variant close the output. Clients sign with SigV4
presigned URLs, as in compare.py; nginx's read anonymously. Not part of the test suite.

`--disk N` measures disk hits instead: N objects of `--size`, each Larder with an 8 MiB memory
tier in front of a disk tier twice their total (compare.py's disk-hit setup), warmed through its
admin API; wrk reads the N keys in turn. Make N × `--size` well over 8 MiB (e.g. 1,024 × 64
KiB), or most reads are memory hits: the closing metrics line says which tier served them.

Larders run with `--metadata-ttl 1h`, on nginx's terms (it caches for an hour without
revalidating), as compare.py's do, unless a variant's ARGS give their own `--metadata-ttl`. With
the default 60 s, a Larder left idle while the other variants run, past the last tenth of its
keys' TTL, starts its next round revalidating every key, each connection waiting for a HEAD: the
variant whose rounds fall there shows a 40 to 200 ms p99 and a fifth less throughput whatever
its build (measured 2026-12-07, 1,024 × 64 KiB disk hits: p99 44 ms in the same variant's
rounds 1 and 2 and 136 ms in another's round 0, against 2.0 to 3.2 ms for every round at 1 h).

`--pin` runs the servers on the first core and the load generator on the others (with two
cores: one each), as production has its clients on other machines. On a shared core a server's
thread is preempted each time its response wakes the client (most of Larder's context switches
per request in the unpinned runs are that), and how often depends on how many threads the
server runs; pinned, the rounds spread far less. Each server starts pinned, so it sizes itself
for one core as it would in a one-core container (tokio one worker; nginx's `auto` its own
way: the output gives its worker count).

`--h2` reads over HTTP/2 instead (h2load from nghttp2-client, cleartext with prior knowledge,
one stream at a time per connection unless `--streams`; nginx listens with `http2`). h2load
checks statuses, not bodies (the warm-up reads check those), and reports no percentiles: its
lines give the mean and standard deviation of the time per request.

`--tls` reads over HTTPS: every Larder with `--tls-cert` and `--tls-key`, and nginx on a port
with `ssl`, both with one self-signed ECDSA P-256 certificate made for the run; HTTP/1.1 (wrk),
or with `--h2` HTTP/2 chosen by ALPN (h2load). nginx cannot `sendfile` under TLS: it reads its
cache file and encrypts, as Larder encrypts its cached block.
"""

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import CLIENT_KEY, CLIENT_SECRET, Bench, Larder, Target, h2load, s3_client, self_signed  # noqa: E402


def context_switches(pid: int) -> int:
    """Voluntary and involuntary context switches of a process's threads and its children's."""
    total, todo = 0, [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").iterdir():
            for line in (task / "status").read_text().splitlines():
                if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                    total += int(line.split()[1])
            todo += [int(c) for c in (task / "children").read_text().split()]
    return total


def variant(text: str) -> tuple[str, str, dict, list]:
    parts = text.split(":")
    if len(parts) < 2:
        raise argparse.ArgumentTypeError("NAME:PROFILE[:ENV=V,...[:ARG;ARG...]]")
    env = dict(kv.split("=", 1) for kv in parts[2].split(",") if kv) if len(parts) > 2 else {}
    extra = [a for a in parts[3].split(";") if a] if len(parts) > 3 else []
    return parts[0], parts[1], env, extra


def variant_bench(args) -> Bench:
    """The bench (MinIO behind the latency proxy, output under `args.out`) for comparing
    `args.variants`: the latency proxy comes from the first variant's profile."""
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ["LARDER_E2E_PROFILE"] = args.variants[0][1]
    return Bench("quick", args.out)


def median(values):
    values = sorted(values)
    return values[len(values) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=4096, help="object size in bytes")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path("target/bench/hit-cpu"))
    ap.add_argument("--disk", type=int, default=0, metavar="N",
                    help="disk hits of N objects (8 MiB memory tier) instead of memory hits of one")
    ap.add_argument("--h2", action="store_true", help="HTTP/2 (h2load) instead of HTTP/1.1 (wrk)")
    ap.add_argument("--tls", action="store_true", help="HTTPS to every server (with --h2: HTTP/2 by ALPN)")
    ap.add_argument("--streams", type=int, default=1, help="with --h2: concurrent streams per connection")
    ap.add_argument("--pin", action="store_true",
                    help="servers on the first core, the load generator on the others")
    ap.add_argument("variants", nargs="+", type=variant)
    args = ap.parse_args()
    bench = variant_bench(args)
    if args.disk:
        keys = [f"hit-cpu/disk/{i}" for i in range(args.disk)]
    else:
        keys = ["hit-cpu/hot"]
    sizes = {k: args.size for k in keys}
    try:
        bench.start()
        bench.upload(sizes.items())
        cores = sorted(os.sched_getaffinity(0))
        if args.pin:
            if len(cores) < 2:
                raise SystemExit("--pin needs two cores")
            # Inherited by the servers started from here on (and their threads).
            os.sched_setaffinity(0, cores[:1])
        # nginx is warmed first: 1,024 cold reads through it take longer than the default
        # metadata_ttl, and a variant that sets it would start round 0 revalidating every key.
        tls = self_signed(bench.work) if args.tls else None
        nginx, nt = bench.nginx("nginx", 1 << 30, http2=args.h2, tls=tls)
        bench.warm_by_reading(nt, keys, sizes, {"HIT"})
        if tls:
            nt = Target("nginx", nginx.tls_endpoint, pid=nt.pid)
        elif args.h2:
            nt = Target("nginx", nginx.h2_endpoint, pid=nt.pid)
        targets, larders = [], {}
        for name, profile, env, extra in args.variants:
            os.environ["LARDER_E2E_PROFILE"] = profile
            if args.disk:
                tiers = ("--memory-capacity", "8MiB", "--disk-path", str(bench.work / f"{name}.cache"),
                         "--disk-capacity", f"{max(512, 2 * args.disk * args.size >> 20)}MiB")
            else:
                tiers = ("--memory-capacity", "1GiB")
            if tls:
                tiers += ("--tls-cert", str(tls[0]), "--tls-key", str(tls[1]))
            ttl = () if "--metadata-ttl" in extra else ("--metadata-ttl", "1h")
            larder = Larder(bench.work, bench.proxy.endpoint, *tiers, *ttl, *extra, name=name, env=env)
            bench.stoppers.append(larder.stop)
            # A Larder with `--auth none` is read as nginx is, with anonymous URLs.
            unsigned = "none" in (extra[i + 1] for i, a in enumerate(extra[:-1]) if a == "--auth")
            presigner = None if unsigned else s3_client(larder.endpoint, CLIENT_KEY, CLIENT_SECRET,
                                                        signature_version="s3v4")
            endpoint = larder.endpoint.replace("http://", "https://") if tls else larder.endpoint
            t = Target("Larder", endpoint, presigner, pid=larder.proc.pid)
            if args.disk:
                bench.warm_prefix(larder, "hit-cpu/disk/")
            else:
                bench.warm_by_reading(t, keys, sizes, {"hit-memory"})
            targets.append((name, t))
            larders[name] = larder
        targets.append(("nginx", nt))
        if args.pin:
            # wrk and h2load, started from here on, get the other cores.
            os.sched_setaffinity(0, cores[1:])
            children = Path(f"/proc/{nt.pid}/task/{nt.pid}/children").read_text().split()
            workers = [c for c in children if b"worker process" in Path(f"/proc/{c}/cmdline").read_bytes()]
            print(f"pinned: servers on core {cores[0]}, load on {cores[1:]}; nginx runs {len(workers)} workers")
        results = {name: [] for name, _ in targets}
        for n in range(args.rounds):
            for name, t in targets:
                before = context_switches(t.pid)
                if args.h2:
                    r = h2load(t, keys, args.clients, args.streams, args.seconds)
                else:
                    r = bench.wrk(t, keys, sizes, args.clients, args.seconds)
                switches = (context_switches(t.pid) - before) / r["requests"]
                results[name].append(r)
                if args.h2:
                    print(f"round {n} {name}: {r['rps']:.0f} req/s, CPU {r['cpu_ms_per_1k']:.1f} ms per 1k, "
                          f"time per request mean {r['mean']} sd {r['sd']}, "
                          f"{switches:.3f} context switches per request", flush=True)
                    continue
                print(f"round {n} {name}: {r['rps']:.0f} req/s, CPU {r['cpu_ms_per_1k']:.1f} ms per 1k "
                      f"(wrk {r['client_cpu_ms_per_1k']:.1f}), p50 {r['p50_us']:.2f} p99 {r['p99_us']:.2f} p99.9 {r['p999_us']:.2f} ms, "
                      f"{switches:.3f} context switches per request", flush=True)
        for name, rs in results.items():
            print(f"{name}: CPU ms per 1k requests {[round(r['cpu_ms_per_1k'], 1) for r in rs]}, median "
                  f"{median(r['cpu_ms_per_1k'] for r in rs):.1f}; req/s median {median(r['rps'] for r in rs):.0f}"
                  + ("" if args.h2 else f"; wrk's CPU median {median(r['client_cpu_ms_per_1k'] for r in rs):.1f}"))
        if args.disk:
            for name, larder in larders.items():
                print(f"{name}: " + ", ".join(l for l in larder.metrics().splitlines()
                                               if l.startswith(("larder_disk_hits_total", "larder_disk_page_cache",
                                                                "larder_disk_io_thread", "larder_memory_hits",
                                                                "larder_buffer_pool_fresh", "larder_buffer_pool_given_back",
                                                                "larder_cache_lookups_total", "larder_memory_promotions"))))
    finally:
        bench.stop()


if __name__ == "__main__":
    main()
