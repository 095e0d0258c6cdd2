"""TLS on both sides. The S3 listener (rustls): real clients verify Larder's certificate, and a
renewed certificate is served without a restart. The upstream: Larder reads, writes and lists
through an S3 server that speaks only HTTPS, with a certificate from a private CA it is told to
trust (`upstream_ca_file`), and refuses an upstream whose certificate it does not trust or that
names another host, as it must refuse anyone on the path who pretends to be S3. The upstream's
event queue (an SQS-compatible server behind the same private CA) is polled over HTTPS with the
same trust, and never from a server whose certificate Larder does not trust."""

import json
import os
import random
import re
import ssl
import subprocess
import time
import urllib.parse

import pytest
from botocore.exceptions import ClientError

from conftest import (binary, issue_certificate, make_ca, metric, s3_client, wait_until, ElasticMQ, LatencyProxy,
                      Minio, CLIENT_KEY, CLIENT_SECRET)
from test_limits import exchange


def make_cert(directory, name):
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-days", "2", "-subj", f"/CN={name}", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True, timeout=60)
    return cert, key


def served_cert(port):
    return ssl.get_server_certificate(("127.0.0.1", port), timeout=5)


def test_clients_read_over_tls_and_a_renewed_certificate_is_picked_up(make_larder, direct, bucket, tmp_path):
    direct.put_object(Bucket=bucket, Key="k", Body=b"over tls")
    first_cert, first_key = make_cert(tmp_path, "first")
    live_cert, live_key = tmp_path / "live.crt", tmp_path / "live.key"
    live_cert.write_bytes(first_cert.read_bytes())
    live_key.write_bytes(first_key.read_bytes())
    l = make_larder("--tls-cert", str(live_cert), "--tls-key", str(live_key))
    endpoint = f"https://127.0.0.1:{l.port}"
    client = s3_client(endpoint, CLIENT_KEY, CLIENT_SECRET)
    client._endpoint.http_session._verify = str(first_cert)  # trust exactly this certificate
    assert client.get_object(Bucket=bucket, Key="k")["Body"].read() == b"over tls"
    subprocess.run(["aws", "s3", "cp", f"s3://{bucket}/k", str(tmp_path / "out"), "--endpoint-url", endpoint,
                    "--ca-bundle", str(first_cert)], check=True, env=l.cli_env(), capture_output=True, timeout=60)
    assert (tmp_path / "out").read_bytes() == b"over tls"
    # Plain HTTP to the TLS port gets no HTTP answer: the connection is closed (after at most a
    # TLS alert), promptly, not held open.
    answer = exchange(l.port, f"GET /{bucket}/k HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    assert not answer.startswith(b"HTTP/") and b"over tls" not in answer, answer[:80]

    assert served_cert(l.port) == first_cert.read_text()
    second_cert, second_key = make_cert(tmp_path, "second")
    live_key.write_bytes(second_key.read_bytes())
    live_cert.write_bytes(second_cert.read_bytes())
    deadline = time.monotonic() + 20
    while served_cert(l.port) != second_cert.read_text():
        assert time.monotonic() < deadline, "the renewed certificate was not picked up"
        time.sleep(0.5)
    # A broken renewal keeps the last good certificate: once Larder has tried it (its log says
    # so, a line after those already there), the good one is still served.
    refusals = l.log_path.read_text().count("TLS certificate not reloaded")
    live_cert.write_text("garbage")
    wait_until(lambda: l.log_path.read_text().count("TLS certificate not reloaded") > refusals, 20,
               "the broken certificate was tried")
    assert served_cert(l.port) == second_cert.read_text()
    assert client.get_object(Bucket=bucket, Key="k")["Body"].read() == b"over tls"


def test_http2_streams_at_once_over_tls_get_every_byte(make_larder, direct, bucket, tmp_path):
    """HTTP/2 chosen by ALPN, its frames gathered above TLS: streams at once on one connection
    (curl multiplexes parallel transfers), cold then warm, byte for byte."""
    cert, key = make_cert(tmp_path, "h2")
    l = make_larder("--tls-cert", str(cert), "--tls-key", str(key))
    sizes = [2 * (8 << 20) + 5, 300_000, 1000, 0]
    bodies = {f"h2tls/{i}": random.Random(i).randbytes(size) for i, size in enumerate(sizes)}
    urls = []
    v4 = s3_client(f"https://127.0.0.1:{l.port}", CLIENT_KEY, CLIENT_SECRET, signature_version="s3v4")
    for k, body in bodies.items():
        direct.put_object(Bucket=bucket, Key=k, Body=body)
        urls.append(v4.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": k}, ExpiresIn=300))
    ids = []
    for phase in ("cold", "warm"):
        args = ["curl", "--http2", "--cacert", str(cert), "--parallel", "-sS", "--fail", "--max-time", "60",
                "-w", "%{http_version} %{http_code} %{num_connects} %header{x-amz-request-id}\\n"]
        outs = [tmp_path / f"{phase}-{i}" for i in range(len(urls))]
        for url, out in zip(urls, outs):
            args += ["-o", str(out), url]
        done = subprocess.run(args, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, (phase, done.returncode, done.stderr)
        answers = [line.split() for line in done.stdout.splitlines()]
        assert [a[:2] for a in answers] == [["2", "200"]] * len(urls), phase
        # One connection carried every stream.
        assert sum(int(a[2]) for a in answers) == 1, (phase, answers)
        # Each response its own request id, read back through HPACK (sent as a literal never
        # indexed) on the one connection.
        ids += [a[3] for a in answers]
        for out, body in zip(outs, bodies.values()):
            assert out.read_bytes() == body, phase
    assert len(set(ids)) == len(ids) == 2 * len(urls), ids
    assert all(re.fullmatch(r"[0-9A-F]{16}", i) for i in ids), ids


@pytest.fixture(scope="module")
def private_ca(tmp_path_factory):
    """A private CA and a server certificate it signed for 127.0.0.1 only (ECDSA P-256)."""
    d = tmp_path_factory.mktemp("private-ca")
    make_ca(d, "ca")
    issue_certificate(d, "ca", "server", "IP:127.0.0.1")
    return d


@pytest.fixture(scope="module")
def tls_minio(tmp_path_factory, private_ca):
    """A MinIO that speaks HTTPS only, with the private CA's certificate."""
    m = Minio(tmp_path_factory.mktemp("tls-minio"), name="minio-tls",
              tls=(private_ca / "server.crt", private_ca / "server.key", private_ca / "ca.crt"))
    yield m
    m.stop()


def tls_direct(minio, ca):
    client = s3_client(minio.endpoint)
    client._endpoint.http_session._verify = str(ca)
    return client


def test_an_upstream_behind_a_private_ca_is_read_written_and_listed_over_tls(tls_minio, private_ca, make_larder):
    ca = private_ca / "ca.crt"
    direct = tls_direct(tls_minio, ca)
    direct.create_bucket(Bucket="over-tls")
    # Three blocks, fetched over several TLS connections at once.
    big = random.Random(7).randbytes(20 * 1024 * 1024 + 123)
    direct.put_object(Bucket="over-tls", Key="big", Body=big)
    l = make_larder("--upstream-ca-file", str(ca), upstream_url=tls_minio.endpoint, name="larder-tls-upstream",
                    env={"SSL_CERT_FILE": None, "SSL_CERT_DIR": None})
    client = s3_client(l.endpoint, CLIENT_KEY, CLIENT_SECRET)

    def read(key, **kw):
        r = client.get_object(Bucket="over-tls", Key=key, **kw)
        return r["Body"].read(), r["ResponseMetadata"]["HTTPHeaders"]["x-cache"]

    assert read("big") == (big, "miss")
    # The last block lands in memory as its fetch ends, which may be just after the client has
    # its bytes: wait for it, then the whole object is a hit.
    wait_until(lambda: read("big", Range=f"bytes={len(big) - 1}-")[1] == "hit-memory", timeout=10,
               what="the last block in memory", interval=0.1)
    assert read("big") == (big, "hit-memory")
    assert read("big", Range="bytes=9000000-9999999") == (big[9000000:10000000], "hit-memory")
    # Written through Larder (passed through, re-signed over TLS), then read, headed, listed (a
    # client's listing passes through too) and deleted.
    small = os.urandom(300_000)
    client.put_object(Bucket="over-tls", Key="dir/small", Body=small)
    assert direct.get_object(Bucket="over-tls", Key="dir/small")["Body"].read() == small
    assert read("dir/small")[0] == small
    assert client.head_object(Bucket="over-tls", Key="dir/small")["ContentLength"] == len(small)
    listed = client.list_objects_v2(Bucket="over-tls", Prefix="dir/")
    assert [o["Key"] for o in listed["Contents"]] == ["dir/small"]
    client.delete_object(Bucket="over-tls", Key="dir/small")
    with pytest.raises(ClientError) as gone:
        client.get_object(Bucket="over-tls", Key="dir/small")
    assert gone.value.response["Error"]["Code"] == "NoSuchKey"
    # A warm-up lists its prefix with Larder's own client (the AWS SDK's), over TLS as well.
    warmed = {f"warm/{i}": os.urandom(1_000_000 + i) for i in range(2)}
    for key, data in warmed.items():
        direct.put_object(Bucket="over-tls", Key=key, Body=data)
    warm = subprocess.run([binary("larder"), "warm", "--admin", l.admin, "s3://over-tls/warm/"],
                          capture_output=True, text=True, timeout=120)
    assert warm.returncode == 0 and "0 errors" in warm.stderr, warm.stderr
    for key, data in warmed.items():
        assert read(key) == (data, "hit-memory")


def refused(call):
    """The S3 error `call` ends in: Larder must answer, and not with the upstream's bytes."""
    with pytest.raises(ClientError) as e:
        call()
    return e.value.response["ResponseMetadata"]["HTTPStatusCode"], e.value.response["Error"]["Code"]


def test_an_upstream_whose_certificate_larder_does_not_trust_or_that_names_another_host_is_refused(
        tls_minio, private_ca, make_larder):
    ca = private_ca / "ca.crt"
    direct = tls_direct(tls_minio, ca)
    direct.create_bucket(Bucket="impostor")
    direct.put_object(Bucket="impostor", Key="k", Body=b"only for a verified upstream")
    # Someone on the path answering for S3 with a certificate of their own: Larder was not told
    # to trust its CA (nor is it among the system's).
    # One attempt per request: a refused certificate is refused again on every retry.
    once = ("--upstream-max-attempts", "1")
    untrusted = make_larder(*once, upstream_url=tls_minio.endpoint, name="larder-untrusted-upstream",
                            env={"SSL_CERT_FILE": None, "SSL_CERT_DIR": None})
    # A certificate from a trusted CA for another host: this one names 127.0.0.1 only.
    misnamed = make_larder(*once, "--upstream-ca-file", str(ca), upstream_url=f"https://localhost:{tls_minio.port}",
                           name="larder-misnamed-upstream", env={"SSL_CERT_FILE": None, "SSL_CERT_DIR": None})
    for l in (untrusted, misnamed):
        client = s3_client(l.endpoint, CLIENT_KEY, CLIENT_SECRET)
        for _ in range(2):
            assert refused(lambda: client.get_object(Bucket="impostor", Key="k")) == (503, "ServiceUnavailable")
        assert refused(lambda: client.head_object(Bucket="impostor", Key="k"))[0] == 503
        assert refused(lambda: client.list_objects_v2(Bucket="impostor"))[0] == 503
        assert refused(lambda: client.put_object(Bucket="impostor", Key="w", Body=b"x"))[0] == 503
        log = l.log_path.read_text()
        assert "invalid peer certificate" in log, log[-2000:]
        assert ("UnknownIssuer" if l is untrusted else 'not valid for name "localhost"') in log, log[-2000:]
        # Counted as what they are, for an alert to name (the chart's LarderUpstreamTlsRefused):
        # each GET, HEAD, listing and write refused at the handshake, none as another fault.
        assert metric(l, "larder_upstream_requests_total", status="tls") >= 5
        assert metric(l, "larder_upstream_requests_total", status="transport") == 0
    # Nothing reached MinIO through either of them.
    with pytest.raises(ClientError):
        direct.head_object(Bucket="impostor", Key="w")


def test_an_upstream_whose_certificate_turns_untrusted_is_refused_and_what_is_cached_is_served_stale(
        private_ca, make_larder, direct, bucket, minio, workdir):
    # The upstream (the MinIO every test reads, over HTTPS through a proxy with the private CA's
    # certificate) is read once; then someone else answers at its address, with a certificate
    # of their own, in front of the same store.
    genuine = LatencyProxy(workdir, minio.port, tls=(private_ca / "server.crt", private_ca / "server.key"),
                           name="tls-front-genuine")
    impostor = None
    try:
        genuine.latency(delay_ms=0, jitter_ms=0, tail_fraction=0, tail_ms=0)
        data = os.urandom(300_000)
        direct.put_object(Bucket=bucket, Key="cached", Body=data)
        l = make_larder("--upstream-ca-file", str(private_ca / "ca.crt"), "--metadata-ttl", "1s",
                        "--serve-stale-on-error", "1h", "--upstream-max-attempts", "1",
                        upstream_url=genuine.tls_endpoint, name="larder-stale-over-tls",
                        env={"SSL_CERT_FILE": None, "SSL_CERT_DIR": None})
        client = s3_client(l.endpoint, CLIENT_KEY, CLIENT_SECRET)

        def read(key):
            r = client.get_object(Bucket=bucket, Key=key)
            return r["Body"].read(), r["ResponseMetadata"]["HTTPHeaders"]["x-cache"]

        assert read("cached") == (data, "miss")
        genuine.stop()
        impostor = LatencyProxy(workdir, minio.port, tls=make_cert(workdir, "impostor"), tls_port=genuine.tls_port,
                                name="tls-front-impostor")
        impostor.latency(delay_ms=0, jitter_ms=0, tail_fraction=0, tail_ms=0)
        direct.put_object(Bucket=bucket, Key="uncached", Body=b"only through a verified upstream")
        time.sleep(1.5)  # the cached object's metadata has expired: it must be revalidated
        # What was read from the genuine upstream is served stale, as `serve_stale_on_error`
        # allows; nothing is read through the impostor, though it fronts the same store.
        assert read("cached") == (data, "stale-hit-memory")
        assert refused(lambda: client.get_object(Bucket=bucket, Key="uncached")) == (503, "ServiceUnavailable")
        assert impostor.control("stats")["requests"] == 0, "no request got past the handshake"
        assert metric(l, "larder_upstream_requests_total", status="tls") >= 2
    finally:
        genuine.stop()  # again if the test got that far: a second stop does nothing
        if impostor:
            impostor.stop()


def s3_event(bucket, key, etag):
    """What S3 sends a queue when `key` is written."""
    return json.dumps({"Records": [{
        "eventVersion": "2.1", "eventSource": "aws:s3", "eventName": "ObjectCreated:Put",
        "eventTime": time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime()),
        "s3": {"bucket": {"name": bucket}, "object": {"key": key, "eTag": etag, "sequencer": "00"}}}]})


def test_events_are_polled_from_a_queue_behind_the_private_ca_and_never_from_an_untrusted_one(
        private_ca, make_larder, direct, bucket, workdir):
    # ElasticMQ speaks plain HTTP; the latency proxy (no delay) serves it over HTTPS with the
    # private CA's certificate for 127.0.0.1, as a queue of an on-premises store would be.
    sqs = ElasticMQ(workdir, ["tls-events"], name="elasticmq-tls")
    front = LatencyProxy(workdir, sqs.port, tls=(private_ca / "server.crt", private_ca / "server.key"),
                         name="sqs-tls-front")
    try:
        front.latency(delay_ms=0, jitter_ms=0, tail_fraction=0, tail_ms=0)
        plain_queue = sqs.queue_url("tls-events")
        queue = front.tls_endpoint + urllib.parse.urlsplit(plain_queue).path
        events = ("--metadata-ttl", "1h", "--events-sqs-queue-url", queue)
        no_system_store = {"SSL_CERT_FILE": None, "SSL_CERT_DIR": None}

        def depth():
            attrs = sqs.client.get_queue_attributes(QueueUrl=plain_queue, AttributeNames=[
                "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"])["Attributes"]
            return sum(int(v) for v in attrs.values())

        # Someone answering for the queue with a certificate Larder does not trust: nothing is
        # taken from it, and the message waits for a Larder that can verify the queue.
        untrusted = make_larder(*events, name="larder-untrusted-queue", env=no_system_store)
        etag = direct.put_object(Bucket=bucket, Key="k", Body=b"v1")["ETag"].strip('"')
        sqs.client.send_message(QueueUrl=plain_queue, MessageBody=s3_event(bucket, "k", etag))
        wait_until(lambda: "UnknownIssuer" in untrusted.log_path.read_text(), 30,
                   "the untrusted queue's certificate refused")
        assert "polling the S3 event queue failed" in untrusted.log_path.read_text()
        assert metric(untrusted, "larder_events_total") == 0
        assert metric(untrusted, "larder_events_stream_healthy") == 0
        assert depth() == 1, "the event was not taken from a queue Larder could not verify"

        # Told to trust the private CA, Larder polls the same queue: the waiting message is
        # received, applied and deleted over TLS, and the stream is healthy.
        trusted = make_larder("--upstream-ca-file", str(private_ca / "ca.crt"), *events,
                              name="larder-trusted-queue", env=no_system_store)
        wait_until(lambda: metric(trusted, "larder_events_stream_healthy") == 1, 30, "the first event received")
        wait_until(lambda: depth() == 0, 30, "the event deleted from the queue")
        client = s3_client(trusted.endpoint, CLIENT_KEY, CLIENT_SECRET)

        def read():
            return client.get_object(Bucket=bucket, Key="k")["Body"].read()

        assert read() == b"v1"
        # A write straight to the bucket: trusted for an hour until its event says otherwise.
        etag = direct.put_object(Bucket=bucket, Key="k", Body=b"v2")["ETag"].strip('"')
        assert read() == b"v1"
        sqs.client.send_message(QueueUrl=plain_queue, MessageBody=s3_event(bucket, "k", etag))
        wait_until(lambda: read() == b"v2", 5, "the write seen after its event")
        assert metric(trusted, "larder_events_total", outcome="applied") == 1
        assert metric(trusted, "larder_events_total") == 2
        assert metric(untrusted, "larder_events_total") == 0
    finally:
        front.stop()
        sqs.stop()
