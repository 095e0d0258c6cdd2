"""Observability end to end: a real Prometheus scrapes Larder, the Grafana dashboards query only
metrics that exist, the status page renders in headless Chromium, and traces and metrics reach an
OTLP/HTTP receiver. Expected figures come from what the clients saw (X-Cache, bodies) and what the
counting pass-through saw arrive upstream, never from Larder's own counters."""

import http.server
import importlib.util
import json
import re
import shutil
import socketserver
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import botocore.exceptions
import pytest
import yaml

from conftest import (CLIENT_KEY, READER_KEY, READER_SECRET, ROOT, chromium, free_port, metric, page_shows,
                      status_json, wait_until)
from counting_proxy import CountingProxy
from test_attacks import _h2c_idle, _post_form
from test_auth import fetch

MiB = 1 << 20
DASHBOARDS = ROOT / "charts" / "larder" / "dashboards"
# Metrics only a replica in a fleet exports.
FLEET_ONLY = ("larder_peer_", "larder_fleet_")
# Exported only where events are expected; checked on such a Larder (test_events.py).
EVENTS_ONLY = ("larder_events_",)
# Exported only where some key has a limit; checked on such a Larder (test_limits.py).
LIMITS_ONLY = ("larder_client_",)
ARTIFACTS = ROOT / "target" / "e2e-artifacts"
# Round prices make the expected dollars easy to state: $1 per GET-class request, $10 per
# PUT-class request, $1 per GB (10^9 bytes) of transfer.
PRICES = ("--price-get-per-1000", "1000", "--price-put-per-1000", "10000",
          "--upstream-transfer", "internet", "--price-internet-per-gb", "1")
CACHEABLE = {"hit-memory", "hit-disk", "partial", "coalesced", "miss"}
HITS = {"hit-memory", "hit-disk"}
# Answers for which Larder sent no upstream request of its own: what a key's saving counts.
FROM_CACHE = HITS | {"coalesced"}


def eventually(check, timeout=30.0, interval=0.3):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


def upstream_dollars(upstream: CountingProxy, bucket: str, sizes: dict) -> float:
    """What the requests the counting pass-through saw for `bucket` cost at PRICES: reads $1,
    listings and writes $10, and the object bytes fetched at $1 per GB."""
    seen = upstream.seen(path_prefix=f"/{bucket}")
    lists = [r for r in seen if r[0] == "GET" and "list-type" in r[1]]
    object_reads = [r for r in seen if r[0] in ("GET", "HEAD") and r not in lists]
    writes = [r for r in seen if r[0] in ("PUT", "POST")]
    fetched = 0
    for method, path, rng in object_reads:
        if method == "GET":
            start, end = map(int, rng.removeprefix("bytes=").split("-"))
            # A cold read asks for a whole block; the upstream sends what the object has.
            size = sizes[path.split("?")[0].rsplit("/", 1)[1]]
            fetched += min(end + 1, size) - start
    return len(object_reads) + 10 * (len(lists) + len(writes)) + fetched / 1e9


class Workload:
    """Reads through Larder with boto3 and keeps what the clients saw."""

    def __init__(self, sizes: dict):
        self.sizes = sizes
        self.x_cache = []
        self.client_requests = {"get": 0, "put": 0}
        self.served = 0

    def expected_dollars(self, upstream: CountingProxy, bucket: str) -> tuple[float, float]:
        direct = self.client_requests["get"] + 10 * self.client_requests["put"] + self.served / 1e9
        return direct, upstream_dollars(upstream, bucket, self.sizes)

    def hit_ratio(self) -> float:
        cacheable = [c for c in self.x_cache if c in CACHEABLE]
        return sum(c in HITS for c in cacheable) / len(cacheable)


@pytest.fixture
def observed(workdir, minio, make_larder, direct, bucket):
    """A Larder with a disk tier and round prices, behind its own counting pass-through, after a
    workload whose every request the test tallied."""
    upstream = CountingProxy("127.0.0.1", minio.port)
    larder = make_larder("--disk-path", str(workdir / f"{bucket}.cache"), "--disk-capacity", "256MiB",
                         "--disk-region-size", "16MiB", "--metrics-buckets", bucket, *PRICES,
                         name="observed", upstream_url=f"http://127.0.0.1:{upstream.port}")
    objects = {"a.bin": 1 * MiB, "b.bin": 3 * MiB + 17, "c.bin": 100_000, "d.bin": 10 * MiB}
    for key, size in objects.items():
        direct.put_object(Bucket=bucket, Key=key, Body=bytes([size % 251]) * size)
    client = larder.client()
    w = Workload(objects)

    def tally(response, body_len=0, cls="get"):
        w.x_cache.append(response["ResponseMetadata"]["HTTPHeaders"]["x-cache"])
        w.client_requests[cls] += 1
        w.served += body_len

    for key, size in objects.items():
        r = client.get_object(Bucket=bucket, Key=key)
        body = r["Body"].read()
        assert len(body) == size
        tally(r, len(body))
        # The cold read's blocks land in memory as their fetches finish; probe until they have.
        for _ in range(100):
            r = client.get_object(Bucket=bucket, Key=key, Range="bytes=0-0")
            tally(r, len(r["Body"].read()))
            if r["ResponseMetadata"]["HTTPHeaders"]["x-cache"] == "hit-memory":
                break
            time.sleep(0.1)
    for _ in range(5):
        for key, size in objects.items():
            r = client.get_object(Bucket=bucket, Key=key)
            tally(r, len(r["Body"].read()))
            r = client.get_object(Bucket=bucket, Key=key, Range=f"bytes={size // 2}-{size // 2 + 999}")
            tally(r, len(r["Body"].read()))
            tally(client.head_object(Bucket=bucket, Key=key))
    tally(client.list_objects_v2(Bucket=bucket), cls="put")
    yield larder, upstream, w, bucket
    upstream.close()


def test_every_dashboard_metric_exists_on_a_live_larder(observed):
    larder, _, _, _ = observed
    scrape = larder.metrics()
    names = set()
    for path in sorted(DASHBOARDS.glob("*.json")):
        dashboard = json.loads(path.read_text())
        exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
        assert exprs, path
        for expr in exprs:
            for name in re.findall(r"\blarder_[a-z0-9_]+", expr):
                names.add(name)
                if name.startswith(FLEET_ONLY + EVENTS_ONLY + LIMITS_ONLY):
                    continue  # checked on a live fleet replica (test_fleet.py), one expecting events, one with limits
                assert re.search(rf"^{name}[{{ ]", scrape, re.M), f"{path.name} queries {name}, which Larder does not export"
    assert len(names) >= 30, names


def test_dashboards_are_what_the_generator_writes():
    spec = importlib.util.spec_from_file_location("generate", DASHBOARDS / "generate.py")
    generate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate)
    assert set(generate.DASHBOARDS) == {p.name for p in DASHBOARDS.glob("*.json")}
    for name, d in generate.DASHBOARDS.items():
        assert (DASHBOARDS / name).read_text() == generate.render(d), f"run {DASHBOARDS / 'generate.py'}"


def test_the_chart_ships_the_dashboards_as_a_configmap():
    helm = shutil.which("helm") or str(Path.home() / "go" / "bin" / "helm")
    chart = ROOT / "charts" / "larder"
    minimal = ["-f", str(chart / "ci" / "minimal-values.yaml")]
    out = subprocess.run([helm, "template", "obs", str(chart), *minimal, "--set", "dashboards.enabled=true"],
                         check=True, capture_output=True, text=True).stdout
    maps = [d for d in yaml.safe_load_all(out) if d and d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboards")]
    assert len(maps) == 1, out
    cm = maps[0]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert set(cm["data"]) == {p.name for p in DASHBOARDS.glob("*.json")}
    for name, text in cm["data"].items():
        assert json.loads(text) == json.loads((DASHBOARDS / name).read_text())
    off = subprocess.run([helm, "template", "obs", str(chart), *minimal], check=True, capture_output=True,
                         text=True).stdout
    assert "-dashboards" not in off


def prometheus_query(base, query):
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(url, timeout=5) as r:
        result = json.load(r)["data"]["result"]
    return float(result[0]["value"][1]) if result else None


def test_prometheus_scrapes_the_hit_ratio_and_dollars_the_workload_implies(observed, workdir):
    larder, upstream, w, bucket = observed
    exe = shutil.which("prometheus")
    assert exe, "prometheus is not installed (e2e/setup.sh installs Debian's package)"
    port = free_port()
    config = workdir / "prometheus.yml"
    target = larder.admin.removeprefix("http://")
    config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "larder", "static_configs": [{"targets": [target]}]}],
    }))
    log = open(workdir / "prometheus.log", "wb")
    proc = subprocess.Popen([exe, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'prometheus-data'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        hit_ratio = w.hit_ratio()
        direct, spent = w.expected_dollars(upstream, bucket)
        assert 0 < hit_ratio < 1 and direct > spent > 0, (w.x_cache, direct, spent)
        ratio_q = ('sum(larder_requests_total{cache=~"hit-memory|hit-disk"}) / '
                   'sum(larder_requests_total{cache=~"hit-memory|hit-disk|partial|coalesced|miss"})')
        saved_q = "sum(larder_cost_direct_dollars_total) - sum(larder_cost_upstream_dollars_total)"
        bucket_q = f'sum(larder_cost_direct_dollars_total{{bucket="{bucket}"}})'

        def close(query, expected):
            try:
                got = prometheus_query(base, query)
            except OSError:
                return None
            return got is not None and abs(got - expected) <= 1e-9 * max(1.0, abs(expected)) and got

        assert eventually(lambda: close(ratio_q, hit_ratio), timeout=60), (prometheus_query(base, ratio_q), hit_ratio)
        assert eventually(lambda: close(saved_q, direct - spent)), (prometheus_query(base, saved_q), direct - spent)
        assert eventually(lambda: close(bucket_q, direct)), (prometheus_query(base, bucket_q), direct)
        assert prometheus_query(base, 'up{job="larder"}') == 1.0
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def test_the_saving_splits_by_bucket_and_by_key_as_the_answers_imply(workdir, minio, make_larder, direct, bucket):
    """Two teams' keys share one Larder over two buckets. Each key's direct cost and saving is
    what its own requests' answers imply (their X-Cache and bodies, tallied here), and each
    bucket's upstream cost is what the counting pass-through saw for that bucket: so a bucket's
    net saving, and what the cache saved each key, are the figures a chargeback needs."""
    other = f"other-{bucket}"
    direct.create_bucket(Bucket=other)
    upstream = CountingProxy("127.0.0.1", minio.port)
    larder = make_larder("--metrics-buckets", bucket, "--list-ttl", "60s", *PRICES, name="savings",
                         upstream_url=f"http://127.0.0.1:{upstream.port}")
    sizes = {"a.bin": 1 * MiB, "b.bin": 2 * MiB + 5, "c.bin": 70_000}
    for b in (bucket, other):
        for key, size in sizes.items():
            direct.put_object(Bucket=b, Key=key, Body=bytes([size % 251]) * size)
    clients = {CLIENT_KEY: larder.client(), READER_KEY: larder.client(READER_KEY, READER_SECRET)}
    # Per key: dollars [requests, transfer] direct and saved, and requests [all, from the cache].
    want = {k: {"direct": [0.0, 0.0], "saved": [0.0, 0.0], "requests": [0, 0]} for k in clients}

    def tally(key, response, body=b"", price=1):
        cache = response["ResponseMetadata"]["HTTPHeaders"]["x-cache"]
        w, cached = want[key], cache in FROM_CACHE
        w["direct"][0] += price
        w["requests"][0] += 1
        if cached:
            w["saved"][0] += price
            w["requests"][1] += 1
        if cache not in ("pass", "error"):
            w["direct"][1] += len(body) / 1e9
            if cached:
                w["saved"][1] += len(body) / 1e9

    def read(key, b, name, **kw):
        r = clients[key].get_object(Bucket=b, Key=name, **kw)
        body = r["Body"].read()
        tally(key, r, body)
        return r["ResponseMetadata"]["HTTPHeaders"]["x-cache"]

    # Team A reads the first bucket cold, then until its blocks are in memory.
    for name, size in sizes.items():
        read(CLIENT_KEY, bucket, name)
        for _ in range(100):
            if read(CLIENT_KEY, bucket, name, Range="bytes=0-0") == "hit-memory":
                break
            time.sleep(0.1)
    # Team B reads what A fetched (its saving, though A's reads paid the fetch), and the other
    # bucket cold and again.
    for name, size in sizes.items():
        assert read(READER_KEY, bucket, name) in HITS
        tally(READER_KEY, clients[READER_KEY].head_object(Bucket=bucket, Key=name))
        read(READER_KEY, other, name)
        for _ in range(100):
            if read(READER_KEY, other, name, Range=f"bytes={size - 10}-{size - 1}") == "hit-memory":
                break
            time.sleep(0.1)
    # A's listing twice (the second from the listing cache) and a write: PUT-class requests.
    for _ in range(2):
        tally(CLIENT_KEY, clients[CLIENT_KEY].list_objects_v2(Bucket=bucket), price=10)
    tally(CLIENT_KEY, clients[CLIENT_KEY].put_object(Bucket=bucket, Key="new.bin", Body=b"n" * 1000), price=10)
    # B's browser-form upload: verified from its form, not a header, and counted to B all the same.
    form = clients[READER_KEY].generate_presigned_post(bucket, "form/${filename}", ExpiresIn=300)
    status, body = _post_form(form["url"], form["fields"], "f.txt", b"from a form")
    assert status == 204, body
    want[READER_KEY]["direct"][0] += 10
    want[READER_KEY]["requests"][0] += 1
    # An unsigned request is refused before any key is known, and counted to none.
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{larder.endpoint}/{bucket}/a.bin", timeout=5)
    assert refused.value.code == 403
    try:
        for key, w in want.items():
            # Each team saved something, and not everything.
            assert 0 < w["requests"][1] < w["requests"][0], (key, w)

        def matches():
            for key, w in want.items():
                for i, kind in enumerate(("requests", "transfer")):
                    for name in ("direct", "saved"):
                        got = metric(larder, f"larder_key_cost_{name}_dollars_total", access_key=key, kind=kind)
                        if abs(got - w[name][i]) > 1e-9 * max(1.0, w[name][i]):
                            return f"{key} {name} {kind}: {got} != {w[name][i]}"
                if metric(larder, "larder_key_requests_total", access_key=key) != w["requests"][0]:
                    return f"{key} requests"
                if metric(larder, "larder_key_requests_cached_total", access_key=key) != w["requests"][1]:
                    return f"{key} cached requests"
            return None

        assert eventually(lambda: matches() is None, timeout=10), matches()
        # Every request was signed by one of the two keys: their direct costs are the total.
        keys_direct = sum(metric(larder, "larder_key_cost_direct_dollars_total", access_key=k) for k in want)
        assert keys_direct == pytest.approx(metric(larder, "larder_cost_direct_dollars_total"), rel=1e-9)
        # Every upstream request is priced to its bucket: the listed one by name, the other as
        # `other`, each what the pass-through saw for it.
        sizes_here = {**sizes, "new.bin": 1000}
        for label, name in ((bucket, bucket), ("other", other)):
            spent = upstream_dollars(upstream, name, sizes_here)
            assert spent > 0
            got = metric(larder, "larder_cost_upstream_dollars_total", bucket=label)
            assert got == pytest.approx(spent, rel=1e-9), (label, got, spent)
    finally:
        upstream.close()


def test_status_page_in_headless_chromium(observed, workdir):
    larder, upstream, w, bucket = observed
    status = status_json(larder)
    direct, spent = w.expected_dollars(upstream, bucket)
    assert status["request_hit_ratio"] == pytest.approx(w.hit_ratio())
    assert status["dollars_saved"] == pytest.approx(direct - spent)
    assert status["disk"]["capacity_bytes"] > 0
    assert status["fleet"] is None, "not part of a fleet"

    shown = page_shows(workdir, f"{larder.admin}/")
    assert shown("hit-ratio") == f"{w.hit_ratio() * 100:.1f} %"
    # The workload's one key, with the requests the clients sent and what the cache saved it.
    (key,) = [k for k in status["keys"] if k["requests"]]
    assert key["access_key"] == CLIENT_KEY
    assert key["requests"] == w.client_requests["get"] + w.client_requests["put"]
    assert 0 < key["cached_requests"] < key["requests"] and 0 < key["dollars_saved"] < key["dollars_direct"]
    assert shown(f"key-saved-{CLIENT_KEY}").startswith("$") and float(shown(f"key-saved-{CLIENT_KEY}")[1:]) > 0
    assert shown("saved").startswith("$") and float(shown("saved")[1:]) > 0
    assert re.fullmatch(r"[\d.]+ (B|KiB|MiB|GiB)", shown("memory")) and shown("memory") != "0 B"
    assert shown("disk") != "off"
    assert shown("upstream") == "healthy"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "status-page.png"
    shot.unlink(missing_ok=True)
    subprocess.run([*chromium(workdir), "--window-size=1100,760", f"--screenshot={shot}", f"{larder.admin}/"],
                   check=True, capture_output=True, timeout=120)
    assert shot.stat().st_size > 10_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


class OtlpReceiver:
    """An OTLP/HTTP (protobuf) receiver on loopback that keeps what it is sent."""

    def __init__(self):
        from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
        self.spans, self.metric_names, self.lock = [], set(), threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                assert self.headers["Content-Type"] == "application/x-protobuf"
                with receiver.lock:
                    if self.path == "/v1/traces":
                        req = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
                        for rs in req.resource_spans:
                            for ss in rs.scope_spans:
                                receiver.spans.extend(ss.spans)
                        reply = trace_service_pb2.ExportTraceServiceResponse()
                    elif self.path == "/v1/metrics":
                        req = metrics_service_pb2.ExportMetricsServiceRequest.FromString(body)
                        for rm in req.resource_metrics:
                            for sm in rm.scope_metrics:
                                receiver.metric_names.update(m.name for m in sm.metrics)
                        reply = metrics_service_pb2.ExportMetricsServiceResponse()
                    else:
                        self.send_error(404)
                        return
                data = reply.SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_slow_requests_are_traced_through_otlp_with_upstream_spans(minio, make_larder, direct, bucket):
    receiver = OtlpReceiver()
    upstream = CountingProxy("127.0.0.1", minio.port)
    try:
        larder = make_larder("--otlp-endpoint", receiver.url, "--otlp-interval", "1s",
                             "--trace-slow-threshold", "400ms", name="otlp",
                             upstream_url=f"http://127.0.0.1:{upstream.port}")
        direct.put_object(Bucket=bucket, Key="traced.bin", Body=b"t" * (2 * MiB))
        client = larder.client()
        upstream.delay = 0.5  # one GET upstream (it brings the metadata too): over 400 ms
        assert client.get_object(Bucket=bucket, Key="traced.bin")["Body"].read() == b"t" * (2 * MiB)
        upstream.delay = 0
        for _ in range(3):  # fast hits: not exported
            client.get_object(Bucket=bucket, Key="traced.bin")["Body"].read()
        assert eventually(lambda: {"larder_requests_total", "larder.requests"} & receiver.metric_names, timeout=20), receiver.metric_names
        larder.stop()  # flushes the span exporter
        with receiver.lock:
            spans = list(receiver.spans)
        roots = [s for s in spans if not s.parent_span_id]
        assert [s.name for s in roots] == ["GetObject"], [(s.name, s.parent_span_id) for s in spans]
        root = roots[0]
        trace = [s for s in spans if s.trace_id == root.trace_id]
        names = sorted(s.name for s in trace)
        assert names == sorted(["GetObject", "block fetch", "GetObject"]), names
        attrs = {a.key: a.value for a in root.attributes}
        assert attrs["larder.cache"].string_value == "miss"
        assert attrs["http.response.status_code"].int_value == 200
        assert (root.end_time_unix_nano - root.start_time_unix_nano) >= 400_000_000
        by_id = {s.span_id: s for s in trace}
        upstream_get = next(s for s in trace if s.name == "GetObject" and s.parent_span_id)
        assert by_id[upstream_get.parent_span_id].name == "block fetch"
        assert by_id[by_id[upstream_get.parent_span_id].parent_span_id] is root
    finally:
        upstream.close()
        receiver.close()


def test_text_logs_written_to_a_file_carry_no_colour_codes(make_larder):
    larder = make_larder(name="plain-logs")
    text = larder.log_path.read_text()
    assert "larder is serving" in text
    assert "\x1b[" not in text, text[:300]


@pytest.mark.parametrize("log_spans", [False, True], ids=["events-only", "log-spans"])
def test_a_failed_requests_log_line_names_its_request_id(make_larder, bucket, log_spans):
    """Request spans reach log lines only with `log_spans` (building one per request costs a
    tenth of a small hit's CPU), and a failed request's line names its request id either way,
    so a client's x-amz-request-id finds it."""
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens: every upstream request fails
    extra = ["--log-spans"] if log_spans else []
    larder = make_larder("--log-format", "json", "--upstream-max-attempts", "1", *extra,
                         upstream_url=dead, name="failing-logs")
    with pytest.raises(botocore.exceptions.ClientError) as failed:
        larder.client().get_object(Bucket=bucket, Key="k")
    answer = failed.value.response
    assert answer["ResponseMetadata"]["HTTPStatusCode"] >= 500, answer
    request_id = answer["ResponseMetadata"]["RequestId"]
    larder.stop()
    records = [json.loads(l) for l in larder.log_path.read_text().splitlines() if l.strip()]
    failures = [r for r in records if r["fields"].get("message") == "request failed"]
    lines = [r for r in failures if r["fields"].get("request_id") == request_id]
    assert len(lines) == 1, failures
    line = lines[0]
    if log_spans:
        assert line["span"]["larder.request_id"] == request_id, line
        assert line["span"]["otel.name"] == "GetObject", line
    else:
        assert "span" not in line and "spans" not in line, line


def test_the_log_filter_changes_without_a_restart_and_a_bad_one_changes_nothing(make_larder):
    """`PUT /log` on the admin listener puts a filter in force at once (RUST_LOG's syntax), a
    filter that does not parse is refused with the one in force kept, and `DELETE /log` goes
    back to the filter at start, as does a filter given `?for=` once that time is up. Seen
    through a crate's debug lines: the frames of an HTTP/2 connection (h2's)."""
    l = make_larder(name="log-filter")  # RUST_LOG=info
    debug_line = "received frame=Settings"

    def an_http2_connection():
        s = _h2c_idle(l.port)
        time.sleep(0.3)
        s.close()

    def log_filter(method="GET", body=None):
        status, answer = fetch(f"{l.admin}/log", method, data=body)
        return status, json.loads(answer)

    assert log_filter() == (200, {"filter": "info", "at_start": "info"})
    an_http2_connection()
    assert debug_line not in l.log_path.read_text()

    assert log_filter("PUT", b"info,h2=debug\n") == (200, {"filter": "info,h2=debug", "was": "info", "for": None})
    an_http2_connection()
    wait_until(lambda: debug_line in l.log_path.read_text(), 10, "the debug line under the new filter")
    assert "log filter changed" in l.log_path.read_text()

    status, answer = log_filter("PUT", b"h2=loud")
    assert status == 400 and "not a log filter" in answer["error"], answer
    assert log_filter()[1]["filter"] == "info,h2=debug"

    assert log_filter("DELETE") == (200, {"filter": "info", "was": "info,h2=debug", "for": None})
    before = l.log_path.read_text().count(debug_line)
    an_http2_connection()
    time.sleep(0.5)
    assert l.log_path.read_text().count(debug_line) == before, "a debug line after the reset"

    # A filter for a while: the one at start comes back by itself.
    for bad in ("0s", "soon", "8d"):
        status, answer = fetch(f"{l.admin}/log?for={bad}", "PUT", data=b"debug")
        assert status == 400 and "duration" in json.loads(answer)["error"], (bad, answer)
    assert log_filter()[1]["filter"] == "info"
    status, answer = fetch(f"{l.admin}/log?for=2s", "PUT", data=b"info,h2=debug")
    assert status == 200 and json.loads(answer)["for"] == "2s", answer
    assert log_filter()[1]["filter"] == "info,h2=debug"
    wait_until(lambda: log_filter()[1]["filter"] == "info", 15, "the filter at start back")
    assert "log filter ran out" in l.log_path.read_text()
    assert l.proc.poll() is None


def test_json_logs(make_larder, direct, bucket):
    larder = make_larder("--log-format", "json", name="json-logs")
    direct.put_object(Bucket=bucket, Key="k", Body=b"x")
    larder.client().get_object(Bucket=bucket, Key="k")["Body"].read()
    larder.stop()
    lines = [l for l in larder.log_path.read_text().splitlines() if l.strip()]
    records = [json.loads(l) for l in lines]
    assert any(r["fields"].get("message") == "larder is serving" for r in records), lines
    assert all({"timestamp", "level", "fields", "target"} <= r.keys() for r in records)
