"""Attack tests: each tries, as an attacker would, to get past a key's policy, to make Larder sign
something the client did not, or to make Larder serve wrong bytes, against Larder in front of
real MinIO. Each was seen failing on the tree before its fix (see docs/security.md)."""

import http.client
import json
import random
import re
import socket
import time
import urllib.parse

import pytest
from botocore.auth import S3SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from conftest import CLIENT_KEY as CLIENT_KEY_FOR_FORGERY
from conftest import CLIENT_SECRET, READER_KEY, READER_SECRET, REGION, wait_until
from test_auth import fetch
from test_headers_errors import error_of, raw


def exists(direct, bucket, key):
    try:
        direct.head_object(Bucket=bucket, Key=key)
        return True
    except ClientError:
        return False


def signed_with(client, operation, headers):
    """Make `client` add `headers` before signing `operation`, so the signature covers them."""
    def add(request, **_):
        for k, v in headers.items():
            request.headers[k] = v
    client.meta.events.register(f"before-sign.s3.{operation}", add)
    return client


@pytest.fixture
def logs_world(direct, bucket, make_larder, workdir):
    """A secret bucket, two `logs-*` buckets, and a Larder where READER_KEY may read and write
    `<bucket>-logs-*` only."""
    secret, logs_a, logs_b = f"{bucket}-secret", f"{bucket}-logs-a", f"{bucket}-logs-b"
    for b in (secret, logs_a, logs_b):
        direct.create_bucket(Bucket=b)
    direct.put_object(Bucket=secret, Key="payroll.csv", Body=b"salaries")
    direct.put_object(Bucket=logs_b, Key="src", Body=b"log line")
    config = workdir / f"{bucket}-policy.toml"
    config.write_text(
        f'[[auth_policies]]\naccess_key = "{READER_KEY}"\nbuckets = ["{bucket}-logs-*"]\naccess = "read-write"\n')
    larder = make_larder("--config", str(config), name="attacks")
    return larder, secret, logs_a, logs_b


def test_a_copy_source_spelled_to_name_another_bucket_is_refused(logs_world, direct):
    larder, secret, logs_a, logs_b = logs_world
    writer = larder.client(READER_KEY, READER_SECRET)
    # The plain copy is refused, and a copy within the policy works (the control).
    assert error_of(writer.copy_object, Bucket=logs_a, Key="loot", CopySource=f"{secret}/payroll.csv") \
        == (403, "AccessDenied")
    writer.copy_object(Bucket=logs_a, Key="copied", CopySource=f"{logs_b}/src")
    assert direct.get_object(Bucket=logs_a, Key="copied")["Body"].read() == b"log line"
    # Spellings whose text before the first '/' is an allowed bucket, but which MinIO (or any
    # URL parser) reads as the secret bucket: a PutObject carrying them, signed.
    for i, source in enumerate([
        f"{logs_a}:///{secret}/payroll.csv",
        f"{logs_a}%2F..%2F{secret}/payroll.csv",
        f"{logs_a}/../{secret}/payroll.csv",
    ]):
        client = signed_with(larder.client(READER_KEY, READER_SECRET), "PutObject",
                             {"x-amz-copy-source": source})
        status, code = error_of(client.put_object, Bucket=logs_a, Key=f"loot{i}", Body=b"")
        assert (status, code) == (400, "InvalidArgument"), source
        assert not exists(direct, logs_a, f"loot{i}"), source
    # UploadPartCopy, the same way.
    upload = writer.create_multipart_upload(Bucket=logs_a, Key="parts")["UploadId"]
    client = signed_with(larder.client(READER_KEY, READER_SECRET), "UploadPart",
                         {"x-amz-copy-source": f"{logs_a}:///{secret}/payroll.csv"})
    assert error_of(client.upload_part, Bucket=logs_a, Key="parts", UploadId=upload, PartNumber=1, Body=b"") \
        == (400, "InvalidArgument")
    writer.abort_multipart_upload(Bucket=logs_a, Key="parts", UploadId=upload)
    # A copy-source header that is not ASCII is refused (its signature cannot even be checked),
    # not waved through unchecked.
    status, _, body = raw(larder, "PUT", f"/{logs_a}/loot9", {"x-amz-copy-source": "é/" + secret},
                          key=READER_KEY, secret=READER_SECRET)
    assert status in (400, 403), body
    assert not exists(direct, logs_a, "loot9")


def test_headers_the_client_did_not_sign_are_refused_not_signed_upstream(logs_world, direct, upstream):
    larder, secret, logs_a, logs_b = logs_world
    v4 = larder.client(READER_KEY, READER_SECRET, signature_version="s3v4")
    # A presigned PUT signs only `host`: added x-amz-* headers must not ride on Larder's signature.
    for i, extra in enumerate([
        {"x-amz-copy-source": f"{logs_b}/src"},
        {"x-amz-acl": "public-read"},
        {"x-amz-tagging": "a=b"},
        {"x-amz-server-side-encryption-customer-algorithm": "AES256"},
        {"x-amz-object-lock-mode": "GOVERNANCE"},
    ]):
        url = v4.generate_presigned_url("put_object", Params={"Bucket": logs_a, "Key": f"pre{i}"}, ExpiresIn=300)
        status, body = fetch(url, "PUT", extra, b"")
        assert status == 403 and b"AccessDenied" in body and b"not signed" in body, (extra, body)
        assert not exists(direct, logs_a, f"pre{i}")
    # The same URL without the extra header works (the control), and a header S3 takes unsigned
    # (Content-Type) reaches the upstream.
    url = v4.generate_presigned_url("put_object", Params={"Bucket": logs_a, "Key": "pre-ok"}, ExpiresIn=300)
    assert fetch(url, "PUT", {"Content-Type": "text/csv"}, b"ok")[0] == 200
    assert direct.head_object(Bucket=logs_a, Key="pre-ok")["ContentType"] == "text/csv"
    # Header auth: an x-amz-* header added after signing.
    client = larder.client(READER_KEY, READER_SECRET)

    def late(request, **_):
        request.headers["x-amz-acl"] = "public-read"
    client.meta.events.register("before-send.s3.PutObject", late)
    assert error_of(client.put_object, Bucket=logs_a, Key="late", Body=b"x") == (403, "AccessDenied")
    assert not exists(direct, logs_a, "late")
    # A header nobody signed and S3 does not define never reaches the upstream.
    upstream.reset()
    url = v4.generate_presigned_url("put_object", Params={"Bucket": logs_a, "Key": "plain"}, ExpiresIn=300)
    assert fetch(url, "PUT", {"X-Forwarded-For": "10.0.0.1", "Cookie": "a=b"}, b"p")[0] == 200
    sent = [h for m, p, h in upstream.seen_with_headers("PUT", f"/{logs_a}/plain")]
    assert sent and "x-forwarded-for" not in sent[0] and "cookie" not in sent[0], sent


def test_sigv2_presigned_urls_sign_what_is_routed(logs_world, direct):
    larder, secret, logs_a, logs_b = logs_world
    v2 = larder.client(READER_KEY, READER_SECRET, signature_version="s3")
    url = v2.generate_presigned_url("get_object", Params={"Bucket": logs_b, "Key": "src"}, ExpiresIn=300)
    assert "Signature=" in url and "X-Amz" not in url
    assert fetch(url) == (200, b"log line")
    # A sub-resource SigV2 does not sign is refused rather than re-signed upstream by Larder.
    for extra in ("retention", "legal-hold", "attributes"):
        status, body = fetch(f"{url}&{extra}")
        assert status == 403 and b"AccessDenied" in body, extra
    # Non-ASCII x-amz-* headers cannot be in the string to sign: refused, not skipped.
    put = v2.generate_presigned_url("put_object", Params={"Bucket": logs_a, "Key": "v2put"}, ExpiresIn=300)
    conn = http.client.HTTPConnection("127.0.0.1", larder.port, timeout=10)
    conn.putrequest("PUT", put.split(f"127.0.0.1:{larder.port}", 1)[1])
    conn.putheader("x-amz-meta-a", "é".encode("latin-1"))
    conn.putheader("Content-Length", "1")
    conn.endheaders(b"x")
    r = conn.getresponse()
    assert r.status == 403, r.read()
    conn.close()
    assert not exists(direct, logs_a, "v2put")
    # At most 7 days, like SigV4.
    long = v2.generate_presigned_url("get_object", Params={"Bucket": logs_b, "Key": "src"}, ExpiresIn=8 * 24 * 3600)
    status, body = fetch(long)
    assert status == 403 and b"7 days" in body
    # An expiry past what a clock can hold, with a known key id and no valid signature, is
    # refused the same way: it used to panic the request, dropping the connection unanswered
    # (found by the `auth` fuzz target).
    for huge in ("18446744073709551615", "000018446744073709551615"):
        status, body = fetch(re.sub(r"Expires=\d+", f"Expires={huge}", url))
        assert status == 403 and b"7 days" in body, (huge, status, body)
    assert fetch(url) == (200, b"log line")
    # The bucket signed is the bucket routed: a target naming another host than Host is refused.
    path = url.split(f"127.0.0.1:{larder.port}", 1)[1]
    conn = http.client.HTTPConnection("127.0.0.1", larder.port, timeout=10)
    conn.putrequest("GET", f"http://{secret}.s3.larder.test{path}", skip_host=True)
    conn.putheader("Host", f"127.0.0.1:{larder.port}")
    conn.endheaders()
    r = conn.getresponse()
    assert r.status == 400 and b"salaries" not in r.read()
    conn.close()


def test_read_write_keys_cannot_administer_buckets(logs_world, direct, make_larder, workdir):
    larder, secret, logs_a, logs_b = logs_world
    writer = larder.client(READER_KEY, READER_SECRET)
    policy = ('{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"AWS":["*"]},'
              f'"Action":["s3:GetObject"],"Resource":["arn:aws:s3:::{logs_a}/*"]}}]}}')
    assert error_of(writer.put_bucket_policy, Bucket=logs_a, Policy=policy) == (403, "AccessDenied")
    assert error_of(writer.delete_bucket, Bucket=logs_b) == (403, "AccessDenied")
    assert error_of(writer.put_object_acl, Bucket=logs_b, Key="src", ACL="public-read") == (403, "AccessDenied")
    assert error_of(writer.put_object, Bucket=logs_a, Key="pub", Body=b"x", ACL="public-read") == (403, "AccessDenied")
    assert direct.head_bucket(Bucket=logs_b)
    # Object writes stay allowed, DeleteObjects included.
    writer.put_object(Bucket=logs_a, Key="w", Body=b"w")
    writer.delete_objects(Bucket=logs_a, Delete={"Objects": [{"Key": "w"}]})
    assert not exists(direct, logs_a, "w")
    # An admin key may.
    config = workdir / "admin-policy.toml"
    config.write_text(f'[[auth_policies]]\naccess_key = "{READER_KEY}"\nbuckets = ["{logs_a}"]\naccess = "admin"\n')
    admin = make_larder("--config", str(config), name="admin-key").client(READER_KEY, READER_SECRET)
    admin.put_bucket_policy(Bucket=logs_a, Policy=policy)
    assert direct.get_bucket_policy(Bucket=logs_a)["Policy"]


def test_a_changed_block_size_never_serves_another_geometrys_bytes(make_larder, direct, bucket, workdir):
    size = 32 << 20
    data = random.Random(17).randbytes(size)
    direct.put_object(Bucket=bucket, Key="big", Body=data)
    disk = workdir / f"{bucket}.cache"
    common = ("--disk-path", str(disk), "--disk-capacity", "256MiB", "--disk-region-size", "16MiB")
    # Small ranges are cached as parts of blocks (`cold_ranges = "exact"`): 100 bytes at 5 into
    # block 1 are other bytes under each geometry, so these collide unless the geometry is keyed.
    # Read backwards, so that no read-ahead brings whole blocks in under them.
    starts = (size - 100, (8 << 20) + 5, (4 << 20) + 5, 4 << 20)

    def read_ranges(c, label):
        for start in starts:
            end = min(start + 99, size - 1)
            got = c.get_object(Bucket=bucket, Key="big", Range=f"bytes={start}-{end}")["Body"].read()
            assert got == data[start:end + 1], (label, start)

    for first, second in (("8MiB", "4MiB"), ("4MiB", "8MiB")):
        l = make_larder(*common, "--block-size", first, name=f"geometry-{first}")
        read_ranges(l.client(), first)
        assert l.client().get_object(Bucket=bucket, Key="big")["Body"].read() == data
        l.stop()
        l = make_larder(*common, "--block-size", second, name=f"geometry-{second}")
        c = l.client()
        read_ranges(c, (first, second))
        assert c.get_object(Bucket=bucket, Key="big")["Body"].read() == data
        assert l.proc.poll() is None, "larder died"
        l.stop()
        disk.unlink()


def test_admin_routes_that_act_or_reveal_need_the_token(make_larder, direct, bucket, workdir):
    direct.put_object(Bucket=bucket, Key="w", Body=b"warm me")
    token = workdir / "admin.token"
    token.write_text("an-admin-token-of-some-length\n")
    l = make_larder("--admin-token-file", str(token), name="admin-token")
    body = f'{{"bucket": "{bucket}", "prefix": ""}}'.encode()
    for auth in (None, "Bearer wrong-token-wrong-token", "Basic YTpi"):
        headers = {"Content-Type": "application/json", **({"Authorization": auth} if auth else {})}
        assert fetch(f"{l.admin}/warm", "POST", headers, body)[0] == 401, auth
        assert fetch(f"{l.admin}/warm", "GET", headers)[0] == 401, auth
        assert fetch(f"{l.admin}/warm/1", "DELETE", headers)[0] == 401, auth
        assert fetch(f"{l.admin}/fleet", "GET", headers)[0] == 401, auth
        # The log filter: debug lines can carry keys and addresses, and cost CPU per request.
        assert fetch(f"{l.admin}/log", "GET", headers)[0] == 401, auth
        assert fetch(f"{l.admin}/log", "PUT", headers, b"trace")[0] == 401, auth
        assert fetch(f"{l.admin}/log", "DELETE", headers)[0] == 401, auth
        # The access profile: it lists the keys and ranges every client read.
        assert fetch(f"{l.admin}/profile", "GET", headers)[0] == 401, auth
        assert fetch(f"{l.admin}/profile", "PUT", headers)[0] == 401, auth
        assert fetch(f"{l.admin}/profile", "DELETE", headers)[0] == 401, auth
    ok = {"Content-Type": "application/json", "Authorization": "Bearer an-admin-token-of-some-length"}
    status, answer = fetch(f"{l.admin}/log", "GET", ok)
    assert status == 200 and json.loads(answer)["filter"] == "info", answer
    assert "log filter changed" not in l.log_path.read_text()
    status, answer = fetch(f"{l.admin}/profile", "GET", ok)
    assert status == 200 and json.loads(answer)["started"] is None, answer
    assert fetch(f"{l.admin}/warm", "POST", ok, body)[0] == 202
    # Health, metrics and the status page stay open.
    for path in ("/healthz", "/readyz", "/metrics", "/status.json", "/"):
        assert fetch(f"{l.admin}{path}")[0] == 200, path
    # The CLI presents the token.
    import subprocess
    from conftest import binary
    r = subprocess.run([binary("larder"), "warm", "--admin", l.admin, "--admin-token-file", str(token),
                        f"s3://{bucket}/w", "--exact"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([binary("larder"), "warm", "--admin", l.admin, f"s3://{bucket}/w", "--exact"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "401" in r.stderr, r.stderr


def _h2c_idle(port):
    """An HTTP/2 (h2c prior knowledge) connection that sends its preface and settings, then
    nothing."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
    return s


def _closed_within(s, seconds):
    """Whether the server closes `s` within `seconds` (reading and discarding its frames)."""
    s.settimeout(0.5)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if s.recv(65536) == b"":
                return True
        except socket.timeout:
            continue
        except OSError:
            return True
    return False


def test_idle_http2_connections_cannot_hold_every_slot(make_larder, direct, bucket):
    direct.put_object(Bucket=bucket, Key="k", Body=b"still served")
    l = make_larder("--max-connections", "8", "--client-header-timeout", "2s", "--client-idle-timeout", "3s",
                    name="h2-idle")
    idle = [_h2c_idle(l.port) for _ in range(8)]
    # Every slot is held; a client is served once the idle ones are closed (no first request).
    started = time.monotonic()
    c = l.client(connect_timeout=30, read_timeout=30)
    assert c.get_object(Bucket=bucket, Key="k")["Body"].read() == b"still served"
    assert time.monotonic() - started < 15
    assert all(_closed_within(s, 10) for s in idle)
    # A keep-alive HTTP/1.1 connection that asked once and then idles is closed too.
    conn = http.client.HTTPConnection("127.0.0.1", l.port, timeout=30)
    conn.request("GET", "/healthz-not-a-bucket")
    conn.getresponse().read()
    assert _closed_within(conn.sock, 10)


def test_fidelity_gaps_answer_as_s3_does(larder, direct, bucket, upstream):
    # Keys made only of special characters reach the upstream intact.
    for key in (" ", "_ ", "  a  ", "%", "+"):
        direct.put_object(Bucket=bucket, Key=key, Body=key.encode() * 3)
        got = larder.client().get_object(Bucket=bucket, Key=key)
        assert got["Body"].read() == key.encode() * 3, repr(key)
    # The lifecycle expiry S3 and MinIO send with GET and HEAD comes through Larder too.
    direct.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration={"Rules": [
        {"ID": "expire", "Status": "Enabled", "Filter": {"Prefix": ""}, "Expiration": {"Days": 3}}]})
    direct.put_object(Bucket=bucket, Key="expiring", Body=b"soon")
    want = direct.head_object(Bucket=bucket, Key="expiring")["ResponseMetadata"]["HTTPHeaders"].get("x-amz-expiration")
    assert want, "MinIO sends x-amz-expiration under a lifecycle rule"
    for call in (larder.client().get_object, larder.client().head_object):
        got = call(Bucket=bucket, Key="expiring")["ResponseMetadata"]["HTTPHeaders"].get("x-amz-expiration")
        assert got == want, (call, got, want)
    # A presigned URL valid for 0 seconds: 403, as S3 answers.
    v4 = larder.client(signature_version="s3v4")
    url = v4.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": " "}, ExpiresIn=0)
    status, body = fetch(url)
    assert status == 403 and b"AccessDenied" in body
    # A read that declares SSE-KMS is refused (400), as S3 refuses it.
    status, _, body = raw(larder, "GET", f"/{bucket}/_%20", {"x-amz-server-side-encryption": "aws:kms"})
    assert status == 400 and b"InvalidArgument" in body
    # Headers S3 checks against the bucket or caller go to the upstream, not answered from cache.
    larder.client().get_object(Bucket=bucket, Key="+")["Body"].read()
    upstream.reset()
    larder.client().get_object(Bucket=bucket, Key="+", ExpectedBucketOwner="123456789012")["Body"].read()
    seen = upstream.seen_with_headers("GET", f"/{bucket}/")
    assert seen and seen[0][2].get("x-amz-expected-bucket-owner") == "123456789012", seen


def test_a_deleted_bucket_answers_no_such_bucket_at_once(larder, direct, bucket):
    c = larder.client()
    c.put_object(Bucket=bucket, Key="k", Body=b"here")
    assert c.get_object(Bucket=bucket, Key="k")["Body"].read() == b"here"
    c.delete_object(Bucket=bucket, Key="k")
    c.delete_bucket(Bucket=bucket)
    assert error_of(c.get_object, Bucket=bucket, Key="k") == (404, "NoSuchBucket")
    assert error_of(c.head_object, Bucket=bucket, Key="k")[0] == 404


def test_cached_listings_and_404s_are_authorised_like_any_request(direct, bucket, make_larder, workdir):
    secret, logs = f"{bucket}-secret", f"{bucket}-logs"
    for b in (secret, logs):
        direct.create_bucket(Bucket=b)
    direct.put_object(Bucket=secret, Key="payroll.csv", Body=b"salaries")
    config = workdir / f"{bucket}-cached-policy.toml"
    config.write_text(
        f'[[auth_policies]]\naccess_key = "{READER_KEY}"\nbuckets = ["{logs}"]\naccess = "read-only"\n')
    larder = make_larder("--config", str(config), "--list-ttl", "1h", "--negative-ttl", "1h", name="cached-authz")
    owner, reader = larder.client(), larder.client(READER_KEY, READER_SECRET)
    # The owner's requests fill the caches: the secret bucket's listing and a 404 in it.
    for _ in range(2):
        assert [o["Key"] for o in owner.list_objects_v2(Bucket=secret)["Contents"]] == ["payroll.csv"]
        with pytest.raises(ClientError) as missing:
            owner.get_object(Bucket=secret, Key="plans.txt")
        assert missing.value.response["Error"]["Code"] == "NoSuchKey"
    cached = larder.client().list_objects_v2(Bucket=secret)
    assert cached["ResponseMetadata"]["HTTPHeaders"]["x-cache"] == "hit-memory"
    # A key without rights to the bucket gets neither: not the listing, not even that a key is missing.
    for call in (lambda: reader.list_objects_v2(Bucket=secret), lambda: reader.list_objects(Bucket=secret),
                 lambda: reader.get_object(Bucket=secret, Key="plans.txt"),
                 lambda: reader.head_object(Bucket=secret, Key="plans.txt")):
        with pytest.raises(ClientError) as refused:
            call()
        assert refused.value.response["Error"]["Code"] in ("AccessDenied", "403"), refused.value.response
    # Nor does a request signed with a wrong secret.
    forger = larder.client(CLIENT_KEY_FOR_FORGERY, "not-the-secret-0123456789")
    with pytest.raises(ClientError) as refused:
        forger.list_objects_v2(Bucket=secret)
    assert refused.value.response["Error"]["Code"] in ("SignatureDoesNotMatch", "InvalidAccessKeyId")


def test_a_fleet_member_without_the_secret_is_never_trusted(make_larder, workdir, direct, bucket):
    from conftest import free_port
    from fake_peer import FakePeer
    from test_fleet import fleet_state, metric
    block = 64 * 1024
    port = free_port()
    # The impostor answers on the peer port of 127.0.0.2: listed as a member, as a spoofed DNS
    # answer or an edited member file would list it.
    fake = FakePeer("127.0.0.2", port, block)
    try:
        secret = workdir / "impostor.secret"
        secret.write_text("fleet-e2e-shared-secret-0123456789\n")
        members = workdir / "impostor.peers"
        members.write_text(f"127.0.0.1:{port}\n127.0.0.2:{port}\n")
        l = make_larder("--block-size", "64KiB", "--fleet-listen", f"127.0.0.1:{port}",
                        "--fleet-peers-file", str(members), "--fleet-secret-file", str(secret),
                        "--fleet-refresh", "300ms", name="impostor-fleet")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not fake.requests:
            time.sleep(0.1)
        assert fake.requests, "the impostor was probed"
        time.sleep(1.0)
        # Not admitted: its /v1/info is not sealed with the secret.
        assert len(fleet_state(l)["members"]) == 1, fleet_state(l)
        # Every byte served is the object's, whichever blocks the impostor would have owned.
        data = random.Random(5).randbytes(40 * block + 123)
        direct.put_object(Bucket=bucket, Key="o", Body=data)
        c = l.client()
        assert c.get_object(Bucket=bucket, Key="o")["Body"].read() == data
        for start in (0, 7 * block, 33 * block + 9):
            got = c.get_object(Bucket=bucket, Key="o", Range=f"bytes={start}-{start + block}")["Body"].read()
            assert got == data[start:start + block + 1], start
        assert metric(l, "larder_peer_bytes_total", direction="received") == 0
    finally:
        fake.close()


def _post_form(url, fields, file_name, data, content_type="application/octet-stream", extra_parts=b""):
    """POST a form as a browser does: the fields, then the file, last."""
    import urllib3
    body, ctype = urllib3.encode_multipart_formdata(
        list(fields.items()) + [("file", (file_name, data, content_type))])
    if extra_parts:
        boundary = ctype.split("boundary=")[1]
        closing = f"--{boundary}--\r\n".encode()
        body = body[: -len(closing)] + extra_parts.replace(b"BOUNDARY", boundary.encode()) + closing
    return fetch(url, "POST", {"Content-Type": ctype}, body)


@pytest.mark.parametrize("signature_version", ["s3v4", "s3"])
def test_browser_form_uploads_are_verified_then_re_signed(logs_world, direct, signature_version):
    larder, secret, logs_a, logs_b = logs_world
    writer = larder.client(READER_KEY, READER_SECRET, signature_version=signature_version)
    post = writer.generate_presigned_post(
        logs_a, "uploads/${filename}",
        Fields={"Content-Type": "text/csv"},
        Conditions=[["starts-with", "$key", "uploads/"], ["content-length-range", 1, 1024],
                    {"Content-Type": "text/csv"}],
        ExpiresIn=300)
    status, body = _post_form(post["url"], post["fields"], "report.csv", b"a,b\n1,2\n")
    assert status == 204, body
    got = direct.get_object(Bucket=logs_a, Key="uploads/report.csv")
    assert got["Body"].read() == b"a,b\n1,2\n" and got["ContentType"] == "text/csv"
    # What the policy does not allow is refused, and nothing is stored.
    fields = dict(post["fields"])
    cases = [
        ({**fields, "key": "elsewhere/x.csv"}, "x.csv", b"x", 403),               # key outside the prefix
        ({**fields, "Content-Type": "text/html"}, "x.csv", b"x", 403),             # a field changed
        ({**fields, "x-amz-meta-extra": "1"}, "x.csv", b"x", 403),                 # a field not covered
        (fields, "big.csv", b"x" * 2048, 400),                                      # over content-length-range
        ({**fields, "policy": fields["policy"][:-4] + "AAA="}, "x.csv", b"x", 403),  # tampered policy
    ]
    for form, name, data, want in cases:
        status, body = _post_form(post["url"], form, name, data)
        assert status == want, (form.keys(), body)
    listed = direct.list_objects_v2(Bucket=logs_a, Prefix="")
    assert [o["Key"] for o in listed.get("Contents", [])] == ["uploads/report.csv"], listed
    # The same policy posted to another bucket: its bucket condition fails.
    status, _ = _post_form(post["url"].replace(logs_a, logs_b), fields, "y.csv", b"y")
    assert status == 403
    # A policy the client key signs for a bucket its own policy excludes: refused by Larder.
    bad = writer.generate_presigned_post(secret, "loot.csv", ExpiresIn=300)
    status, body = _post_form(bad["url"], bad["fields"], "loot.csv", b"loot")
    assert status == 403 and b"AccessDenied" in body
    assert not exists(direct, secret, "loot.csv")
    # A part after the file (which S3 ignores) is refused rather than sent as part of the file.
    extra = b"\r\n--BOUNDARY\r\nContent-Disposition: form-data; name=\"x-ignore-me\"\r\n\r\nsmuggled"
    status, _ = _post_form(post["url"], fields, "smuggle.csv", b"data", extra_parts=extra)
    assert status >= 400
    assert not exists(direct, logs_a, "uploads/smuggle.csv")
    # An expired policy.
    old = writer.generate_presigned_post(logs_a, "uploads/${filename}", ExpiresIn=1)
    time.sleep(2.1)
    status, body = _post_form(old["url"], old["fields"], "late.csv", b"late")
    assert status == 403 and b"expired" in body


def test_a_signing_key_kept_for_one_access_key_never_verifies_another(larder, direct, bucket):
    """Larder keeps each key's derived SigV4 signing key for the day. The holder of one key signs
    with their own secret but names another key's id: had the kept keys been shared between access
    keys (found by date and region alone), the first key's kept signing key would verify it, and
    the write would land with the other key's authority."""
    direct.put_object(Bucket=bucket, Key="k", Body=b"v")
    reader = larder.client(READER_KEY, READER_SECRET)
    writer = larder.client()
    # The reader signs legitimately first, so its signing key is kept for today.
    assert reader.get_object(Bucket=bucket, Key="k")["Body"].read() == b"v"
    forger = larder.client(CLIENT_KEY_FOR_FORGERY, READER_SECRET)
    assert error_of(forger.put_object, Bucket=bucket, Key="forged", Body=b"x") == (403, "SignatureDoesNotMatch")
    presigner = larder.client(CLIENT_KEY_FOR_FORGERY, READER_SECRET, signature_version="s3v4")
    url = presigner.generate_presigned_url("put_object", Params={"Bucket": bucket, "Key": "forged"}, ExpiresIn=60)
    assert fetch(url, method="PUT", data=b"x")[0] == 403
    assert not exists(direct, bucket, "forged")
    # And both keys still verify as themselves, each with its own kept key.
    writer.put_object(Bucket=bucket, Key="real", Body=b"w")
    assert reader.get_object(Bucket=bucket, Key="real")["Body"].read() == b"w"


def test_a_version_id_cannot_smuggle_parameters_upstream(larder, direct, bucket, upstream):
    """A version id is one query value: spelled to end itself and add a parameter (a second
    `versionId` naming another version), it reaches the upstream escaped, as the one value the
    client signed, and gets the upstream's refusal, not either version's bytes. (Larder's
    object GETs build their query themselves: docs/security.md.)"""
    direct.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    id1 = direct.put_object(Bucket=bucket, Key="doc", Body=b"version one")["VersionId"]
    id2 = direct.put_object(Bucket=bucket, Key="doc", Body=b"version two")["VersionId"]
    upstream.reset()
    smuggled = f"{id1}&versionId={id2}"
    for read in (lambda c: c.get_object(Bucket=bucket, Key="doc", VersionId=smuggled)["Body"].read(),
                 lambda c: c.head_object(Bucket=bucket, Key="doc", VersionId=smuggled)):
        with pytest.raises(ClientError) as mine:
            got = read(larder.client())
            pytest.fail(f"answered {got!r}")
        with pytest.raises(ClientError) as theirs:
            read(direct)
        assert mine.value.response["Error"]["Code"] == theirs.value.response["Error"]["Code"]
    sent = upstream.seen(None, f"/{bucket}/doc")
    escaped = "versionId=" + urllib.parse.quote(smuggled, safe="-._~")
    assert sent and all(p.count("versionId=") == 1 and escaped in p for _, p, _ in sent), sent


def test_a_part_number_the_cache_acts_on_is_the_one_the_upstream_read(larder, direct, bucket):
    """A `partNumber` read is answered from the cache by where the upstream said that part lies,
    learnt from its answer to a read passed through. A query naming the part twice passes
    through as signed and is never learnt: whichever of the two the upstream read, Larder would
    have filed its answer under one of them, and later reads of the other part would get these
    bytes. Nor is a part number in any spelling but plain digits (`02`)."""
    from test_reads import MiB, multipart, payload
    parts = [payload(5 * MiB, 51), payload(5 * MiB, 52), payload(MiB, 53)]
    multipart(direct, bucket, "mp", parts)
    via = larder.client()
    for query in ("partNumber=1&partNumber=2", "partNumber=2&partNumber=1", "partNumber=02"):
        # The upstream's answer, whatever it is (MinIO reads the first of two, and refuses the
        # signature of `2&1`: it keeps their order where SigV4 sorts them).
        status, headers, _ = raw(larder, "GET", f"/{bucket}/mp?{query}")
        for _ in range(2):
            for n in (1, 2):
                got = via.get_object(Bucket=bucket, Key="mp", PartNumber=n)["Body"].read()
                assert got == parts[n - 1], (query, n)
        assert raw(larder, "GET", f"/{bucket}/mp?{query}")[1]["x-cache"] == "pass", (query, status, headers)


def _signed_names(headers: dict) -> list[str]:
    """The headers an upstream request's SigV4 `Authorization` says it signed."""
    auth = headers.get("authorization", "")
    match = re.search(r"SignedHeaders=([^,]+)", auth)
    return match.group(1).split(";") if match else []


def test_who_pays_is_what_larder_says_and_a_read_that_pays_is_cached_only_where_larder_pays(
        larder, make_larder, direct, bucket, upstream):
    """`x-amz-request-payer` (Requester Pays buckets) is something S3 checks against the caller.
    A Larder that does not say it pays passes every read that says so through, as signed. A
    Larder started with `--upstream-requester-pays` says it pays on every request of its own
    (block GETs, HEADs, warm-up's listings), signed; reads that say they pay as it does
    (`requester`, in the header or a presigned URL) are then cached like any other, and any
    other declaration is still S3's to read."""
    data = random.Random(61).randbytes(3000)
    direct.put_object(Bucket=bucket, Key="rp", Body=data)
    direct.put_object(Bucket=bucket, Key="warm/one", Body=b"w" * 10)
    path = f"/{bucket}/rp"

    def got(client, **kw):
        r = client.get_object(Bucket=bucket, Key="rp", **kw)
        assert r["Body"].read() == data
        return r["ResponseMetadata"]["HTTPHeaders"]["x-cache"]

    # A Larder that does not pay: the client's word reaches S3 on each read, nothing cached.
    upstream.reset()
    plain = larder.client()
    assert [got(plain, RequestPayer="requester") for _ in range(2)] == ["pass", "pass"]
    seen = upstream.seen_with_headers("GET", path)
    assert len(seen) == 2 and all(h.get("x-amz-request-payer") == "requester" for _, _, h in seen), seen

    # A Larder that pays.
    paying = make_larder("--upstream-requester-pays", name="requester-pays")
    via = paying.client()
    upstream.reset()
    assert got(via, RequestPayer="requester") == "miss"
    fetched = upstream.seen_with_headers(None, path)
    assert fetched, "the miss reached the upstream"
    for method, _, h in fetched:
        assert h.get("x-amz-request-payer") == "requester", (method, h)
        assert "x-amz-request-payer" in _signed_names(h), (method, h)
    # From the cache from now on: whether the read says it pays, says nothing, or is a
    # presigned URL that says it, and for HEAD too.
    assert got(via, RequestPayer="requester") == "hit-memory"
    assert got(via) == "hit-memory"
    head = via.head_object(Bucket=bucket, Key="rp", RequestPayer="requester")
    assert head["ResponseMetadata"]["HTTPHeaders"]["x-cache"] == "hit-memory"
    # boto3 presigns the header (signed, to be sent with the URL); other SDKs put it in the
    # query, which is presigned here by botocore's signer.
    v4 = paying.client(signature_version="s3v4")
    url = v4.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "rp", "RequestPayer": "requester"})
    assert fetch(url, headers={"x-amz-request-payer": "requester"}) == (200, data)
    request = AWSRequest(method="GET", url=f"http://127.0.0.1:{paying.port}{path}?x-amz-request-payer=requester")
    S3SigV4QueryAuth(Credentials(CLIENT_KEY_FOR_FORGERY, CLIENT_SECRET), "s3", REGION, expires=300).add_auth(request)
    assert "x-amz-request-payer=requester" in request.url
    assert fetch(request.url) == (200, data)
    assert len(upstream.seen(None, path)) == len(fetched), upstream.seen(None, path)
    # Any other value, or the header twice, passes through as the client signed it.
    upstream.reset()
    assert got(via, RequestPayer="Requester") == "pass"
    status, headers, body = raw(paying, "GET", path, {"x-amz-request-payer": "bucket-owner"})
    assert (status, headers["x-cache"], body) == (200, "pass", data)
    said = [h.get("x-amz-request-payer") for _, _, h in upstream.seen_with_headers("GET", path)]
    assert said == ["Requester", "bucket-owner"], said
    # Warm-up's listing says it pays too.
    upstream.reset()
    body = json.dumps({"bucket": bucket, "prefix": "warm/"}).encode()
    assert fetch(f"{paying.admin}/warm", "POST", {"Content-Type": "application/json"}, body)[0] == 202
    wait_until(lambda: upstream.seen("GET", f"/{bucket}/warm/one"), 20, "the warmed object fetched")
    listings = [h for _, p, h in upstream.seen_with_headers("GET", f"/{bucket}") if "list-type" in p]
    assert listings and all(h.get("x-amz-request-payer") == "requester" for h in listings), listings
    assert all("x-amz-request-payer" in _signed_names(h) for h in listings), listings
