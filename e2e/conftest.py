"""Fixtures for Larder's end-to-end tests: a real MinIO on loopback, a counting pass-through in
front of it, and Larder (the real binary) in front of that. Clients are unmodified: boto3, the
aws CLI and aws-sdk-rust."""

import http.server
import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import boto3
import pytest
from botocore.config import Config

from counting_proxy import CountingProxy

ROOT = Path(__file__).resolve().parent.parent
ACCESS_KEY = "larder-e2e"
SECRET_KEY = "larder-e2e-secret-key"
# What clients of Larder sign with: Larder's own client keys, not the upstream's.
CLIENT_KEY = "larder-client"
CLIENT_SECRET = "larder-client-secret/with+odd=chars"
READER_KEY = "larder-reader"
READER_SECRET = "larder-reader-secret"
REGION = "us-east-1"


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on `host` now (another process may still take it before it is bound)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float = 60.0, proc: subprocess.Popen | None = None, context=None):
    """Poll `url` until it answers 200; with `proc`, give up as soon as that process has exited.
    `context`: the SSL context an `https://` URL is checked with."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{url}: the process exited ({proc.returncode}) before it was ready")
        try:
            with urllib.request.urlopen(url, timeout=2, context=context) as r:
                if r.status == 200:
                    return
        except Exception as e:  # noqa: BLE001 - retried until the deadline
            last = e
        time.sleep(0.2)
    raise RuntimeError(f"{url} not ready after {timeout}s: {last}")


def wait_until(condition, timeout: float, what: str, interval: float = 0.05):
    """Poll `condition` until it returns something truthy (returned); fail naming `what` if it
    has not within `timeout` seconds. For what happens behind a response (a block landing in
    memory, a counter being published), instead of a fixed sleep."""
    deadline = time.monotonic() + timeout
    while True:
        got = condition()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what}: not within {timeout}s (last: {got!r})"
        time.sleep(interval)


def binary(name: str) -> str:
    profile = os.environ.get("LARDER_E2E_PROFILE", "release")
    path = ROOT / "target" / profile / name
    if not path.exists():
        raise RuntimeError(f"{path} is missing: build it first (e2e/test-all.sh does)")
    return str(path)


def s3_client(endpoint: str, key: str = ACCESS_KEY, secret: str = SECRET_KEY, **config):
    config = {"s3": {"addressing_style": "path"}, "retries": {"max_attempts": 1}, **config}
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        region_name=REGION,
        config=Config(**config),
    )


def assert_dashboard_metrics_exported(node, prefixes: tuple[str, ...], at_least: int, who: str):
    """Every metric beginning with one of `prefixes` that a dashboard of the chart queries is in
    `node`'s scrape: for metrics only some Larders export (a fleet replica's, one expecting
    events), which test_observability.py leaves to the tests that run such a Larder."""
    scrape = node.metrics()
    queried = set()
    for path in sorted((ROOT / "charts" / "larder" / "dashboards").glob("*.json")):
        for p in json.loads(path.read_text())["panels"]:
            for t in p["targets"]:
                queried.update(n for n in re.findall(r"\blarder_[a-z0-9_]+", t["expr"]) if n.startswith(prefixes))
    assert len(queried) >= at_least, queried
    for name in queried:
        assert re.search(rf"^{name}[{{ ]", scrape, re.M), f"the dashboards query {name}, which {who} does not export"


def metric(node, name, **labels) -> float:
    """Sum of a metric's series whose labels include `labels`."""
    total = 0.0
    for line in node.metrics().splitlines():
        if not line.startswith(name):
            continue
        m = re.match(r"^(\w+)(?:\{(.*)\})? (\S+)$", line)
        if not m or m.group(1) != name:
            continue
        have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(m.group(3))
    return total


class Minio:
    def __init__(self, workdir: Path, name: str = "minio", port: int | None = None, env: dict | None = None,
                 tls: tuple[Path, Path, Path] | None = None):
        """A MinIO server; `env` adds to its environment (e.g. MINIO_NOTIFY_WEBHOOK_* targets).
        `tls`: (certificate, key, the CA certificate that signed it): MinIO speaks HTTPS only,
        with that certificate."""
        self.port = port or free_port()
        self.data = workdir / f"{name}-data"
        self.data.mkdir()
        exe = shutil.which("minio") or str(Path.home() / "go" / "bin" / "minio")
        env = dict(os.environ, MINIO_ROOT_USER=ACCESS_KEY, MINIO_ROOT_PASSWORD=SECRET_KEY, MINIO_BROWSER="off",
                   **(env or {}))
        self.log = open(workdir / f"{name}.log", "wb")
        certs, context, scheme = [], None, "http"
        if tls:
            cert, key, ca = tls
            certs_dir = workdir / f"{name}-certs"
            certs_dir.mkdir()
            shutil.copy(cert, certs_dir / "public.crt")
            shutil.copy(key, certs_dir / "private.key")
            certs, context, scheme = ["--certs-dir", str(certs_dir)], ssl.create_default_context(cafile=str(ca)), "https"
        self.proc = subprocess.Popen(
            [exe, "server", "--quiet", *certs, "--address", f"127.0.0.1:{self.port}", str(self.data)],
            env=env, stdout=self.log, stderr=subprocess.STDOUT,
        )
        self.endpoint = f"{scheme}://127.0.0.1:{self.port}"
        wait_http(f"{self.endpoint}/minio/health/ready", proc=self.proc, context=context)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()


class Listener:
    """A loopback HTTP listener that records every request (method, path, body) and answers 200,
    after passing each body to `on_post` if given."""

    def __init__(self, on_post=None):
        self.requests: list[tuple[str, str, bytes]] = []
        listener = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def answer(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                listener.requests.append((self.command, self.path, body))
                if on_post and self.command == "POST":
                    on_post(body)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_HEAD = do_POST = answer

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class ElasticMQ:
    """ElasticMQ, an SQS-compatible server (fetched from Maven Central by e2e/setup.sh), on
    loopback with one queue per name in `queues`."""

    LIB = Path(os.environ.get("LARDER_E2E_ELASTICMQ", Path.home() / ".local/share/larder-e2e/elasticmq/lib"))

    def __init__(self, workdir: Path, queues: list[str], name: str = "elasticmq"):
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        conf = workdir / f"{name}.conf"
        conf.write_text("\n".join([
            'include classpath("application.conf")',
            f'node-address {{ protocol = http, host = "127.0.0.1", port = {self.port}, context-path = "" }}',
            f'rest-sqs {{ enabled = true, bind-port = {self.port}, bind-hostname = "127.0.0.1", sqs-limits = strict }}',
            "rest-stats { enabled = false }",
            "queues { " + " ".join(f"{q} {{}}" for q in queues) + " }",
        ]) + "\n")
        self.log = open(workdir / f"{name}.log", "wb")
        self.proc = subprocess.Popen(
            ["java", f"-Dconfig.file={conf}", "-cp", f"{self.LIB}/*", "org.elasticmq.server.Main"],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.client = boto3.client("sqs", endpoint_url=self.endpoint, region_name=REGION,
                                   aws_access_key_id="e2e", aws_secret_access_key="e2e")
        deadline = time.monotonic() + 60
        while True:
            try:
                self.client.list_queues()
                break
            except Exception:
                assert self.proc.poll() is None, f"ElasticMQ exited; see {self.log.name}"
                assert time.monotonic() < deadline, "ElasticMQ did not start in 60 s"
                time.sleep(0.2)

    def queue_url(self, queue: str) -> str:
        return self.client.get_queue_url(QueueName=queue)["QueueUrl"]

    def stop(self):
        # Its graceful stop waits out every long poll still open (20 s); the queues are in memory.
        self.proc.kill()
        self.proc.wait(timeout=30)
        self.log.close()


class Larder:
    """One `larder serve` process."""

    def __init__(self, workdir: Path, upstream: str, *extra: str, name: str = "larder", env: dict | None = None,
                 host: str = "127.0.0.1"):
        self.host = host
        self.log_path = workdir / f"{name}.log"
        self.credentials = workdir / f"{name}.keys"
        self.credentials.write_text(f"# e2e client keys\n{CLIENT_KEY}:{CLIENT_SECRET}\n{READER_KEY}:{READER_SECRET}\n")
        env = {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "RUST_LOG": "info", **(env or {})}
        # LARDER_* settings of the caller's shell do not leak in; a None in `env` unsets a variable.
        for k in [k for k, v in env.items() if k.startswith("LARDER_") or v is None]:
            del env[k]
        # A port free on `host` may still be taken between the check and the bind. A start that
        # fails to bind is tried again on other ports; any other early exit fails at once, with
        # the log.
        for attempt in range(3):
            self.port = free_port(host)
            self.admin_port = free_port(host)
            self.endpoint = f"http://{host}:{self.port}"
            self.admin = f"http://{host}:{self.admin_port}"
            self.log = open(self.log_path, "wb")
            args = [
                binary("larder"), "serve",
                "--listen", f"{host}:{self.port}",
                "--admin-listen", f"{host}:{self.admin_port}",
                "--upstream-endpoint", upstream,
                "--upstream-path-style",
                *([] if "--auth" in extra else ["--auth-credentials", str(self.credentials)]),
                *extra,
            ]
            self.proc = subprocess.Popen(args, env=env, stdout=self.log, stderr=subprocess.STDOUT)
            try:
                wait_http(f"{self.admin}/readyz", timeout=30, proc=self.proc)
                return
            except RuntimeError:
                pass
            self.proc.kill()
            self.proc.wait(timeout=30)
            self.log.close()
            log = self.log_path.read_text(errors="replace")
            if "Address already in use" not in log or attempt == 2:
                raise RuntimeError(f"{name} on {host} exited, or was not ready within 30 s; its log ends:\n{log[-3000:]}")

    def metrics(self) -> str:
        with urllib.request.urlopen(f"{self.admin}/metrics", timeout=5) as r:
            return r.read().decode()

    def client(self, key: str = CLIENT_KEY, secret: str = CLIENT_SECRET, **config):
        return s3_client(self.endpoint, key, secret, **config)

    def cli_env(self, key: str = CLIENT_KEY, secret: str = CLIENT_SECRET) -> dict:
        """Environment for the aws CLI and aws-sdk-rust, signing with Larder's client keys."""
        return dict(os.environ, AWS_ACCESS_KEY_ID=key, AWS_SECRET_ACCESS_KEY=secret, AWS_DEFAULT_REGION=REGION,
                    AWS_REGION=REGION, AWS_EC2_METADATA_DISABLED="true")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        finally:
            self.log.close()

    def kill(self):
        """SIGKILL: no graceful shutdown, connections cut mid-stream."""
        self.proc.kill()
        self.proc.wait(timeout=30)


class LatencyProxy:
    """The Rust pass-through that stands in for S3's latency (e2e/latency-proxy)."""

    def __init__(self, workdir: Path, upstream_port: int, tls: tuple[Path, Path] | None = None,
                 name: str = "latency-proxy", tls_port: int | None = None):
        """`tls` (certificate, key): the same pass-through over HTTPS too, at `tls_endpoint` (on
        `tls_port` if given: another server taking over a stopped one's address)."""
        self.port = free_port()
        self.log = open(workdir / f"{name}.log", "wb")
        self.tls_port = (tls_port or free_port()) if tls else None
        https = ["--tls-listen", f"127.0.0.1:{self.tls_port}", "--tls-cert", str(tls[0]),
                 "--tls-key", str(tls[1])] if tls else []
        self.proc = subprocess.Popen([binary("larder-latency-proxy"), "--listen", f"127.0.0.1:{self.port}",
                                      "--upstream", f"127.0.0.1:{upstream_port}", *https],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.tls_endpoint = f"https://127.0.0.1:{self.tls_port}" if tls else None
        wait_http(f"{self.endpoint}/__proxy/stats", proc=self.proc)

    def control(self, path: str) -> dict:
        with urllib.request.urlopen(f"{self.endpoint}/__proxy/{path}", timeout=10) as r:
            return json.loads(r.read())

    def limits(self, connection_mbps=0.0, prefix_rps=0.0) -> dict:
        return self.control(f"limits?connection_mbps={connection_mbps}&prefix_rps={prefix_rps}")

    def latency(self, delay_ms=20.0, jitter_ms=30.0, tail_fraction=0.01, tail_ms=200.0) -> dict:
        return self.control(f"latency?delay_ms={delay_ms}&jitter_ms={jitter_ms}"
                            f"&tail_fraction={tail_fraction}&tail_ms={tail_ms}")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=10)
        self.log.close()


@pytest.fixture(scope="session")
def workdir():
    d = Path(tempfile.mkdtemp(prefix="larder-e2e-"))
    yield d
    if os.environ.get("LARDER_E2E_KEEP") is None:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def minio(workdir):
    m = Minio(workdir)
    yield m
    m.stop()


@pytest.fixture(scope="session")
def upstream(minio):
    """The counting pass-through in front of MinIO; Larder talks to this."""
    p = CountingProxy("127.0.0.1", minio.port)
    yield p
    p.close()


class DirectClient:
    """boto3 talking to MinIO directly, to load data and to compare against.

    An empty PutObject leaves the pooled connection in a state where MinIO stalls the next upload
    on it for 30 s, so empty bodies go up on a throwaway client."""

    def __init__(self, endpoint):
        self.endpoint = endpoint
        self.client = s3_client(endpoint)

    def put_object(self, **kw):
        body = kw.get("Body", b"")
        client = self.client if len(body) else s3_client(self.endpoint)
        return client.put_object(**kw)

    def __getattr__(self, name):
        return getattr(self.client, name)


@pytest.fixture(scope="session")
def direct(minio):
    return DirectClient(minio.endpoint)


@pytest.fixture(scope="session")
def larder(workdir, upstream):
    """The default Larder: 8 MiB blocks (the default), 1 GiB of memory."""
    l = Larder(workdir, f"http://127.0.0.1:{upstream.port}", "--memory-capacity", "1GiB", "--base-domain", "s3.larder.test")
    yield l
    l.stop()


@pytest.fixture
def make_larder(workdir, upstream):
    """Start extra Larders with other options; stopped at the end of the test."""
    started = []

    def make(*extra, name="larder-extra", upstream_url=None, env=None, host="127.0.0.1"):
        l = Larder(workdir, upstream_url or f"http://127.0.0.1:{upstream.port}", *extra, name=f"{name}-{len(started)}",
                   env=env, host=host)
        started.append(l)
        return l

    yield make
    for l in started:
        l.stop()


_bucket_counter = [0]


@pytest.fixture
def bucket(direct, request):
    _bucket_counter[0] += 1
    slug = re.sub("[^a-z0-9-]+", "-", request.node.name.lower())[:40]
    name = f"e2e-{_bucket_counter[0]}-{slug}".rstrip("-")
    direct.create_bucket(Bucket=name)
    return name


FLEET_SECRET = "fleet-e2e-shared-secret-0123456789"


def fleet_state(node) -> dict:
    with urllib.request.urlopen(f"{node.admin}/fleet", timeout=5) as r:
        return json.loads(r.read())


def chromium(workdir) -> list[str]:
    """Headless Chromium's command line (a profile under `workdir`; 5 s of the page's own time,
    so its first status.json has been read and shown)."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    assert exe, "chromium is not installed (e2e/setup.sh installs Debian's package)"
    return [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            f"--user-data-dir={workdir / 'chromium-profile'}", "--virtual-time-budget=5000"]


def page_shows(workdir, url):
    """The text a page at `url` shows in an element, by its id, once its script has run."""
    dom = subprocess.run([*chromium(workdir), "--dump-dom", url], check=True, capture_output=True,
                         text=True, timeout=120).stdout

    def shown(element_id):
        m = re.search(rf'id="{element_id}"[^>]*>([^<]*)<', dom)
        assert m, f"#{element_id} missing from the page:\n{dom[:3000]}"
        return m.group(1)
    return shown


def status_json(node) -> dict:
    with urllib.request.urlopen(f"{node.admin}/status.json", timeout=5) as r:
        return json.load(r)


def owner(node, bucket, key, index) -> str:
    url = f"{node.admin}/fleet/owner?bucket={bucket}&key={key}&index={index}"
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())["owner"]


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60, cwd=cwd)


def issue_certificate(d: Path, ca: str, name: str, san: str):
    """`name`.crt and .key in `d`: an ECDSA P-256 server certificate for `san`, signed by the CA
    `ca`.crt / .key there."""
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-subj", f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=d)
    (d / f"{name}.ext").write_text(f"subjectAltName={san}\nbasicConstraints=critical,CA:FALSE\n"
                                   "extendedKeyUsage=serverAuth\n")
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key", "-CAcreateserial",
            "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.crt", cwd=d)


def make_ca(d: Path, name: str):
    """`name`.crt and .key in `d`: a self-signed CA (ECDSA P-256, two days)."""
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
            "-subj", f"/CN=e2e {name}", "-keyout", f"{name}.key", "-out", f"{name}.crt", cwd=d)


@pytest.fixture(scope="session")
def fleet_certs(tmp_path_factory):
    """The fleet's CA and certificate for `larder-fleet`, as the Helm chart makes them; a
    certificate of that CA for another name; and a rogue CA's certificate for `larder-fleet`."""
    d = tmp_path_factory.mktemp("fleet-certs")
    make_ca(d, "fleet-ca")
    issue_certificate(d, "fleet-ca", "fleet", "DNS:larder-fleet")
    issue_certificate(d, "fleet-ca", "other-name", "DNS:not-larder-fleet")
    make_ca(d, "rogue-ca")
    issue_certificate(d, "rogue-ca", "rogue", "DNS:larder-fleet")
    return d


def fleet_tls_flags(certs: Path, cert: str = "fleet", ca: str = "fleet-ca") -> tuple:
    """The flags of a replica presenting `cert` and trusting `ca` for `larder-fleet`."""
    return ("--fleet-tls-cert", str(certs / f"{cert}.crt"), "--fleet-tls-key", str(certs / f"{cert}.key"),
            "--fleet-tls-ca", str(certs / f"{ca}.crt"), "--fleet-tls-name", "larder-fleet")


class RecordingRelay:
    """A TCP relay from `host`:`port` to `target` that keeps every byte it carries either way,
    as someone on the network between two replicas would see them. Each connection's two
    directions are copied by a thread of their own until either side closes."""

    def __init__(self, target: tuple, host: str = "127.0.0.1"):
        self.target = target
        self.recorded = bytearray()
        self.lock = threading.Lock()
        self.sock = socket.create_server((host, 0))
        self.host, self.port = host, self.sock.getsockname()[1]
        self.sock.settimeout(0.2)
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        while not self.stopping.is_set():
            try:
                client, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:  # not listening yet: refused, as the target itself would
                client.close()
                continue
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._copy, args=(a, b), daemon=True).start()

    def _copy(self, src, dst):
        src.settimeout(None)
        try:
            while chunk := src.recv(1 << 16):
                with self.lock:
                    self.recorded += chunk
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def seen(self) -> bytes:
        with self.lock:
            return bytes(self.recorded)

    def stop(self):
        self.stopping.set()
        self.sock.close()
        self.thread.join(timeout=5)


class FleetOf:
    """Larder replicas on 127.0.0.N, sharing a peer port number, a secret and a member file."""

    def __init__(self, make_larder, workdir, name, *extra):
        self.make_larder = make_larder
        self.extra = extra
        self.name = name
        self.peer_port = free_port()
        self.secret = workdir / f"{name}.secret"
        self.secret.write_text(FLEET_SECRET + "\n")
        self.members = workdir / f"{name}.peers"
        self.nodes = []
        self.extra_for = lambda i: ()

    def peer(self, i) -> str:
        return f"127.0.0.{i + 1}:{self.peer_port}"

    def start(self, n, wait=True):
        # Replaced whole, as a mounted ConfigMap is: written in place, a replica's refresh could
        # read it between its truncation and its writing, and see no members for a moment.
        staged = self.members.with_suffix(".new")
        staged.write_text("\n".join(self.peer(i) for i in range(n)) + "\n")
        os.replace(staged, self.members)
        for i in range(len(self.nodes), n):
            self.nodes.append(self.make_larder(
                "--block-size", "64KiB", "--memory-capacity", "256MiB",
                "--fleet-listen", self.peer(i), "--fleet-peers-file", str(self.members),
                "--fleet-secret-file", str(self.secret), *self.extra, *self.extra_for(i),
                name=f"{self.name}-{i}", host=f"127.0.0.{i + 1}"))
        if wait:
            self.wait_members(self.nodes, n)

    @staticmethod
    def wait_members(nodes, n, timeout=40.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(len(fleet_state(node)["members"]) == n for node in nodes):
                return
            time.sleep(0.1)
        raise AssertionError(f"members never converged on {n}: {[fleet_state(x) for x in nodes]}")
