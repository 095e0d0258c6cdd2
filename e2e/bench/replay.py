"""Trace replay: one request sequence, in order, through Larder, nginx proxy_cache and direct S3,
counted where it lands, beside libCacheSim's reference policies on the same sequence at the same
capacity.

    python3 e2e/bench/replay.py --workload zipf-1.0 --capacity 0.05,0.2 --out DIR

Workloads (`--workload`, comma-separated):
- `zipf-0.8`, `zipf-1.0`, `zipf-1.2`: whole-object GETs of `--objects` objects of `--object-size`,
  keys drawn from a Zipf distribution of that exponent;
- `scan`: the `zipf-1.0` hot set, polluted by one-off sequential scans of cold objects (a batch
  job reading a table once): every 500 requests, a scan of 100 objects never read again;
- `mixed`: `zipf-1.0` over objects of log-normal sizes (median `--object-size`, sigma 2) between
  1 KiB and 64 MiB, so that small objects must cost what they weigh;
- `trace:PATH`: the keys of a recorded trace (cache2k's big-endian 32-bit keys, `.xz`; or one
  integer key per line, `.gz` or plain), each given a size from a seeded log-normal (median
  `--object-size`, sigma 1, capped at 16x the median).

Every system gets the same total capacity (`--capacity`, a share of the working set's bytes):
Larder's memory and disk tiers together (`--tiers hybrid`: a sixth in memory, the rest on disk;
`--tiers memory`: all in memory), nginx's `max_size`, libCacheSim's cache size; and the same
staleness bound (Larder `metadata_ttl = 1h`, nginx `proxy_cache_valid 200 1h`).

Requests go one at a time, in order, through the latency proxy in front of MinIO, with no added
latency. After each request the proxy's counters say whether it reached the upstream: a request
that caused no upstream GET is a hit, and its bytes are hit bytes (what each cache says of itself
is not used); the bytes that did come from the upstream are reported beside. Every body is
checked byte for byte. nginx's `max_size` is a target its cache manager trims towards, not a
bound: how much its cache held at the end is reported too. Results (results.json, results.md, hit-ratio curves) go to DIR.
"""

import argparse
import bisect
import gzip
import json
import lzma
import math
import random
import struct
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
from compare import (BUCKET, KiB, MiB, LatencyProxy, Nginx, Reader, Target, content,  # noqa: E402
                     machine, public_read, stop_all)
from conftest import CLIENT_KEY, CLIENT_SECRET, Larder, Minio, s3_client  # noqa: E402

SEED = 20261124
# libCacheSim's policies, by the name the results use.
POLICIES = ["LRU", "S3-FIFO", "SIEVE", "W-TinyLFU", "ARC", "Belady"]


# ---------------------------------------------------------------------------------------------
# Request sequences: a list of integer keys, and each key's size.
def zipf_keys(n: int, requests: int, s: float, rng: random.Random) -> list[int]:
    order = list(range(n))
    rng.shuffle(order)  # popularity is not key order
    cdf, acc = [], 0.0
    for rank in range(n):
        acc += 1 / (rank + 1) ** s
        cdf.append(acc)
    return [order[bisect.bisect_left(cdf, rng.random() * acc)] for _ in range(requests)]


def lognormal(rng: random.Random, median: int, sigma: float, low: int, high: int) -> int:
    return int(min(high, max(low, median * math.exp(rng.gauss(0, sigma)))))


def read_trace(path: Path) -> list[int]:
    raw = path.read_bytes()
    if path.suffix == ".xz":
        raw = lzma.decompress(raw)
        return list(struct.unpack(f">{len(raw) // 4}i", raw[:len(raw) // 4 * 4]))
    if path.suffix == ".gz":
        raw = gzip.decompress(raw)
    return [int(x) for x in raw.split()]


def workload(name: str, args) -> tuple[list[int], dict[int, int], str]:
    """The sequence, the sizes, and a sentence saying what they are."""
    rng = random.Random(SEED)
    n, requests, size = args.objects, args.requests, args.object_size
    if name.startswith("zipf-"):
        s = float(name.split("-", 1)[1])
        seq = zipf_keys(n, requests, s, rng)
        return seq, {k: size for k in set(seq)}, (
            f"{requests:,} GETs, Zipf exponent {s} over {n:,} objects of {size // KiB:,} KiB")
    if name == "scan":
        hot = zipf_keys(n, requests, 1.0, rng)
        seq, cold = [], n
        for i, k in enumerate(hot):
            seq.append(k)
            if i % 500 == 499:
                seq.extend(range(cold, cold + 100))
                cold += 100
        return seq, {k: size for k in set(seq)}, (
            f"{len(seq):,} GETs: Zipf 1.0 over {n:,} objects of {size // KiB:,} KiB, and every 500 of "
            f"them a sequential scan of 100 objects read once ({cold - n:,} in all)")
    if name == "mixed":
        seq = zipf_keys(n, requests, 1.0, rng)
        sizes = {k: lognormal(rng, size, 2.0, KiB, 64 * MiB) for k in range(n)}
        return seq, {k: sizes[k] for k in set(seq)}, (
            f"{requests:,} GETs, Zipf 1.0 over {n:,} objects of log-normal sizes (median "
            f"{size // KiB:,} KiB, sigma 2, 1 KiB to 64 MiB)")
    if name.startswith("trace:"):
        path = Path(name.split(":", 1)[1])
        keys = read_trace(path)[:requests]
        ids: dict[int, int] = {}
        seq = [ids.setdefault(k, len(ids)) for k in keys]
        sizes = {k: lognormal(rng, size, 1.0, KiB, 16 * size) for k in range(len(ids))}
        return seq, sizes, (
            f"the first {len(seq):,} requests of {path.name} ({len(ids):,} keys), sizes log-normal "
            f"(median {size // KiB:,} KiB, sigma 1, capped at {16 * size // KiB:,} KiB), seed {SEED}")
    raise SystemExit(f"unknown workload {name}")


def key_name(k: int) -> str:
    return f"replay/{k}"


# ---------------------------------------------------------------------------------------------
def simulate(policy: str, seq: list[int], sizes: dict[int, int], capacity: int) -> dict:
    """libCacheSim's `policy` over `seq` at `capacity` bytes: request and byte hit ratios."""
    import libcachesim as lcs  # noqa: PLC0415 - installed by run.sh
    make = {"LRU": lcs.LRU, "S3-FIFO": lcs.S3FIFO, "SIEVE": lcs.Sieve, "W-TinyLFU": lcs.WTinyLFU,
            "ARC": lcs.ARC, "Belady": lcs.BeladySize if len(set(sizes.values())) > 1 else lcs.Belady}[policy]
    following, last = [0] * len(seq), {}
    for i in range(len(seq) - 1, -1, -1):
        following[i] = last.get(seq[i], 1 << 62)
        last[seq[i]] = i
    cache = make(capacity)
    hits = hit_bytes = total_bytes = 0
    for i, k in enumerate(seq):
        req = lcs.Request(obj_size=sizes[k], obj_id=k + 1, clock_time=i, next_access_vtime=following[i],
                          op=lcs.ReqOp.OP_GET)
        hit = cache.get(req)
        hits += hit
        total_bytes += sizes[k]
        hit_bytes += sizes[k] if hit else 0
    row = {"system": f"libCacheSim {policy}", "hit_ratio": hits / len(seq), "byte_hit_ratio": hit_bytes / total_bytes}
    if cache.get_n_obj() == 0:
        # Seen with W-TinyLFU on caches of under ~100 objects: it admits nothing at all.
        row["failed"] = "held no object"
    return row


def region_size(disk: int, value: int, block: int) -> int:
    """The whole-MiB region size an operator would pick for a disk tier this small: larger than a
    block, at least four regions, and holding the most entries of a typical `value` (each with
    its 4 KiB header page, a region with its header page and summary) after the superblock's
    MiB, on average (the region being written is half empty). The default (64 MiB) suits disks
    of gigabytes; here it would not fit twice."""
    entry = -(-value // (4 * KiB)) * 4 * KiB + 4 * KiB
    best = (0, max(block + MiB, 2 * MiB) // MiB * MiB)
    for r in range(1, 65):
        size = r * MiB
        regions = (disk - MiB) // size
        if size <= block or regions < 4:
            continue
        held = (regions - 0.5) * ((size - 8 * KiB) // entry)
        if held > best[0]:
            best = (held, size)
    return best[1]


class Replay:
    def __init__(self, args):
        self.args = args
        self.work = Path(tempfile.mkdtemp(prefix="larder-replay-", dir="/var/tmp"))
        self.work.chmod(0o755)  # nginx's workers run as an unprivileged user when started as root
        self.stoppers = []
        self.uploaded: set[int] = set()

    def start(self):
        self.minio = Minio(self.work)
        self.stoppers.append(self.minio.stop)
        s3 = s3_client(self.minio.endpoint)
        s3.create_bucket(Bucket=BUCKET)
        public_read(s3)
        self.proxy = LatencyProxy(self.work, self.minio.port)
        self.stoppers.append(self.proxy.stop)
        self.proxy.latency(delay_ms=0, jitter_ms=0, tail_fraction=0, tail_ms=0)

    def stop(self):
        stop_all(self.stoppers, self.work)

    def upload(self, sizes: dict[int, int]):
        todo = [(k, s) for k, s in sizes.items() if k not in self.uploaded]

        def put(ks):
            k, size = ks
            s3_client(self.minio.endpoint).put_object(Bucket=BUCKET, Key=key_name(k), Body=bytes(content(key_name(k), size)))
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(put, todo))
        self.uploaded.update(k for k, _ in todo)

    def upstream(self) -> dict:
        s = self.proxy.control("stats")
        return {"gets": s["by_method"].get("GET", 0), "heads": s["by_method"].get("HEAD", 0), "bytes": s["response_bytes"]}

    def replay(self, target: Target, seq: list[int], sizes: dict[int, int]) -> dict:
        """`seq` through `target`, one request at a time; a request is a hit when no upstream GET
        arrived while it was served."""
        self.proxy.control("reset")
        reader, hits, hit_bytes, before = Reader(target), 0, 0, 0
        started = time.monotonic()
        try:
            for k in seq:
                reader.get(key_name(k), content(key_name(k), sizes[k]))
                gets = self.upstream()["gets"]
                if gets == before:
                    hits += 1
                    hit_bytes += sizes[k]
                before = gets
        finally:
            reader.close()
        up = self.upstream()
        requested = sum(sizes[k] for k in seq)
        return {"system": target.name, "hit_ratio": hits / len(seq), "byte_hit_ratio": hit_bytes / requested,
                "upstream_gets": up["gets"], "upstream_heads": up["heads"], "upstream_mib": up["bytes"] / MiB,
                "upstream_per_million": 1e6 * (up["gets"] + up["heads"]) / len(seq),
                "seconds": time.monotonic() - started}

    def variants(self, tiers: str) -> list[tuple[str, list[str]]]:
        """Larder configurations to compare on the hybrid tiers: every write policy and disk
        admission asked for, as (label, flags); one unlabelled default otherwise."""
        if tiers != "hybrid":
            return [("", [])]
        axes = [[(v, ["--disk-write-policy", v]) for v in self.args.write_policy.split(",") if v],
                [(v, ["--disk-admission", v]) for v in self.args.disk_admission.split(",") if v]]
        out = [("", [])]
        for axis in (a for a in axes if a):
            out = [(", ".join(x for x in (label, v) if x), flags + more) for label, flags in out for v, more in axis]
        return out

    def larder(self, name: str, capacity: int, tiers: str, variant: tuple[str, list[str]]) -> tuple[Larder, Target]:
        block = self.args.block_size
        common = ["--block-size", f"{block // KiB}KiB", "--metadata-ttl", "1h"]
        common += variant[1]
        common += self.args.larder_args.split()
        if tiers == "memory":
            extra = ["--memory-capacity", f"{max(capacity, block) // KiB}KiB"]
        else:
            memory = max(capacity // 6, block)
            disk = capacity - memory
            region = region_size(disk, min(self.args.object_size, block), block)
            extra = ["--memory-capacity", f"{memory // KiB}KiB", "--disk-path", str(self.work / f"{name}.cache"),
                     "--disk-capacity", f"{disk // KiB}KiB", "--disk-region-size", f"{region // MiB}MiB"]
        larder = Larder(self.work, self.proxy.endpoint, *common, *extra, name=name)
        self.stoppers.append(larder.stop)
        label = f"Larder ({variant[0]})" if variant[0] else "Larder"
        return larder, Target(label, larder.endpoint, s3_client(larder.endpoint, CLIENT_KEY, CLIENT_SECRET))

    def replay_nginx(self, label: str, capacity: int, seq: list[int], sizes: dict[int, int]) -> dict:
        nginx = Nginx(self.work, self.proxy.port, max(capacity, MiB), f"nginx-{label}"[:80])
        self.stoppers.append(nginx.stop)
        # nginx starts its cache loader a minute after itself; give it that before the replay.
        time.sleep(self.args.nginx_settle)
        row = self.replay(Target("nginx", nginx.endpoint), seq, sizes)
        # max_size is a target nginx's cache manager trims towards afterwards: say what it held.
        du = subprocess.run(["du", "-sb", str(nginx.work / "cache")], capture_output=True, text=True)
        row["nginx_cache_bytes"] = int(du.stdout.split()[0]) if du.returncode == 0 else None
        nginx.stop()
        return row

    def run_one(self, name: str, capacity_share: float, tiers: str) -> dict:
        seq, sizes, description = workload(name, self.args)
        working_set = sum(sizes.values())
        capacity = int(working_set * capacity_share)
        print(f"== {name} at {capacity_share:.0%} of {working_set / MiB:.0f} MiB ({capacity / MiB:.1f} MiB), "
              f"Larder {tiers}: {description}", flush=True)
        self.upload(sizes)
        rows = []
        label = f"{name}-{capacity_share}-{tiers}".replace(":", "_").replace("/", "_")

        def report(row):
            rows.append(row)
            print(f"  {row['system']}: hit ratio {row['hit_ratio']:.3f}, byte hit ratio {row['byte_hit_ratio']:.3f}, "
                  f"{row['upstream_gets']:,} GETs + {row['upstream_heads']:,} HEADs upstream, {row['seconds']:.0f} s",
                  flush=True)
        # One Larder at a time, each started empty and stopped after its replay.
        for n, variant in enumerate(self.variants(tiers)):
            larder, lt = self.larder(f"larder-{label}-{n}"[:90], capacity, tiers, variant)
            row = self.replay(lt, seq, sizes)
            m = larder.metrics()
            row["larder_dropped_writes"] = sum(float(l.rsplit(" ", 1)[1]) for l in m.splitlines()
                                               if l.startswith("larder_cache_writes_dropped_total"))
            row["larder_disk_written_mib"] = sum(float(l.rsplit(" ", 1)[1]) for l in m.splitlines()
                                                 if l.startswith("larder_disk_written_bytes_total")) / MiB
            larder.stop()
            report(row)
        if not self.args.skip_nginx:
            report(self.replay_nginx(label, capacity, seq, sizes))
        if not self.args.skip_direct:
            report(self.replay(Target("direct", self.proxy.endpoint), seq, sizes))
        for policy in POLICIES:
            rows.append(simulate(policy, seq, sizes, capacity))
            print(f"  {rows[-1]['system']}: hit ratio {rows[-1]['hit_ratio']:.3f}, "
                  f"byte hit ratio {rows[-1]['byte_hit_ratio']:.3f}", flush=True)
        return {"workload": name, "description": description, "capacity_share": capacity_share,
                "capacity_bytes": capacity, "working_set_bytes": working_set, "requests": len(seq),
                "tiers": tiers, "block_size": self.args.block_size, "rows": rows}


def markdown(results: dict) -> str:
    m = results["machine"]
    out = [f"# Trace replay: hit ratios at equal capacity", "",
           f"**Machine**: {m['cpu']}, {m['cores']} cores; {m['nginx']}; Larder at commit {m['commit']}; {m['date']}.",
           "Requests one at a time, in order; a hit is a request during which no GET reached the upstream. "
           "libCacheSim rows are simulations of the same sequence at the same capacity in bytes.", ""]
    for run in results["runs"]:
        out += [f"## {run['workload']}, {run['capacity_share']:.0%} of the working set "
                f"({run['capacity_bytes'] / MiB:.1f} of {run['working_set_bytes'] / MiB:.0f} MiB), Larder {run['tiers']}",
                "", run["description"] + f"; Larder blocks of {run['block_size'] // KiB:,} KiB.", "",
                "| system | request hit ratio | byte hit ratio | upstream GETs | upstream HEADs | upstream requests per 1M |",
                "|---|---|---|---|---|---|"]
        for r in run["rows"]:
            measured = "upstream_gets" in r
            if r.get("failed"):
                out.append(f"| {r['system']} | failed: {r['failed']} | | | | |")
                continue
            out.append(f"| {r['system']} | {r['hit_ratio']:.3f} | {r['byte_hit_ratio']:.3f} | "
                       + (f"{r['upstream_gets']:,} | {r['upstream_heads']:,} | {r['upstream_per_million']:,.0f} |"
                          if measured else "– | – | – |"))
        notes = [f"{r['system']} wrote {r['larder_disk_written_mib']:,.0f} MiB to disk" for r in run["rows"]
                 if r.get("larder_disk_written_mib")]
        notes += [f"{r['system']} dropped {r['larder_dropped_writes']:.0f} cache writes" for r in run["rows"]
                  if r.get("larder_dropped_writes")]
        notes += [f"nginx's cache held {r['nginx_cache_bytes'] / MiB:.1f} MiB at the end (max_size "
                  f"{max(run['capacity_bytes'], MiB) // MiB} MiB)" for r in run["rows"] if r.get("nginx_cache_bytes")]
        if notes:
            out += ["", "; ".join(notes) + "."]
        out.append("")
    return "\n".join(out)


def plot(results: dict, out: Path):
    """Hit ratio against capacity, one line per system, one panel per workload and tiers."""
    import matplotlib  # noqa: PLC0415
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    groups: dict = {}
    for run in results["runs"]:
        groups.setdefault((run["workload"], run["tiers"]), []).append(run)
    groups = {k: v for k, v in groups.items() if len(v) > 1}
    if not groups:
        return
    fig, axes = plt.subplots(1, len(groups), figsize=(5 * len(groups), 4), squeeze=False)
    for ax, ((name, tiers), runs) in zip(axes[0], groups.items()):
        runs.sort(key=lambda r: r["capacity_share"])
        for system in [r["system"] for r in runs[0]["rows"]]:
            xs = [r["capacity_share"] * 100 for r in runs]
            ys = [next(None if x.get("failed") else x["hit_ratio"] for x in r["rows"] if x["system"] == system)
                  for r in runs]
            ax.plot(xs, ys, marker="o", label=system,
                    linewidth=2.5 if system.startswith("Larder") or system == "nginx" else 1)
        ax.set_title(f"{Path(name).name}, Larder {tiers}")
        ax.set_xlabel("capacity, % of working set")
        ax.set_ylabel("request hit ratio")
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "replay.png", dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="zipf-1.0")
    ap.add_argument("--capacity", default="0.05,0.2", help="comma-separated shares of the working set")
    ap.add_argument("--tiers", default="hybrid", help="comma-separated: hybrid, memory")
    ap.add_argument("--objects", type=int, default=2000)
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--object-size", type=lambda v: int(float(v.rstrip("KiB")) * KiB) if v.endswith("KiB") else int(v),
                    default=256 * KiB, help="bytes, or N KiB (e.g. 256KiB)")
    ap.add_argument("--block-size", type=lambda v: int(v.rstrip("KiB")) * KiB, default=1024 * KiB,
                    help="Larder's block size in KiB (e.g. 1024KiB)")
    ap.add_argument("--disk-admission", default="",
                    help="comma-separated Larder disk_admission values to compare (hybrid tiers); "
                         "empty: Larder's default")
    ap.add_argument("--write-policy", default="",
                    help="comma-separated Larder disk_write_policy values to compare (hybrid tiers); "
                         "empty: Larder's default")
    ap.add_argument("--larder-args", default="", help="more `larder serve` flags, e.g. \"--disk-admission second-hit\"")
    ap.add_argument("--skip-direct", action="store_true", help="do not replay against S3 directly")
    ap.add_argument("--skip-nginx", action="store_true", help="do not replay through nginx")
    ap.add_argument("--nginx-settle", type=float, default=65.0,
                    help="seconds to wait after starting nginx, until its cache loader has run and "
                         "max_size is enforced")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    replay = Replay(args)
    results = {"machine": machine(), "runs": []}
    try:
        replay.start()
        for name in args.workload.split(","):
            for tiers in args.tiers.split(","):
                for share in (float(c) for c in args.capacity.split(",")):
                    results["runs"].append(replay.run_one(name, share, tiers))
    finally:
        replay.stop()
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    (args.out / "results.md").write_text(markdown(results))
    plot(results, args.out)
    print(f"results in {args.out}")


if __name__ == "__main__":
    main()
