"""What operators do to a running Larder, end to end: size its request threads, stop it while it
serves (a rolling update's SIGTERM), and let its upstream credentials expire and be renewed under it (temporary credentials
from a container credentials endpoint, as on ECS and EKS, issued by MinIO's own STS)."""

import datetime
import http.server
import json
import random
import re
import signal
import socket
import threading
import time

import boto3
import pytest
from counting_proxy import CountingProxy

from conftest import ACCESS_KEY, REGION, SECRET_KEY, wait_until

MiB = 1 << 20


@pytest.fixture
def slow(minio):
    p = CountingProxy("127.0.0.1", minio.port)
    yield p
    p.close()


def refuses_connections(port) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return False
    except OSError:
        return True


@pytest.mark.parametrize("workers", [1, 3])
def test_worker_threads_sets_how_many_threads_serve_requests(make_larder, direct, bucket, workers):
    # The count is what the started runtime reports (tokio's own metrics), not the setting echoed.
    direct.put_object(Bucket=bucket, Key=f"workers-{workers}", Body=b"w" * 1000)
    larder = make_larder("--worker-threads", str(workers), name=f"workers-{workers}")
    body = larder.client().get_object(Bucket=bucket, Key=f"workers-{workers}")["Body"].read()
    assert body == b"w" * 1000
    started = [l for l in larder.log_path.read_text().splitlines() if "request threads started" in l]
    assert len(started) == 1, started
    assert re.search(rf"worker_threads\W+{workers}\b", started[0]), started[0]


def test_sigterm_lets_responses_in_flight_finish_then_exits(make_larder, slow, direct, bucket):
    data = random.Random(41).randbytes(16 * MiB)
    direct.put_object(Bucket=bucket, Key="long.bin", Body=data)
    larder = make_larder("--block-size", "1MiB", "--read-window", "1", "--prefetch", "off",
                         upstream_url=f"http://127.0.0.1:{slow.port}", name="graceful")
    slow.delay = 0.15  # 16 block GETs one after another: a response that takes seconds
    response = larder.client(read_timeout=60).get_object(Bucket=bucket, Key="long.bin")
    first = response["Body"].read(MiB)  # the response is under way
    larder.proc.send_signal(signal.SIGTERM)
    # New connections are refused at once...
    wait_until(lambda: refuses_connections(larder.port), 5, "the listener closed")
    # ...while the response in flight is sent to its end, every byte right.
    rest = response["Body"].read()
    assert first + rest == data
    assert larder.proc.wait(timeout=30) == 0
    assert len(slow.seen("GET", f"/{bucket}/long.bin")) == 16
    assert "shutting down" in larder.log_path.read_text()


class CredentialsEndpoint:
    """A container credentials endpoint (what ECS and EKS Pod Identity run beside a task): each
    request gets fresh temporary credentials from MinIO's STS (AssumeRole), stated to expire
    `lifetime` seconds from now so that the client must come back for new ones."""

    def __init__(self, minio_endpoint, lifetime: float):
        self.sts = boto3.client("sts", endpoint_url=minio_endpoint, region_name=REGION,
                                aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY)
        self.lifetime = lifetime
        self.issued: list[str] = []
        endpoint = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                c = endpoint.sts.assume_role(RoleArn="arn:aws:iam::000000000000:role/larder",
                                             RoleSessionName="larder-e2e", DurationSeconds=900)["Credentials"]
                endpoint.issued.append(c["AccessKeyId"])
                expires = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=endpoint.lifetime)
                body = json.dumps({"AccessKeyId": c["AccessKeyId"], "SecretAccessKey": c["SecretAccessKey"],
                                   "Token": c["SessionToken"],
                                   "Expiration": expires.strftime("%Y-%m-%dT%H:%M:%SZ")}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/creds"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_upstream_credentials_that_expire_are_renewed_without_a_failed_read(make_larder, minio, direct, bucket, upstream):
    objects = {f"c/{i}": random.Random(50 + i).randbytes(1000 + i) for i in range(40)}
    for key, data in objects.items():
        direct.put_object(Bucket=bucket, Key=key, Body=data)
    creds = CredentialsEndpoint(minio.endpoint, lifetime=15)
    try:
        # No static keys: the SDK's default chain finds the container endpoint.
        larder = make_larder("--metadata-ttl", "1s", name="sts", env={
            "AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None, "AWS_CONTAINER_CREDENTIALS_FULL_URI": creds.url})
        client = larder.client()
        upstream.reset()
        started = time.monotonic()
        keys = list(objects)
        i = 0
        # Read (cold objects, so each read goes upstream) until two sets of credentials were used.
        while len({signer(h) for _, _, h in upstream.seen_with_headers(None, f"/{bucket}/c/")}) < 2:
            assert time.monotonic() - started < 60, f"credentials never renewed: issued {creds.issued}"
            key = keys[i % len(keys)]
            assert client.get_object(Bucket=bucket, Key=key)["Body"].read() == objects[key]
            i += 1
            time.sleep(0.25)
        signers = [signer(h) for _, _, h in upstream.seen_with_headers(None, f"/{bucket}/c/")]
        # Every upstream request was signed with credentials the endpoint issued, with their
        # session token, and the newer ones took over from the older: no read failed meanwhile.
        assert set(signers) <= set(creds.issued), (signers, creds.issued)
        assert all("x-amz-security-token" in h for _, _, h in upstream.seen_with_headers(None, f"/{bucket}/c/"))
        assert signers.index(signers[-1]) > 0
        print(f"\n{i} reads, {len(creds.issued)} credentials issued, renewed after {time.monotonic() - started:.1f}s")
    finally:
        creds.close()


def signer(headers: dict) -> str:
    """The access key a request was signed with."""
    return headers.get("authorization", "").split("Credential=", 1)[-1].split("/", 1)[0]
