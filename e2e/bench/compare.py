"""Larder vs direct S3 vs nginx proxy_cache + slice, side by side, in one run on one machine.

Usage (e2e/bench/run.sh installs the tools and builds the binaries first, then calls this):

    python3 e2e/bench/compare.py --mode quick|full --out DIR

It starts MinIO (the real S3 server), the latency proxy in front of it (every request held
20-50 ms, 1 % of them 200 ms more, counted where it lands), Larder and nginx, both reading
through that proxy, and drives all three targets with the same workloads:

- memory hits of 4 KiB / 1 / 8 / 64 MiB objects and disk hits of 1 / 8 / 64 MiB objects at 1-64
  connections (wrk), with each server's CPU time per request;
- memory hits across protocol and signing (`matrix`): HTTP/1.1 (wrk) and HTTP/2 (h2load), Larder
  verifying SigV4 and Larder with `auth = none`, at 1-256 connections, against nginx; and what
  verifying costs a 1 MiB hit, profiled with perf in the verifying Larder;
- the same over HTTPS (`tls`: HTTP/1.1, wrk), every server with one self-signed certificate;
- cold whole objects from an upstream that speaks HTTPS, as S3 does (`cold_tls`), beside direct
  reads over TLS;
- cold misses: time to first byte, one request at a time, over direct;
- a thundering herd of 64 clients on the same cold objects: upstream GETs and bytes;
- Zipf reads over a working set 10x Larder's memory and 2x its disk, nginx given the same
  total capacity: hit ratio, upstream requests avoided, dollars per million requests;
- Parquet-like ranged reads: the last 64 KiB, then a few column chunks.

Clients sign for Larder (presigned SigV4 URLs, verified on every request, as a real client's
would be); nginx and direct reads are anonymous GETs of a public-read bucket, since neither can
verify a signature. Results go to DIR as results.json, results.md and PNG plots.
"""

import argparse
import bisect
import datetime
import http.client
import json
import os
import platform
import random
import re
import shutil
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from conftest import (CLIENT_KEY, CLIENT_SECRET, ROOT, Larder, LatencyProxy, Listener, Minio, binary,  # noqa: E402
                      free_port, s3_client, wait_http)
from threads import run_all  # noqa: E402

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
BLOCK = 8 * MiB  # Larder's default block size, used throughout
BUCKET = "bench"
GET_PRICE = 0.0004 / 1000  # S3 Standard GET-class request, us-east-1 (HEAD is GET-class)
PUT_PRICE = 0.005 / 1000  # PUT-class (the events heartbeat's writes)
EVENTS_TOKEN = "bench-events-token-0123456789abcdef"
HERE = Path(__file__).resolve().parent

MODES = {
    "quick": dict(seconds=2, clients=[1, 16], ttfb={1 * MiB: 20, 64 * MiB: 4}, herd_objects=2, herd_size=16 * MiB,
                  disk_sets={64 * KiB: 512, 1 * MiB: 48, 8 * MiB: 12, 64 * MiB: 3}, zipf_objects=320, zipf_requests=6000,
                  zipf_region="16MiB", parquet_files=4, parquet_size=64 * MiB, capped={8 * MiB: 3, 64 * MiB: 3},
                  ranges={64 * KiB: 3, 1 * MiB: 3, 4 * MiB: 3, 16 * MiB: 3},
                  matrix=dict(sizes=[4 * KiB, 1 * MiB], clients=[16], seconds=2),
                  tls=dict(sizes=[4 * KiB, 1 * MiB], clients=[16], seconds=2), cold_tls={1 * MiB: 10, 64 * MiB: 4}),
    "full": dict(seconds=10, clients=[1, 4, 16, 64], ttfb={1 * MiB: 100, 8 * MiB: 16, 64 * MiB: 16, 256 * MiB: 3},
                 herd_objects=4, herd_size=16 * MiB, disk_sets={64 * KiB: 1024, 1 * MiB: 128, 8 * MiB: 32, 64 * MiB: 6},
                 zipf_objects=2048, zipf_requests=40000, zipf_region="16MiB", parquet_files=16, parquet_size=64 * MiB,
                 capped={8 * MiB: 8, 64 * MiB: 8, 256 * MiB: 3, 1 * GiB: 2},
                 ranges={64 * KiB: 10, 256 * KiB: 10, 1 * MiB: 10, 4 * MiB: 10, 16 * MiB: 6},
                 matrix=dict(sizes=[4 * KiB, 64 * KiB, 1 * MiB, 8 * MiB, 64 * MiB], clients=[1, 16, 64, 256],
                             seconds=5, rounds=3),
                 # Disk-hit cells near 1.0x nginx's flip between runs of one 10 s cell: three of 5 s.
                 disk=dict(seconds=5, rounds=3),
                 tls=dict(sizes=[4 * KiB, 64 * KiB, 1 * MiB, 8 * MiB], clients=[1, 16, 64], seconds=4, rounds=3),
                 cold_tls={1 * MiB: 40, 64 * MiB: 12, 256 * MiB: 3}),
}
# What one S3 connection delivers, roughly (docs/benchmarks.md): the cap the latency proxy puts on
# each connection for the capped cold reads.
S3_CONNECTION_MBPS = 90
# Memory hits from 4 KiB, where the request path, not moving bytes, is what a hit costs.
MEMORY_SIZES = [4 * KiB, 1 * MiB, 8 * MiB, 64 * MiB]


STARTED = time.monotonic()


def section(title: str):
    """A workload's heading, with how far into the run it starts (where CI's minutes go)."""
    print(f"== [{time.monotonic() - STARTED:.0f}s] {title}", flush=True)


def children_cpu_seconds() -> float:
    """User + system CPU time of this process's finished children (the load generators)."""
    t = os.times()
    return t.children_user + t.children_system


def self_signed(work: Path, name: str = "tls") -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key (ECDSA P-256, as most servers now get), made with
    the `openssl` tool under `work`: for benchmarks over TLS. The load generators do not check
    it; a Larder reading an upstream over TLS trusts it (`upstream_ca_file`), which rustls
    allows for a certificate that is not a CA's itself (CA:FALSE)."""
    cert, key = work / f"{name}-cert.pem", work / f"{name}-key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                    "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-addext", "basicConstraints=critical,CA:FALSE", "-addext", "extendedKeyUsage=serverAuth",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


def size_name(n: int) -> str:
    if n >= GiB and n % GiB == 0:
        return f"{n // GiB} GiB"
    return f"{n // MiB} MiB" if n >= MiB else f"{n // KiB} KiB"


# ---------------------------------------------------------------------------------------------
# Object contents: every object is a window into one random buffer, starting at an offset of its
# own, so objects differ and every body is checked byte for byte without keeping them all.
# The buffer starts at 256 MiB and grows (appended to, so every object keeps its bytes) only for
# a run that asks for larger objects.
MAX_OBJECT = 1 * GiB
_BASE = os.urandom(256 * MiB + 4 * KiB)
_VIEW = memoryview(_BASE)
_GROW = threading.Lock()


def content(key: str, size: int) -> memoryview:
    """The bytes of object `key` (a view: comparing and slicing it copies nothing)."""
    global _BASE, _VIEW
    if size > MAX_OBJECT:
        raise ValueError(f"objects are at most {size_name(MAX_OBJECT)}")
    start = hash_key(key) % (4 * KiB)
    with _GROW:
        if start + size > len(_BASE):
            _BASE += os.urandom(size + 4 * KiB - len(_BASE))
            _VIEW = memoryview(_BASE)
        return _VIEW[start:start + size]


def hash_key(key: str) -> int:
    h = 1469598103934665603
    for b in key.encode():
        h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


NGINX_CONF = """
# nginx as the S3 caching guides set it up: nginx-s3-gateway's default.conf.template (a cache for
# whole-object GETs keyed by method, host and URI; lock, revalidate, background update, stale on
# errors; 1h for 200s) and its sliced location for Range requests (slice module, 1m slices, the
# gateway's PROXY_CACHE_SLICE_SIZE default), as in "Smart and Efficient Byte-Range Caching with
# NGINX". The gateway signs with njs; here the bucket is public-read, so no signing is needed.
worker_processes auto;
daemon off;
pid {work}/nginx.pid;
error_log {work}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    sendfile {sendfile};
    tcp_nodelay on;
    keepalive_timeout 65;
    keepalive_requests 1000000;
    client_body_temp_path {work}/client-temp;
    proxy_temp_path {work}/proxy-temp;
    fastcgi_temp_path {work}/fastcgi-temp;
    uwsgi_temp_path {work}/uwsgi-temp;
    scgi_temp_path {work}/scgi-temp;
    proxy_cache_path {work}/cache levels=1:2 keys_zone=s3_cache:10m max_size={max_size} inactive=60m use_temp_path=off;
    proxy_cache_path {work}/cache-slices levels=1:2 keys_zone=s3_cache_slices:10m max_size={max_size} inactive=60m use_temp_path=off;
    upstream s3 {{
        server 127.0.0.1:{upstream};
        keepalive 64;
    }}
    server {{
        listen 127.0.0.1:{port};{listen}
        add_header X-Cache-Status $upstream_cache_status;
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        proxy_cache_valid 200 302 1h;
        proxy_cache_valid 404 1m;
        proxy_cache_valid 403 30s;
        proxy_cache_methods GET HEAD;
        proxy_cache_convert_head off;
        proxy_cache_revalidate on;
        proxy_cache_background_update on;
        proxy_cache_lock on;
        proxy_cache_use_stale error timeout http_500 http_502 http_503 http_504;

        location / {{
            # The gateway sends Range requests to its sliced location (in njs); same here.
            if ($http_range) {{
                rewrite ^ /__sliced$uri last;
            }}
            proxy_cache s3_cache;
            proxy_cache_key "$request_method$host$uri";
            proxy_pass http://s3;
        }}
        location /__sliced/ {{
            internal;
            rewrite ^/__sliced(/.*)$ $1 break;
            slice 1m;
            proxy_cache s3_cache_slices;
            proxy_cache_key "$request_method$host$uri$slice_range";
            proxy_set_header Range $slice_range;
            proxy_cache_valid 200 206 1h;
            proxy_pass http://s3;
        }}
    }}
}}
"""


class Nginx:
    def __init__(self, workdir: Path, upstream_port: int, max_size: int, name: str = "nginx", http2: bool = False,
                 tls: tuple[Path, Path] | None = None):
        self.work = workdir / name
        self.work.mkdir()
        self.port = free_port()
        conf = self.work / "nginx.conf"
        # `http2`: HTTP/2 without TLS (prior knowledge, as h2load sends it) on a port of its own
        # (`h2_endpoint`): nginx 1.22 serves only HTTP/2 on a cleartext `http2` port. And without
        # sendfile, with which nginx 1.22's HTTP/2 responses each waited 40 ms (a delayed ACK):
        # 368 req/s against 5,333 for 16 connections reading a 4 KiB file.
        self.h2_port = free_port() if http2 else None
        listen = f"\n        listen 127.0.0.1:{self.h2_port} http2;" if http2 else ""
        # `tls` (certificate, key): HTTPS on a port of its own too (`tls_endpoint`): HTTP/1.1, and
        # with `http2` HTTP/2 as well, chosen by ALPN.
        self.tls_port = free_port() if tls else None
        if tls:
            listen += (f"\n        listen 127.0.0.1:{self.tls_port} ssl{' http2' if http2 else ''};"
                       f"\n        ssl_certificate {tls[0]};\n        ssl_certificate_key {tls[1]};")
        conf.write_text(NGINX_CONF.format(work=self.work, upstream=upstream_port, port=self.port,
                                          max_size=f"{max_size // MiB}m", listen=listen,
                                          sendfile="off" if http2 else "on"))
        self.log = open(self.work / "stdout.log", "wb")
        self.proc = subprocess.Popen(["nginx", "-p", str(self.work), "-c", str(conf)],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.h2_endpoint = f"http://127.0.0.1:{self.h2_port}" if http2 else None
        self.tls_endpoint = f"https://127.0.0.1:{self.tls_port}" if tls else None
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"{self.endpoint}/{BUCKET}/__ready__", timeout=2):
                    break
            except urllib.error.HTTPError:
                break  # any HTTP answer means it is up
            except Exception:  # noqa: BLE001
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"nginx did not start: {(self.work / 'nginx-error.log').read_text()}")
                time.sleep(0.2)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=20)
        self.log.close()


class Target:
    """One thing to read from: the URL (path and query) of an object, and how hits show."""

    def __init__(self, name: str, endpoint: str, presigner=None, pid: int | None = None):
        self.name = name
        self.endpoint = endpoint
        u = urllib.parse.urlsplit(endpoint)
        self.host, self.port = u.hostname, u.port
        self.tls = u.scheme == "https"
        self.presigner = presigner
        # The server's process (with its children: nginx's workers), whose CPU time is counted.
        self.pid = pid

    def cpu_seconds(self) -> float | None:
        """User + system CPU seconds used so far by the server's processes, or None if unknown."""
        if self.pid is None:
            return None
        tick, total, todo = os.sysconf("SC_CLK_TCK"), 0, [self.pid]
        while todo:
            pid = todo.pop()
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
                fields = stat.rsplit(")", 1)[1].split()
                total += int(fields[11]) + int(fields[12])  # utime, stime
                for task in Path(f"/proc/{pid}/task").iterdir():
                    todo += [int(c) for c in (task / "children").read_text().split()]
            except (FileNotFoundError, ProcessLookupError):
                continue
        return total / tick

    def path(self, key: str) -> str:
        if self.presigner is None:
            return f"/{BUCKET}/{key}"
        url = self.presigner.generate_presigned_url("get_object", Params={"Bucket": BUCKET, "Key": key},
                                                    ExpiresIn=6 * 3600)
        u = urllib.parse.urlsplit(url)
        return f"{u.path}?{u.query}"


def cache_header(resp) -> str:
    return resp.getheader("x-cache") or resp.getheader("x-cache-status") or "-"


class Reader:
    """One keep-alive HTTP/1.1 connection: timed GETs, every body checked."""

    def __init__(self, target: Target):
        self.target = target
        if target.tls:
            # The benchmarks' own self-signed certificate (`self_signed`): not checked.
            self.conn = http.client.HTTPSConnection(target.host, target.port, timeout=120,
                                                    context=ssl._create_unverified_context())
        else:
            self.conn = http.client.HTTPConnection(target.host, target.port, timeout=120)

    def get(self, key: str, expected: bytes, range_: str | None = None, path: str | None = None):
        path = path or self.target.path(key)
        t0 = time.perf_counter()
        # The same request wrk sends (no Accept-Encoding): MinIO answers `Vary: Accept-Encoding`,
        # so nginx would keep a separate copy for clients that send one.
        self.conn.putrequest("GET", path, skip_accept_encoding=True)
        if range_:
            self.conn.putheader("Range", range_)
        self.conn.endheaders()
        resp = self.conn.getresponse()
        first = resp.read(1)
        t_first = time.perf_counter() - t0
        rest = resp.read()
        t_all = time.perf_counter() - t0
        # Checked after the clock stops, and without joining the two: a join copies the body,
        # which for a 1 GiB object takes a measurable part of the read.
        if resp.status not in (200, 206) or first != expected[:1] or rest != expected[1:]:
            raise RuntimeError(f"{self.target.name} {key} {range_}: status {resp.status}, "
                               f"{len(first) + len(rest)} bytes, expected {len(expected)}: {(first + rest[:200])!r}")
        return t_first, t_all, cache_header(resp)

    def close(self):
        self.conn.close()


def run_threads(n: int, body, what: str, timeout: float = 3600) -> float:
    """Runs `body` on `n` threads at once; the seconds it took. The first error of any thread is
    raised, naming `what`, and so is a thread still running after `timeout` seconds."""
    t0 = time.perf_counter()
    run_all(lambda _: body(), list(range(n)), timeout=timeout, what=what)
    return time.perf_counter() - t0


def lru_hits(sequence: list[str], capacity: int) -> int:
    """Hits of a least-recently-used cache of `capacity` objects over `sequence`: what nginx
    keeps of a `max_size` of that many objects when its cache manager has run (it removes the
    least recently used files). The manager wakes at most every 10 s, so nginx holds more than
    `max_size` in between (`Bench.zipf`); this is its policy at the capacity it was given."""
    held: OrderedDict = OrderedDict()
    hits = 0
    for key in sequence:
        if key in held:
            held.move_to_end(key)
            hits += 1
        else:
            held[key] = None
            if len(held) > capacity:
                held.popitem(last=False)
    return hits


def percentile(values, q):
    if not values:
        return float("nan")
    v = sorted(values)
    return v[min(len(v) - 1, int(round(q / 100 * (len(v) - 1))))]


def metric_sum(text: str, name: str, by: str) -> dict:
    """Series of `name` in Prometheus text, summed by the label `by`."""
    out: dict = {}
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        m = re.search(by + r'="([^"]*)"', line)
        out[m.group(1) if m else ""] = out.get(m.group(1) if m else "", 0) + float(line.rsplit(" ", 1)[1])
    return out


def readahead(larder) -> tuple[float, float]:
    """Blocks `larder` has fetched behind its readers so far, and bytes of such blocks read."""
    m = larder.metrics()
    issued = metric_sum(m, "larder_prefetch_blocks_total", "outcome").get("issued", 0)
    return issued, metric_sum(m, "larder_prefetch_bytes_total", "outcome").get("used", 0)


def delta(after: dict, before: dict) -> dict:
    return {k: int(v - before.get(k, 0)) for k, v in after.items() if v - before.get(k, 0)}


def public_read(s3):
    """Let anonymous GETs read BUCKET: nginx and direct reads are unsigned."""
    s3.put_bucket_policy(Bucket=BUCKET, Policy=json.dumps({
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Principal": {"AWS": ["*"]}, "Action": ["s3:GetObject"],
                       "Resource": [f"arn:aws:s3:::{BUCKET}/*"]}],
    }))


def stop_all(stoppers: list, work: Path):
    """Stop everything started, last first, then remove `work` (unless LARDER_BENCH_KEEP is set)."""
    for stop in reversed(stoppers):
        try:
            stop()
        except Exception as e:  # noqa: BLE001 - keep stopping the rest
            print(f"stop: {e}", file=sys.stderr)
    if not os.environ.get("LARDER_BENCH_KEEP"):
        shutil.rmtree(work, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
class Bench:
    def __init__(self, mode: str, out: Path, larder_args: tuple[str, ...] = ()):
        self.mode = mode
        self.larder_args = larder_args
        self.cfg = MODES[mode]
        self.out = out
        self.work = Path(tempfile.mkdtemp(prefix="larder-compare-", dir="/var/tmp"))
        self.work.chmod(0o755)  # nginx's workers run as an unprivileged user when started as root
        self.results: dict = {"mode": mode, "machine": machine(), "workloads": {}}
        self.stoppers = []
        # (certificate, key), set before `start`: the upstream (the latency proxy) speaks HTTPS,
        # as S3 does, and the Larders and the direct reads go to it over TLS.
        self.upstream_tls: tuple[Path, Path] | None = None

    def start(self):
        # MinIO notifies every write of the bucket to a relay, which passes them on to whichever
        # Larder takes events at the time (the Zipf run's "Larder+events"), as its own webhook would.
        self.events_to: str | None = None
        self.relay = Listener(on_post=self.relay_event)
        self.stoppers.append(self.relay.close)
        self.minio = Minio(self.work, env={
            "MINIO_NOTIFY_WEBHOOK_ENABLE_BENCH": "on",
            "MINIO_NOTIFY_WEBHOOK_ENDPOINT_BENCH": self.relay.url,
        })
        self.stoppers.append(self.minio.stop)
        self.s3 = s3_client(self.minio.endpoint)
        self.s3.create_bucket(Bucket=BUCKET)
        self.s3.put_bucket_notification_configuration(Bucket=BUCKET, NotificationConfiguration={
            "QueueConfigurations": [{"QueueArn": "arn:minio:sqs::BENCH:webhook",
                                     "Events": ["s3:ObjectCreated:*", "s3:ObjectRemoved:*"]}]})
        public_read(self.s3)
        self.proxy = LatencyProxy(self.work, self.minio.port, tls=self.upstream_tls)
        self.stoppers.append(self.proxy.stop)
        self.upstream_endpoint = self.proxy.tls_endpoint or self.proxy.endpoint
        self.proxy.latency()
        self.results["latency"] = self.proxy.latency()

    def stop(self):
        stop_all(self.stoppers, self.work)

    def relay_event(self, body: bytes):
        if self.events_to:
            req = urllib.request.Request(self.events_to, data=body, method="POST",
                                         headers={"Authorization": f"Bearer {EVENTS_TOKEN}"})
            urllib.request.urlopen(req, timeout=10).close()

    def upload(self, keys_sizes):
        def put(ks):
            key, size = ks
            s3 = s3_client(self.minio.endpoint)
            s3.put_object(Bucket=BUCKET, Key=key, Body=bytes(content(key, size)))
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(put, keys_sizes))

    def larder(self, name: str, *extra: str, tls: tuple[Path, Path] | None = None,
               upstream: str | None = None) -> tuple[Larder, Target]:
        """A Larder in front of the upstream (or `upstream`, whose trust the caller gives), and
        its target; with `tls` (certificate, key), its S3 port serves HTTPS."""
        if tls:
            extra += ("--tls-cert", str(tls[0]), "--tls-key", str(tls[1]))
        if self.upstream_tls and upstream is None:
            extra += ("--upstream-ca-file", str(self.upstream_tls[0]))
        l = Larder(self.work, upstream or self.upstream_endpoint, *extra, *self.larder_args, name=name)
        self.stoppers.append(l.stop)
        # SigV4 presigned URLs: boto3 presigns with SigV2 unless told otherwise, and what the hit
        # benchmarks must measure is the verification every current SDK's requests get.
        presigner = s3_client(l.endpoint, CLIENT_KEY, CLIENT_SECRET, signature_version="s3v4")
        endpoint = l.endpoint.replace("http://", "https://") if tls else l.endpoint
        return l, Target("Larder", endpoint, presigner, pid=l.proc.pid)

    def nginx(self, name: str, max_size: int, http2: bool = False,
              tls: tuple[Path, Path] | None = None) -> tuple[Nginx, Target]:
        n = Nginx(self.work, self.proxy.port, max_size, name, http2, tls)
        self.stoppers.append(n.stop)
        return n, Target("nginx", n.endpoint, pid=n.proc.pid)

    def direct(self) -> Target:
        return Target("direct", self.upstream_endpoint)

    def upstream(self) -> dict:
        s = self.proxy.control("stats")
        return {"gets": s["by_method"].get("GET", 0), "heads": s["by_method"].get("HEAD", 0),
                "puts": s["by_method"].get("PUT", 0), "bytes": s["response_bytes"],
                "connections": s.get("connections", 0)}

    def settle(self, quiet_s: float = 0.3, most_s: float = 15.0) -> dict:
        """[`upstream`] once its counters have not moved for `quiet_s` (at most `most_s`): what a
        target goes on fetching after its client was answered (nginx's slice, a block Larder
        completes behind a range) is counted in its own cell, not in the next target's."""
        deadline = time.monotonic() + most_s
        last, still = self.upstream(), time.monotonic()
        while time.monotonic() < deadline:
            time.sleep(0.1)
            now = self.upstream()
            if now != last:
                last, still = now, time.monotonic()
            elif time.monotonic() - still >= quiet_s:
                break
        return last

    def wrk(self, target: Target, keys: list[str], sizes: dict, clients: int, seconds: int) -> dict:
        paths = self.work / f"paths-{target.name}.txt"
        paths.write_text("".join(target.path(k) + "\n" for k in keys))
        cmd = ["wrk", "-t", str(min(2, clients)), "-c", str(clients), "-d", f"{seconds}s", "--timeout", "60s",
               "-s", str(HERE / "wrk.lua"), target.endpoint, "--", str(paths)]
        cpu, load = target.cpu_seconds(), children_cpu_seconds()
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        # The server's CPU time during the run (not the body check below), per 1,000 requests.
        cpu = None if cpu is None else target.cpu_seconds() - cpu
        # wrk's own: on loopback the client's copy out of the socket runs on the same cores.
        load = children_cpu_seconds() - load
        r = json.loads(out.split("WRK-JSON ", 1)[1].splitlines()[0])
        errors = sum(r[k] for k in ("connect_errors", "read_errors", "write_errors", "status_errors", "timeouts"))
        if errors:
            raise RuntimeError(f"wrk against {target.name}: {errors} errors: {r}")
        # wrk checks statuses and counts bytes but cannot compare bodies (a Lua response hook
        # would make wrk the bottleneck). So: the bytes wrk received must hold a whole body per
        # completed response (plus at most 4 KiB of headers each, and the responses still in
        # flight on each connection when the run ended), and right after the run each key is
        # read once more and its body compared.
        size = sizes[keys[0]]
        low, high = r["requests"] * size, (r["requests"] + clients) * (size + 4096)
        if not low <= r["bytes"] <= high:
            raise RuntimeError(f"wrk against {target.name}: {r['bytes']} bytes for {r['requests']} responses of "
                               f"{size}-byte objects (expected {low} to {high})")
        reader = Reader(target)
        try:
            for key in keys:
                reader.get(key, content(key, sizes[key]))
        finally:
            reader.close()
        secs = r["duration_us"] / 1e6
        return {"rps": r["requests"] / secs, "mib_s": r["bytes"] / secs / MiB, "requests": r["requests"],
                **({} if cpu is None else {"cpu_ms_per_1k": cpu * 1e6 / r["requests"]}),
                "client_cpu_ms_per_1k": load * 1e6 / r["requests"],
                **{k: r[k] / 1000 for k in ("p50_us", "p90_us", "p99_us", "p999_us", "max_us")}}

    def h2load(self, target: Target, keys: list[str], size: int, clients: int, seconds: int,
               check: Target | None = None) -> dict:
        """wrk's figures that h2load has (it reports no percentiles) for `clients` HTTP/2
        connections (cleartext, prior knowledge, one stream each) reading `keys` of `size` bytes;
        every response checked as `wrk` checks its own, the keys read again through `check` (an
        HTTP/1.1 port of the same server) or `target`."""
        return h2load(target, keys, clients, 1, seconds, (size, check or target))

    # --- workloads -------------------------------------------------------------------------
    def hits(self, tier: str, larder: Larder, targets: list[Target], keys_by_size: dict,
             seconds: int, rounds: int = 1):
        """wrk against each target for each size and client count: `rounds` times, the targets in
        turn within each round, each figure the median over the rounds (`medians`); Larder's
        answers by `X-Cache` summed over them."""
        rows = []
        for size, keys in sorted(keys_by_size.items()):
            for clients in self.cfg["clients"]:
                def one_run(t: Target) -> dict:
                    before = metric_sum(larder.metrics(), "larder_requests_total", "cache") if t.name == "Larder" else None
                    r = self.wrk(t, keys, {k: size for k in keys}, clients, seconds)
                    if before is not None:
                        r["cache"] = delta(metric_sum(larder.metrics(), "larder_requests_total", "cache"), before)
                    return r
                for t, got in zip(targets, in_rounds(targets, rounds, one_run)):
                    r = medians(got)
                    if "cache" in r:
                        r["cache"] = {k: sum(g["cache"].get(k, 0) for g in got)
                                      for k in sorted({k for g in got for k in g["cache"]})}
                    rows.append({"size": size, "clients": clients, "target": t.name, **r})
                    cpu_note = (f", CPU {r['cpu_ms_per_1k']:.0f} ms per 1k requests (wrk "
                                f"{r['client_cpu_ms_per_1k']:.0f})" if "cpu_ms_per_1k" in r else "")
                    print(f"  {tier} {size_name(size)} x{clients} {t.name}: {r['rps']:.0f} req/s, "
                          f"{r['mib_s']:.0f} MiB/s, p50 {r['p50_us']:.2f} p99 {r['p99_us']:.2f} ms{cpu_note} "
                          f"{r.get('cache', '')}{each_round(r)}", flush=True)
        return rows

    def warm_by_reading(self, target: Target, keys: list[str], sizes: dict, want: set, tries: int = 10):
        r = Reader(target)
        try:
            for key in keys:
                for _ in range(tries):
                    _, _, status = r.get(key, content(key, sizes[key]))
                    if status in want:
                        break
                    time.sleep(0.05)
                else:
                    raise RuntimeError(f"{target.name} {key} not a hit after {tries} reads ({status})")
        finally:
            r.close()

    def warm_prefix(self, larder: Larder, prefix: str) -> dict:
        """Warm `prefix` of the bench bucket through Larder's admin API; the finished job."""
        job = post_json(f"{larder.admin}/warm", {"bucket": BUCKET, "prefix": prefix})
        deadline = time.monotonic() + 600
        while True:
            with urllib.request.urlopen(f"{larder.admin}/warm/{job['id']}", timeout=10) as r:
                p = json.loads(r.read())
            if p["state"] != "running":
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"warm-up did not finish: {p}")
            time.sleep(0.5)
        if p["state"] != "done" or p["errors"]:
            raise RuntimeError(f"warm-up failed: {p}")
        return p

    def memory_hits(self, larder, lt, nt):
        section("memory hits")
        keys = {s: [f"hot/{s}"] for s in MEMORY_SIZES}
        sizes = {f"hot/{s}": s for s in MEMORY_SIZES}
        self.upload(sizes.items())
        self.warm_by_reading(lt, list(sizes), sizes, {"hit-memory"})
        self.warm_by_reading(nt, list(sizes), sizes, {"HIT"})
        self.results["workloads"]["memory_hits"] = self.hits("memory", larder, [self.direct(), nt, lt], keys,
                                                             self.cfg["seconds"])

    def hit_matrix(self, lt: Target, nt: Target):
        """Memory hits of each size at each connection count, over HTTP/1.1 (wrk) and HTTP/2
        (h2load, one stream per connection), through nginx, Larder verifying SigV4 (`lt`, clients
        presigning) and a second Larder with `auth = none` (anonymous URLs, as nginx gets): issue
        21's table of sizes × connections × protocol × signing, and what verifying costs a hit
        (the two Larders' CPU per request side by side)."""
        section("memory hits: protocol × signing")
        m = self.cfg["matrix"]
        keys = {s: f"hot/{s}" for s in m["sizes"]}
        sizes = {k: s for s, k in keys.items()}
        self.upload(sizes.items())
        _, ut = self.larder("larder-unsigned", "--auth", "none", "--memory-capacity", "2GiB", "--metadata-ttl", "1h")
        ut.presigner = None
        # nginx's HTTP/2 port is a server of its own: nginx 1.22 needs `sendfile off` there
        # (`Nginx`), which its HTTP/1.1 cells must not get.
        n2, n2t = self.nginx("nginx-h2", 8 * GiB, http2=True)
        h2_nginx = Target("nginx", n2.h2_endpoint, pid=n2t.pid)
        for t, want in ((lt, {"hit-memory"}), (ut, {"hit-memory"}), (nt, {"HIT"}), (n2t, {"HIT"})):
            self.warm_by_reading(t, list(sizes), sizes, want)
        targets = {"http/1.1": [("nginx", "none", nt), ("Larder", "sigv4", lt), ("Larder", "none", ut)],
                   "h2": [("nginx", "none", h2_nginx), ("Larder", "sigv4", lt), ("Larder", "none", ut)]}
        # The bodies behind h2load's counts are read again over HTTP/1.1: Larder's port speaks
        # both, nginx's HTTP/2 port only HTTP/2 (its server's other port reads the same cache).
        again = {id(h2_nginx): n2t}
        rows = []
        for size, key in sorted(keys.items()):
            for clients in m["clients"]:
                for protocol, ts in targets.items():
                    # Each cell `rounds` times, the three servers in turn within each round: a
                    # single few-second cell moves by a fifth between runs on this machine.
                    def one_run(target: tuple) -> dict:
                        t = target[2]
                        if protocol == "h2":
                            return self.h2load(t, [key], size, clients, m["seconds"], again.get(id(t)))
                        return self.wrk(t, [key], sizes, clients, m["seconds"])
                    for (name, signing, t), got in zip(ts, in_rounds(ts, m.get("rounds", 1), one_run)):
                        r = medians(got)
                        if signing == "sigv4" and size == MiB:
                            # Issue 21's bound on what verifying costs a 1 MiB hit, measured in
                            # the verifying Larder itself: one more run of the cell under perf.
                            shares = profiled(t.pid, self.work, lambda: one_run((name, signing, t)), SIGV4_SYMBOLS)
                            if shares is not None:
                                r["sigv4_share"] = sum(shares.values()) / 100
                        rows.append({"size": size, "clients": clients, "protocol": protocol, "target": name,
                                     "signing": signing, **r})
                        tail = f", p99 {r['p99_us']:.2f} ms" if "p99_us" in r else ""
                        verify = f", SigV4 {r['sigv4_share']:.1%} of its CPU" if "sigv4_share" in r else ""
                        print(f"  {size_name(size)} x{clients} {protocol} {name} ({signing}): {r['rps']:.0f} req/s, "
                              f"CPU {r.get('cpu_ms_per_1k', 0):.1f} ms per 1k{tail}{verify}{each_round(r)}", flush=True)
        self.results["workloads"]["hit_matrix"] = rows

    def tls_hits(self):
        """Memory hits over HTTPS (HTTP/1.1, wrk) of each size at each connection count, through
        nginx with `ssl`, a Larder verifying SigV4 and one with `auth = none`, all serving one
        self-signed certificate: what the matrix's cleartext cells leave out, for clients on other
        hosts or on an `https://` endpoint. nginx cannot `sendfile` under TLS, nor Larder lend
        its pages: both encrypt in user space."""
        section("memory hits over TLS")
        m = self.cfg["tls"]
        keys = {s: f"hot/{s}" for s in m["sizes"]}
        sizes = {k: s for s, k in keys.items()}
        self.upload(sizes.items())
        cert = self_signed(self.work)
        common = ("--memory-capacity", "2GiB", "--metadata-ttl", "1h")
        _, st = self.larder("larder-tls", *common, tls=cert)
        _, ut = self.larder("larder-tls-unsigned", "--auth", "none", *common, tls=cert)
        ut.presigner = None
        n, nt = self.nginx("nginx-tls", 8 * GiB, tls=cert)
        nt = Target("nginx", n.tls_endpoint, pid=nt.pid)
        for t, want in ((st, {"hit-memory"}), (ut, {"hit-memory"}), (nt, {"HIT"})):
            self.warm_by_reading(t, list(sizes), sizes, want)
        targets = [("nginx", "none", nt), ("Larder", "sigv4", st), ("Larder", "none", ut)]
        rows = []
        for size, key in sorted(keys.items()):
            for clients in m["clients"]:
                runs = in_rounds(targets, m.get("rounds", 1),
                                 lambda target: self.wrk(target[2], [key], sizes, clients, m["seconds"]))
                for (name, signing, _), got in zip(targets, runs):
                    r = medians(got)
                    rows.append({"size": size, "clients": clients, "protocol": "https", "target": name,
                                 "signing": signing, **r})
                    print(f"  {size_name(size)} x{clients} https {name} ({signing}): {r['rps']:.0f} req/s, "
                          f"CPU {r.get('cpu_ms_per_1k', 0):.1f} ms per 1k, p99 {r['p99_us']:.2f} ms{each_round(r)}",
                          flush=True)
        self.results["workloads"]["tls_hits"] = rows

    def disk_hits(self, nt):
        section("disk hits")
        sets = self.cfg["disk_sets"]
        keys = {s: [f"disk/{s}/{i}" for i in range(n)] for s, n in sets.items()}
        sizes = {k: s for s, ks in keys.items() for k in ks}
        self.upload(sizes.items())
        total = sum(sizes.values())
        larder, lt = self.larder("larder-disk", "--memory-capacity", "8MiB", "--disk-path",
                                 str(self.work / "larder-disk.cache"), "--disk-capacity", f"{2 * total // MiB}MiB",
                                 "--metadata-ttl", "1h")
        p = self.warm_prefix(larder, "disk/")
        self.warm_by_reading(nt, list(sizes), sizes, {"HIT"})
        d = self.cfg.get("disk", {})
        rows = self.hits("disk", larder, [self.direct(), nt, lt], keys, d.get("seconds", self.cfg["seconds"]),
                         d.get("rounds", 1))
        self.results["workloads"]["disk_hits"] = rows
        self.results["disk_hits_setup"] = {"larder_memory": 8 * MiB, "objects": {str(s): n for s, n in sets.items()},
                                           "warm_seconds": p["elapsed_seconds"]}

    def read_cold(self, t: Target, keys: list[str], size: int) -> tuple[list, list, dict]:
        """Each of `keys` (objects of `size` bytes) whole, once through `t` (`read_each`)."""
        return self.read_each(t, [(k, content(k, size), None) for k in keys])

    def read_each(self, t: Target, reads: list) -> tuple[list, list, dict]:
        """Each of `reads` (key, expected body, Range header or None) once through `t`, one at a
        time on a connection opened beforehand (a small GET), every body checked: seconds to the
        first byte, to the last, and how each was answered."""
        self.upload([("hello", KiB)])
        # Dirty pages the last target or upload left (nginx's cache files, MinIO's objects) are
        # written back before this target's turn, not on the cores it is measured on.
        os.sync()
        r = Reader(t)
        r.get("hello", content("hello", KiB))
        firsts, alls, statuses = [], [], {}
        for key, expected, range_ in reads:
            first, total, status = r.get(key, expected, range_)
            firsts.append(first)
            alls.append(total)
            statuses[status] = statuses.get(status, 0) + 1
        r.close()
        return firsts, alls, statuses

    def read_in_turns(self, targets: list[Target], keys: list[str], size: int) -> list[tuple[list, list, dict]]:
        """Each of `keys` (objects of `size` bytes) whole, once through each of `targets`, the
        targets taking turns read by read, the first of each turn moving on by one every read:
        as `read_each` gives each target, but a slow spell of this machine lands on every target
        alike. Read as blocks of one target after another, a cold 1 MiB read's first byte came
        out 1.6 to 1.9 ms behind direct's in some runs and 0.1 in others, of the same code."""
        self.upload([("hello", KiB)])
        readers = [Reader(t) for t in targets]
        for r in readers:
            r.get("hello", content("hello", KiB))
        got: list[tuple[list, list, dict]] = [([], [], {}) for _ in targets]
        for i, key in enumerate(keys):
            expected = content(key, size)
            # Dirty pages (nginx's cache files) are written back between turns, not during one.
            os.sync()
            for j in range(len(targets)):
                turn = (i + j) % len(targets)
                first, total, status = readers[turn].get(key, expected)
                firsts, alls, statuses = got[turn]
                firsts.append(first)
                alls.append(total)
                statuses[status] = statuses.get(status, 0) + 1
        for r in readers:
            r.close()
        return got

    def cold_ttfb(self, lt, nt):
        section("cold misses: time to first byte")
        # A fixed latency, so the difference between targets is the cache's own overhead.
        self.proxy.latency(delay_ms=30, jitter_ms=0, tail_fraction=0, tail_ms=0)
        rows = []
        try:
            for size, n in self.cfg["ttfb"].items():
                keys = [f"cold/{size}/{i}" for i in range(n)]
                self.upload([(k, size) for k in keys])
                targets = [self.direct(), nt, lt]
                for t, (firsts, alls, statuses) in zip(targets, self.read_in_turns(targets, keys, size)):
                    firsts, alls = [f * 1000 for f in firsts], [a * 1000 for a in alls]
                    row = {"size": size, "target": t.name, "requests": n, "cache": statuses,
                           "ttfb_p50": percentile(firsts, 50), "ttfb_p90": percentile(firsts, 90),
                           "ttfb_p99": percentile(firsts, 99), "total_p50": percentile(alls, 50)}
                    rows.append(row)
                    print(f"  {size_name(size)} {t.name}: TTFB p50 {row['ttfb_p50']:.2f} p90 {row['ttfb_p90']:.2f} ms, "
                          f"whole p50 {row['total_p50']:.2f} ms {statuses}", flush=True)
        finally:
            self.proxy.latency()
        self.results["workloads"]["cold_ttfb"] = rows

    def cold_capped(self, lt, nt):
        """Whole cold objects from an upstream that caps each connection's bandwidth as S3 does:
        a client's single GET gets that much; a cache fetching blocks in parallel can beat it."""
        section(f"cold whole objects, upstream capped at {S3_CONNECTION_MBPS} MB/s per connection")
        self.proxy.latency(delay_ms=30, jitter_ms=0, tail_fraction=0, tail_ms=0)
        self.proxy.control(f"limits?connection_mbps={S3_CONNECTION_MBPS}")
        rows = []
        try:
            for size, n in self.cfg["capped"].items():
                keys = [f"capped/{size}/{i}" for i in range(n)]
                self.upload([(k, size) for k in keys])
                for t in (self.direct(), nt, lt):
                    _, alls, statuses = self.read_cold(t, keys, size)
                    p50 = percentile(alls, 50)
                    row = {"size": size, "target": t.name, "requests": n, "cache": statuses,
                           "total_p50": p50 * 1000, "mb_per_s": size / p50 / 1e6}
                    rows.append(row)
                    print(f"  {size_name(size)} {t.name}: whole p50 {row['total_p50']:.0f} ms, "
                          f"{row['mb_per_s']:.0f} MB/s {statuses}", flush=True)
        finally:
            self.proxy.control("limits?connection_mbps=0")
            self.proxy.latency()
        self.results["workloads"]["cold_capped"] = rows

    def cold_tls(self):
        """Cold whole objects from an upstream that speaks HTTPS, as S3 does (a second latency
        proxy, with TLS, over the same MinIO; 30 ms before every answer): direct reads decrypt
        what they read, as an SDK does, and so does Larder, which serves its client in the
        clear. Beside issue 19's goals, whose upstreams speak plain HTTP, not one of them."""
        section("cold whole objects from an HTTPS upstream")
        cert = self_signed(self.work, "upstream-tls")
        proxy = LatencyProxy(self.work, self.minio.port, tls=cert, name="latency-proxy-tls")
        self.stoppers.append(proxy.stop)
        proxy.latency(delay_ms=30, jitter_ms=0, tail_fraction=0, tail_ms=0)
        _, lt = self.larder("larder-cold-tls", "--memory-capacity", "2GiB", "--upstream-ca-file", str(cert[0]),
                            upstream=proxy.tls_endpoint)
        rows = []
        for size, n in self.cfg["cold_tls"].items():
            keys = [f"cold-tls/{size}/{i}" for i in range(n)]
            self.upload([(k, size) for k in keys])
            targets = [Target("direct", proxy.tls_endpoint), lt]
            for t, (firsts, alls, statuses) in zip(targets, self.read_in_turns(targets, keys, size)):
                firsts, alls = [f * 1000 for f in firsts], [a * 1000 for a in alls]
                row = {"size": size, "target": t.name, "requests": n, "cache": statuses,
                       "ttfb_p50": percentile(firsts, 50), "total_p50": percentile(alls, 50),
                       "mb_per_s": size / percentile(alls, 50) / 1e3}
                rows.append(row)
                print(f"  {size_name(size)} {t.name}: TTFB p50 {row['ttfb_p50']:.2f} ms, whole p50 "
                      f"{row['total_p50']:.1f} ms ({row['mb_per_s']:.0f} MB/s) {statuses}", flush=True)
        self.results["workloads"]["cold_tls"] = rows

    def cold_ranges(self, lt, nt):
        """Ranges of several lengths at random offsets, each of an object that target has not read,
        one at a time: time to the first byte and to the last, and what the upstream sent for them,
        from an upstream adding 30 ms and from one also capping each connection as S3 does."""
        section("cold ranges")
        size, rng = 24 * MiB, random.Random(11)
        models = (("30 ms", 0), (f"30 ms, {S3_CONNECTION_MBPS} MB/s per connection", S3_CONNECTION_MBPS))
        plan = {(model, length): [(f"ranges/{mbps}/{length}/{i}", rng.randrange(0, size - length + 1))
                                  for i in range(n)]
                for model, mbps in models for length, n in self.cfg["ranges"].items()}
        self.upload([(k, size) for reads in plan.values() for k, _ in reads])
        self.proxy.latency(delay_ms=30, jitter_ms=0, tail_fraction=0, tail_ms=0)
        rows = []
        try:
            for model, mbps in models:
                self.proxy.control(f"limits?connection_mbps={mbps}")
                for length in self.cfg["ranges"]:
                    reads = [(k, content(k, size)[a:a + length], f"bytes={a}-{a + length - 1}")
                             for k, a in plan[(model, length)]]
                    for t in (self.direct(), nt, lt):
                        self.proxy.control("reset")
                        firsts, alls, statuses = self.read_each(t, reads)
                        up = self.settle()
                        # The connection's opening GET of a 1 KiB object is counted upstream once.
                        row = {"model": model, "length": length, "target": t.name, "requests": len(reads),
                               "cache": statuses, "ttfb_p50": percentile(firsts, 50) * 1000,
                               "total_p50": percentile(alls, 50) * 1000, "upstream_gets": up["gets"],
                               "upstream_bytes": up["bytes"], "asked_bytes": length * len(reads)}
                        rows.append(row)
                        print(f"  {model} {size_name(length)} {t.name}: TTFB p50 {row['ttfb_p50']:.2f} ms, last byte "
                              f"p50 {row['total_p50']:.2f} ms, upstream {up['bytes'] / row['asked_bytes']:.2f}x the "
                              f"bytes asked in {up['gets']} GETs {statuses}", flush=True)
        finally:
            self.proxy.control("limits?connection_mbps=0")
            self.proxy.latency()
        self.results["workloads"]["cold_ranges"] = rows

    def herd(self, lt, nt, clients: int = 64):
        section("thundering herd")
        n, size = self.cfg["herd_objects"], self.cfg["herd_size"]
        keys = [f"herd/{i}" for i in range(n)]
        self.upload([(k, size) for k in keys])
        rows = []
        for t in (self.direct(), nt, lt):
            paths = {k: t.path(k) for k in keys}
            barrier = threading.Barrier(clients)
            latencies = []

            def client():
                r = Reader(t)
                try:
                    barrier.wait()
                    for k in keys:
                        _, total, _ = r.get(k, content(k, size), path=paths[k])
                        latencies.append(total * 1000)
                finally:
                    r.close()
            self.proxy.control("reset")
            elapsed = run_threads(clients, client, f"herd on {t.name}")
            up = self.settle()
            row = {"target": t.name, "clients": clients, "objects": n, "size": size,
                   "blocks": n * -(-size // BLOCK), "upstream_gets": up["gets"], "upstream_heads": up["heads"],
                   "upstream_mib": up["bytes"] / MiB, "served_mib": clients * n * size / MiB,
                   "p50": percentile(latencies, 50), "p99": percentile(latencies, 99), "seconds": elapsed}
            rows.append(row)
            print(f"  {t.name}: {up['gets']} GETs + {up['heads']} HEADs upstream, {row['upstream_mib']:.1f} MiB; "
                  f"p50 {row['p50']:.0f} p99 {row['p99']:.0f} ms", flush=True)
        self.results["workloads"]["herd"] = rows

    def zipf(self, threads: int = 16, s: float = 1.0):
        section("Zipf")
        n, size, requests = self.cfg["zipf_objects"], 1 * MiB, self.cfg["zipf_requests"]
        working_set = n * size
        memory, disk = working_set // 10, working_set // 2
        keys = [f"zipf/{i}" for i in range(n)]
        self.upload([(k, size) for k in keys])
        rng = random.Random(20261123)
        order = keys[:]
        rng.shuffle(order)  # popularity is not key order
        weights = [1 / (rank + 1) ** s for rank in range(n)]
        cdf, acc = [], 0.0
        for w in weights:
            acc += w
            cdf.append(acc)
        sequence = [order[bisect.bisect_left(cdf, rng.random() * acc)] for _ in range(requests)]
        def capacity(name):
            return ("--memory-capacity", f"{memory // MiB}MiB", "--disk-path", str(self.work / f"{name}.cache"),
                    "--disk-capacity", f"{disk // MiB}MiB", "--disk-region-size", self.cfg["zipf_region"])
        larder, lt = self.larder("larder-zipf", *capacity("larder-zipf"))
        nx, nt = self.nginx("nginx-zipf", memory + disk)

        def evented():
            """The same Larder with S3 events flowing (MinIO's own notifications, a heartbeat
            object written every 20 s so a read-only run still shows the stream alive): metadata
            is trusted for an hour instead of being revalidated every minute. Started only for
            its own run, so that its heartbeats are counted against it alone."""
            token = self.work / "events-token"
            token.write_text(EVENTS_TOKEN + "\n")
            larder, target = self.larder("larder-zipf-events", *capacity("larder-zipf-events"),
                                         "--metadata-ttl", "1h", "--events-token-file", str(token),
                                         "--events-heartbeat", f"{BUCKET}/.larder/heartbeat")
            target.name = "Larder+events"
            self.events_to = f"{larder.admin}/v1/events"
            deadline = time.monotonic() + 30
            while "larder_events_stream_healthy 1" not in larder.metrics():
                assert time.monotonic() < deadline, "the events Larder never heard its heartbeat"
                time.sleep(0.2)
            return target
        rows = []
        for t in (nt, lt, evented):
            if callable(t):
                t = t()
            self.proxy.control("reset")
            statuses: dict = {}
            lock = threading.Lock()
            latencies = []
            nxt = iter(range(requests))

            def worker():
                r = Reader(t)
                try:
                    while True:
                        with lock:
                            i = next(nxt, None)
                        if i is None:
                            return
                        k = sequence[i]
                        _, total, status = r.get(k, content(k, size))
                        with lock:
                            statuses[status] = statuses.get(status, 0) + 1
                            latencies.append(total * 1000)
                finally:
                    r.close()
            elapsed = run_threads(threads, worker, f"Zipf on {t.name}")
            up = self.settle()
            # The hit ratio is measured where requests land: every object is smaller than one
            # block (Larder) and one slice (nginx), so each upstream GET is exactly one request
            # the cache did not answer (requests joining a fetch in flight count as answered).
            # What each proxy says of itself (X-Cache) is kept beside it, not used.
            hits = sum(v for k, v in statuses.items() if k.startswith("hit") or k == "HIT")
            upstream_requests = up["gets"] + up["heads"] + up["puts"]
            dollars = GET_PRICE * (up["gets"] + up["heads"]) + PUT_PRICE * up["puts"]
            row = {"target": t.name, "requests": requests, "cache": statuses,
                   "hit_ratio": 1 - up["gets"] / requests, "self_reported_hit_ratio": hits / requests,
                   "upstream_gets": up["gets"], "upstream_heads": up["heads"], "upstream_puts": up["puts"],
                   "avoided": 1 - upstream_requests / requests,
                   "byte_hit_ratio": 1 - up["bytes"] / (requests * size),
                   "dollars_per_million_direct": 1e6 * GET_PRICE,
                   "dollars_per_million": 1e6 * dollars / requests,
                   "p50": percentile(latencies, 50), "p99": percentile(latencies, 99), "seconds": elapsed}
            row["saved_per_million"] = row["dollars_per_million_direct"] - row["dollars_per_million"]
            if t is nt:
                # What nginx held, not what it was told to: its cache manager enforces `max_size`
                # only when it wakes, at most every 10 s (`ngx_http_file_cache_expire` caps its
                # sleep there), and a cache filling faster than that grows past it in between.
                row["held_bytes"] = sum(f.stat().st_size for f in (nx.work / "cache").rglob("*") if f.is_file())
            if t is lt:
                m = larder.metrics()
                row["larder_disk"] = {k: v for k, v in ((l.split(" ")[0], float(l.split(" ")[1]))
                                                        for l in m.splitlines()
                                                        if l.startswith(("larder_disk_", "larder_cache_write_dropped",
                                                                         "larder_memory_")))}
                row["held_bytes"] = (row["larder_disk"].get("larder_disk_live_bytes", 0)
                                     + row["larder_disk"].get("larder_memory_used_bytes", 0))
            rows.append(row)
            print(f"  {t.name}: hit ratio {row['hit_ratio']:.3f} at the upstream ({row['self_reported_hit_ratio']:.3f} "
                  f"by its own labels), {up['gets']} GETs + {up['heads']} HEADs + {up['puts']} PUTs upstream "
                  f"for {requests} requests, saved ${row['saved_per_million']:.3f}/M {statuses}", flush=True)
        self.results["workloads"]["zipf"] = rows
        self.results["zipf_setup"] = {"objects": n, "object_size": size, "exponent": s, "requests": requests,
                                      "threads": threads, "larder_memory": memory, "larder_disk": disk,
                                      "nginx_max_size": memory + disk,
                                      "lru_hit_ratio": lru_hits(sequence, (memory + disk) // size) / requests}

    def parquet(self, larder, lt, nt, threads: int = 8):
        section("Parquet-like ranged reads")
        n, size = self.cfg["parquet_files"], self.cfg["parquet_size"]
        keys = [f"parquet/{i}.parquet" for i in range(n)]
        self.upload([(k, size) for k in keys])
        rng = random.Random(7)

        def query():
            reads = [("footer", f"bytes=-{64 * KiB}", size - 64 * KiB, size)]
            for _ in range(3):
                length = rng.choice([256 * KiB, 512 * KiB, 1 * MiB, 2 * MiB, 4 * MiB])
                start = rng.randrange(0, size - 64 * KiB - length)
                reads.append(("column", f"bytes={start}-{start + length - 1}", start, start + length))
            return reads
        first = {k: query() for k in keys}
        second = {k: query() for k in keys}
        passes = [("cold: footer + 3 column chunks", first), ("same query again", first),
                  ("other columns, same files", second)]
        rows = []
        for t in (self.direct(), nt, lt):
            for label, plan in passes:
                self.proxy.control("reset")
                ahead = readahead(larder) if t is lt else None
                latencies = {"footer": [], "column": []}
                todo = iter(keys)
                lock = threading.Lock()

                def worker():
                    r = Reader(t)
                    try:
                        while True:
                            with lock:
                                k = next(todo, None)
                            if k is None:
                                return
                            path = t.path(k)
                            whole = content(k, size)
                            for kind, rng_header, a, b in plan[k]:
                                _, total, _ = r.get(k, whole[a:b], rng_header, path=path)
                                with lock:
                                    latencies[kind].append(total * 1000)
                    finally:
                        r.close()
                run_threads(threads, worker, f"Parquet reads on {t.name}")
                up = self.settle()
                served = sum(b - a for k in keys for _, _, a, b in plan[k])
                row = {"target": t.name, "pass": label, "reads": 4 * n, "served_mib": served / MiB,
                       "upstream_gets": up["gets"], "upstream_heads": up["heads"], "upstream_mib": up["bytes"] / MiB,
                       "footer_p50": percentile(latencies["footer"], 50), "column_p50": percentile(latencies["column"], 50),
                       "p99": percentile(latencies["footer"] + latencies["column"], 99)}
                if ahead is not None:
                    # What of the upstream bytes Larder fetched behind its readers (read-ahead,
                    # blocks completed from their parts), and how much of such blocks, fetched in
                    # this pass or an earlier one, its readers read in this pass: issue 19 allows
                    # more than 1.5x the bytes asked only for predictions that were used.
                    now = readahead(larder)
                    row["readahead_blocks"] = int(now[0] - ahead[0])
                    row["readahead_used_mib"] = (now[1] - ahead[1]) / MiB
                rows.append(row)
                print(f"  {t.name} / {label}: {up['gets']} GETs + {up['heads']} HEADs, {row['upstream_mib']:.1f} MiB "
                      f"upstream for {row['served_mib']:.1f} MiB; footer p50 {row['footer_p50']:.1f} "
                      f"column p50 {row['column_p50']:.1f} ms", flush=True)
        self.results["workloads"]["parquet"] = rows

    def run(self, only: set):
        self.start()
        started = time.monotonic()
        # Trusted as long as nginx's `proxy_cache_valid` (1 h), as the disk hits' Larder below: the
        # hit cells measure hits. With the default 60 s, Larder idles while direct and nginx take
        # their turns, and a cell of keys last read more than a minute earlier began with every
        # key revalidated (a HEAD through the latency proxy), which wrk's corrected percentiles
        # showed as p99.9 of 21-24 ms against nginx's 3-10 (docs/benchmarks.md). Revalidation's
        # own cost is measured where it belongs: the Zipf step keeps the default TTL.
        larder, lt = self.larder("larder", "--memory-capacity", "2GiB", "--metadata-ttl", "1h")
        _, nt = self.nginx("nginx", 8 * GiB)
        steps = [("memory", lambda: self.memory_hits(larder, lt, nt)), ("ttfb", lambda: self.cold_ttfb(lt, nt)),
                 ("capped", lambda: self.cold_capped(lt, nt)), ("ranges", lambda: self.cold_ranges(lt, nt)),
                 ("herd", lambda: self.herd(lt, nt)), ("parquet", lambda: self.parquet(larder, lt, nt)),
                 ("disk", lambda: self.disk_hits(nt)), ("zipf", self.zipf),
                 ("matrix", lambda: self.hit_matrix(lt, nt)), ("tls", self.tls_hits), ("cold_tls", self.cold_tls)]
        for name, step in steps:
            if not only or name in only:
                step()
        self.results["seconds"] = time.monotonic() - started


def h2load(t: Target, keys: list[str], clients: int, streams: int, seconds: int,
           checked: tuple[int, Target] | None = None) -> dict:
    """wrk's figures that h2load has for `clients` HTTP/2 connections reading `keys`, with the
    server's CPU per 1,000 requests. With `checked` (the objects' size, and a target serving the
    same cache over HTTP/1.1), the bytes are checked as `Bench.wrk` checks wrk's: the body bytes
    received hold one whole body per completed response (and at most what was in flight when the
    run ended), then each key is read once more and compared byte for byte."""
    cmd = ["h2load", "-c", str(clients), "-t", str(min(2, clients)), "-m", str(streams), "-D", str(seconds),
           *[t.endpoint + t.path(k) for k in keys]]
    cpu, load = t.cpu_seconds(), children_cpu_seconds()
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    cpu = None if cpu is None else t.cpu_seconds() - cpu
    load = children_cpu_seconds() - load
    done = int(re.search(r"requests: \d+ total, \d+ started, (\d+) done", out).group(1))
    # Counted for every request started, done or not.
    ok = int(re.search(r"status codes: (\d+) 2xx", out).group(1))
    if ok < done or done == 0:
        raise RuntimeError(f"h2load against {t.name}: {ok} of {done} requests answered 2xx:\n{out}")
    rps = float(re.search(r"finished in [\d.]+m?s, ([\d.]+) req/s", out).group(1))
    mean, sd = re.search(r"time for request:\s+\S+\s+\S+\s+(\S+)\s+(\S+)", out).groups()
    r = {"rps": rps, "requests": done, "mean": mean, "sd": sd, "client_cpu_ms_per_1k": load * 1e6 / done,
         **({} if cpu is None else {"cpu_ms_per_1k": cpu * 1e6 / done})}
    if checked is not None:
        size, again = checked
        data = int(re.search(r"traffic: .*?, (?:[\d.]+\w*B \((\d+)\)) data", out).group(1))
        low, high = done * size, (done + clients * streams) * size
        if not low <= data <= high:
            raise RuntimeError(f"h2load against {t.name}: {data} body bytes for {done} responses of {size}-byte "
                               f"objects (expected {low} to {high})")
        reader = Reader(again)
        try:
            for key in keys:
                reader.get(key, content(key, size))
        finally:
            reader.close()
        r["mib_s"] = data / MiB / (done / rps)
    return r


def in_rounds(targets: list, rounds: int, run) -> list[list[dict]]:
    """`run(target)` for each of `targets` in turn, `rounds` times over: each target's runs, for
    `medians`. Taking turns within a round puts the machine's slow spells on every target alike."""
    runs: list[list[dict]] = [[] for _ in targets]
    for _ in range(rounds):
        for target, got in zip(targets, runs):
            got.append(run(target))
    return runs


# What verifying a SigV4 request runs: the authenticator (the signature, its canonical request,
# the signing key's lookup) and the parse of the request's query, which a presigned URL fills
# and an anonymous URL leaves empty. The first must show in a profile, or it measured nothing.
SIGV4_SYMBOLS = ("larder::auth::Authenticator::authenticate", "larder::s3::query::Query::parse")


def profiled(pid: int, work: Path, run, symbols: tuple[str, ...]) -> dict | None:
    """The share (%) of process `pid`'s CPU samples spent in each of `symbols` and all they call
    while `run()` ran (perf's inclusive `--children` share, call graphs unwound by DWARF): a
    function's cost measured inside one process, where the difference of two processes' CPU per
    request (a signed Larder against an unsigned one) moves by a tenth between runs on this
    machine. None where perf is missing or the kernel refuses it, or where the first of
    `symbols` never showed (renamed, or not run): a share of nothing is not a finding. What
    `run()` returns is dropped: its figures carry perf's sampling cost."""
    if not shutil.which("perf"):
        return None
    data = work / f"perf-{pid}.data"
    perf = subprocess.Popen(["perf", "record", "-q", "-F", "999", "--call-graph", "dwarf", "-o", str(data),
                             "-p", str(pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)  # perf attaches to every thread before the load starts
    try:
        run()
    finally:
        perf.send_signal(signal.SIGINT)
        perf.wait(timeout=120)
    # --no-inline: symbols as compiled, so an inlined callee counts in its caller (and the report
    # takes a second where resolving inlined frames through addr2line takes half a minute).
    report = subprocess.run(["perf", "report", "-i", str(data), "--no-inline", "--children", "--stdio",
                             "--sort", "sym", "-g", "none", "--percent-limit", "0"],
                            capture_output=True, text=True)
    data.unlink(missing_ok=True)
    if perf.returncode not in (0, -2) or report.returncode != 0:
        return None
    shares: dict[str, float] = {}
    for line in report.stdout.splitlines():
        m = re.match(r"\s+([\d.]+)%\s+[\d.]+%\s+\[\.\]\s+(\S+)\s*$", line)
        if m and m.group(2) in symbols:
            # Two instances of one generic function are two lines; neither runs inside the other.
            shares[m.group(2)] = shares.get(m.group(2), 0.0) + float(m.group(1))
    if symbols[0] not in shares:
        return None
    return {s: shares.get(s, 0.0) for s in symbols}


def medians(runs: list[dict]) -> dict:
    """One cell's runs as one row: each figure's median over the runs (so one row's figures may
    come from different runs), what is not a number from the first, and every run's requests per
    second and CPU per request beside, for the spread."""
    row = dict(runs[0])
    for k, v in runs[0].items():
        if isinstance(v, (int, float)) and all(isinstance(r.get(k), (int, float)) for r in runs):
            row[k] = statistics.median(r[k] for r in runs)
    if len(runs) > 1:
        row["rounds"] = [{k: r[k] for k in ("rps", "cpu_ms_per_1k") if k in r} for r in runs]
    return row


def each_round(row: dict) -> str:
    """A row of `medians`' rounds for the step's output: each round's req/s and CPU per 1,000."""
    each = "".join(f" [{x['rps']:.0f}, {x.get('cpu_ms_per_1k', 0):.1f}]" for x in row.get("rounds", []))
    return f" (medians; rounds:{each})" if each else ""


def post_json(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def machine() -> dict:
    def cmd(*args):
        try:
            p = subprocess.run(args, capture_output=True, text=True, timeout=10)
            return (p.stdout + p.stderr).strip().splitlines()[0]
        except Exception:  # noqa: BLE001
            return "?"
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    mem = next((int(l.split()[1]) * 1024 for l in open("/proc/meminfo") if l.startswith("MemTotal")), 0)
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(mem / GiB, 1),
        "kernel": platform.release(),
        "commit": cmd("git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"),
        "nginx": cmd("nginx", "-v"), "wrk": cmd("wrk", "-v"),
        "minio": cmd(shutil.which("minio") or str(Path.home() / "go/bin/minio"), "--version"),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=MODES, default="quick")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--only", default="",
                    help="comma-separated workloads: memory,ttfb,capped,ranges,herd,parquet,disk,zipf,matrix,tls,cold_tls")
    ap.add_argument("--larder-args", default="", help="more `larder serve` flags for every Larder, e.g. \"--read-window 8\"")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    bench = Bench(args.mode, args.out, tuple(args.larder_args.split()))
    try:
        bench.run({w for w in args.only.split(",") if w})
    finally:
        bench.stop()
    (args.out / "results.json").write_text(json.dumps(bench.results, indent=1))
    import report  # noqa: PLC0415 - matplotlib loads only once there is something to plot
    report.write(bench.results, args.out)
    print(f"results in {args.out}")


if __name__ == "__main__":
    main()
