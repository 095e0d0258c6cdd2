"""Larder answers with S3's headers and S3's errors."""

import http.client
import time
import urllib.request

import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from conftest import CLIENT_KEY, CLIENT_SECRET, REGION, metric, wait_until

# Headers that describe the connection or the server, not the object.
UNCOMPARED = {"date", "server", "x-amz-request-id", "x-amz-id-2", "x-cache", "vary", "strict-transport-security",
              "x-content-type-options", "x-xss-protection", "x-ratelimit-limit", "x-ratelimit-remaining",
              "content-security-policy", "connection", "keep-alive", "transfer-encoding"}


def object_headers(response):
    return {k: v for k, v in response["ResponseMetadata"]["HTTPHeaders"].items()
            if k not in UNCOMPARED and not k.startswith("x-amz-checksum")}


def test_object_headers_match_the_real_server(larder, direct, bucket):
    direct.put_object(
        Bucket=bucket, Key="doc.json.gz", Body=b"{}" * 5000,
        ContentType="application/json", ContentEncoding="gzip", CacheControl="max-age=300",
        ContentDisposition='attachment; filename="doc.json.gz"', ContentLanguage="en-GB",
        Metadata={"owner": "team-data", "Schema-Version": "3"},
    )
    via = larder.client()
    for call in ("head_object", "get_object"):
        ours = getattr(via, call)(Bucket=bucket, Key="doc.json.gz")
        theirs = getattr(direct, call)(Bucket=bucket, Key="doc.json.gz")
        assert object_headers(ours) == object_headers(theirs), call
    ours = via.get_object(Bucket=bucket, Key="doc.json.gz", Range="bytes=10-19")
    theirs = direct.get_object(Bucket=bucket, Key="doc.json.gz", Range="bytes=10-19")
    assert object_headers(ours) == object_headers(theirs)
    assert ours["ResponseMetadata"]["HTTPHeaders"]["x-amz-request-id"]


def checksums(response):
    return {k: v for k, v in response["ResponseMetadata"]["HTTPHeaders"].items() if k.startswith("x-amz-checksum")}


def test_checksums_come_back_as_the_real_server_sends_them(larder, direct, bucket):
    """The object's stored checksum reaches the client's SDK, which checks the bytes Larder
    served against it: with the whole object when asked (`x-amz-checksum-mode: ENABLED`, which
    boto3 sends with every GET and HEAD since 1.36), never with a range (whose bytes it would
    fail) or when not asked."""
    body = bytes(range(256)) * 1200
    direct.put_object(Bucket=bucket, Key="summed", Body=body, ChecksumAlgorithm="SHA256")
    via = larder.client()
    theirs = direct.head_object(Bucket=bucket, Key="summed", ChecksumMode="ENABLED")
    assert "x-amz-checksum-sha256" in checksums(theirs)
    # A HEAD brings the checksums from the upstream; the GET after it answers from the metadata
    # that HEAD cached (a GET opening the object itself asks for a range, and learns none).
    assert checksums(via.head_object(Bucket=bucket, Key="summed", ChecksumMode="ENABLED")) == checksums(theirs)
    got = via.get_object(Bucket=bucket, Key="summed", ChecksumMode="ENABLED")
    assert checksums(got) == checksums(direct.get_object(Bucket=bucket, Key="summed", ChecksumMode="ENABLED"))
    # botocore wraps a body it will check against the checksum as it is read, and raises if not.
    assert type(got["Body"]).__name__ == "StreamingChecksumBody"
    assert got["Body"].read() == body
    for rng, want in (("bytes=0-9", body[:10]), ("bytes=0-", body)):
        ours = via.get_object(Bucket=bucket, Key="summed", Range=rng, ChecksumMode="ENABLED")
        theirs = direct.get_object(Bucket=bucket, Key="summed", Range=rng, ChecksumMode="ENABLED")
        assert checksums(ours) == checksums(theirs) == {}, rng
        assert ours["Body"].read() == want
    # Not asked (an SDK told to check only where an operation requires it): S3 sends none.
    plain = larder.client(response_checksum_validation="when_required").get_object(Bucket=bucket, Key="summed")
    assert checksums(plain) == {}
    assert plain["Body"].read() == body


@pytest.mark.parametrize("learn", [True, False], ids=["learn", "off"])
def test_checksums_a_first_get_could_not_bring_are_learnt_behind_a_later_read(make_larder, direct, bucket, upstream,
                                                                              learn):
    """An object first read through Larder is opened with a ranged GET, which S3 answers
    without checksums, so that read gets none. Its next whole read asking for them sends one
    HEAD behind it (`learn_checksums`), and the whole reads after it get the stored checksum,
    which boto3 checks as it reads. Ranges asking for them send no HEAD (S3 answers a range
    without them), and nor does anything with the switch off, the default (the first
    revalidation brings them then, a `metadata_ttl` later)."""
    body = bytes(range(256)) * 1200
    direct.put_object(Bucket=bucket, Key="learnt", Body=body, ChecksumAlgorithm="SHA256")
    stored = checksums(direct.head_object(Bucket=bucket, Key="learnt", ChecksumMode="ENABLED"))
    assert "x-amz-checksum-sha256" in stored
    node = make_larder(*(("--learn-checksums", "true") if learn else ()))
    via = node.client()
    upstream.reset()
    path = f"/{bucket}/learnt"

    def get(**kw):
        r = via.get_object(Bucket=bucket, Key="learnt", ChecksumMode="ENABLED", **kw)
        return r, r["ResponseMetadata"]["HTTPHeaders"]["x-cache"], r["Body"].read()

    first, cache, data = get()
    assert (cache, data, checksums(first)) == ("miss", body, {})
    for _ in range(2):
        r, cache, data = get(Range="bytes=0-9")
        assert (cache, data, checksums(r)) == ("hit-memory", body[:10], {})
    # Answered from what the GET brought, before its HEAD is sent.
    second, cache, data = get()
    assert (cache, data, checksums(second)) == ("hit-memory", body, {})
    if learn:
        # Counted once its answer is cached.
        wait_until(lambda: metric(node, "larder_metadata_refreshes_total", outcome="unchanged"), 10,
                   "the HEAD learning the checksums")
    else:
        time.sleep(1)
    want = stored if learn else {}
    for _ in range(3):
        r, cache, data = get()
        assert (cache, data, checksums(r)) == ("hit-memory", body, want)
        # botocore checks the bytes against the checksum as it reads them, and raises if not.
        assert (type(r["Body"]).__name__ == "StreamingChecksumBody") == learn
    assert checksums(via.head_object(Bucket=bucket, Key="learnt", ChecksumMode="ENABLED")) == want
    time.sleep(0.3)
    assert len(upstream.seen("HEAD", path)) == int(learn)
    assert len(upstream.seen("GET", path)) == 1


def test_response_overrides(larder, direct, bucket):
    direct.put_object(Bucket=bucket, Key="k", Body=b"hello", ContentType="text/plain")
    r = larder.client().get_object(Bucket=bucket, Key="k", ResponseContentType="application/x-custom",
                                   ResponseContentDisposition="inline", ResponseCacheControl="no-store")
    h = r["ResponseMetadata"]["HTTPHeaders"]
    assert (h["content-type"], h["content-disposition"], h["cache-control"]) == ("application/x-custom", "inline", "no-store")


def error_of(fn, **kw):
    with pytest.raises(ClientError) as e:
        fn(**kw)
    return e.value.response["ResponseMetadata"]["HTTPStatusCode"], e.value.response["Error"]["Code"]


def test_errors_match_the_real_server(larder, direct, bucket):
    via = larder.client()
    for kw in ({"Bucket": bucket, "Key": "missing"}, {"Bucket": "no-such-bucket-e2e", "Key": "k"}):
        assert error_of(via.get_object, **kw) == error_of(direct.get_object, **kw), kw
        assert error_of(via.head_object, **kw) == error_of(direct.head_object, **kw), kw
    assert error_of(via.get_object, Bucket=bucket, Key="missing") == (404, "NoSuchKey")
    assert error_of(via.get_object, Bucket="no-such-bucket-e2e", Key="k") == (404, "NoSuchBucket")


def test_upstream_access_denied_is_passed_through(make_larder, direct, bucket):
    direct.put_object(Bucket=bucket, Key="k", Body=b"secret")
    wrong = make_larder(env={"AWS_ACCESS_KEY_ID": "not-a-real-key", "AWS_SECRET_ACCESS_KEY": "nope"})
    status, code = error_of(wrong.client().get_object, Bucket=bucket, Key="k")
    assert status == 403
    assert code == "InvalidAccessKeyId"  # what MinIO says of an unknown key, passed through


def test_upstream_down_is_a_503(make_larder, workdir):
    dead = make_larder("--upstream-idle-timeout", "2s", upstream_url="http://127.0.0.1:9")
    status, code = error_of(dead.client(retries={"max_attempts": 1}).get_object, Bucket="bkt", Key="k")
    assert (status, code) == (503, "ServiceUnavailable")


def raw(larder, method, path, headers=None, body=b"", sign=True, key=CLIENT_KEY, secret=CLIENT_SECRET):
    """One HTTP request as written, signed (SigV4, by botocore's signer) unless `sign` is False."""
    headers = dict(headers or {})
    if sign:
        host = headers.get("Host", f"127.0.0.1:{larder.port}")
        url = f"http://{host}{path}"
        request = AWSRequest(method=method, url=url, headers=headers, data=body)
        request.context["payload_signing_enabled"] = True
        S3SigV4Auth(Credentials(key, secret), "s3", REGION).add_auth(request)
        headers = dict(request.headers.items())
    conn = http.client.HTTPConnection("127.0.0.1", larder.port, timeout=10)
    conn.putrequest(method, path, skip_host="Host" in headers, skip_accept_encoding=True)
    for k, v in headers.items():
        conn.putheader(k, v)
    if body or method in ("PUT", "POST"):
        conn.putheader("Content-Length", str(len(body)))
    conn.endheaders(body or None)
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, dict((k.lower(), v) for k, v in r.getheaders()), data


def test_bad_requests_get_s3_errors(larder, direct, bucket):
    cases = [
        ("GET", f"/{bucket}/%zz", 400, b"InvalidURI"),
        ("GET", f"/{bucket}/" + "k" * 1025, 400, b"KeyTooLongError"),
        ("GET", "/x/k", 400, b"InvalidBucketName"),
    ]
    for method, path, status, code in cases:
        got_status, headers, body = raw(larder, method, path)
        assert got_status == status, path
        assert b"<Code>" + code + b"</Code>" in body, (path, body)
        assert headers["x-amz-request-id"]
        assert headers["content-type"] == "application/xml"


def test_multi_range_requests_are_served_whole_as_s3_does(larder, direct, bucket):
    direct.put_object(Bucket=bucket, Key="k", Body=b"0123456789")
    status, _, body = raw(larder, "GET", f"/{bucket}/k", {"Range": "bytes=0-1,5-6"})
    assert (status, body) == (200, b"0123456789")


def test_virtual_hosted_style(larder, direct, bucket):
    direct.put_object(Bucket=bucket, Key="dir/vh key.txt", Body=b"virtual")
    status, _, body = raw(larder, "GET", "/dir/vh%20key.txt", {"Host": f"{bucket}.s3.larder.test:{larder.port}"})
    assert (status, body) == (200, b"virtual")
    status, headers, _ = raw(larder, "HEAD", "/dir/vh%20key.txt", {"Host": f"{bucket}.s3.larder.test"})
    assert status == 200 and headers["content-length"] == "7"


def test_conditional_reads(larder, direct, bucket):
    direct.put_object(Bucket=bucket, Key="k", Body=b"conditional")
    etag = direct.head_object(Bucket=bucket, Key="k")["ETag"]
    client = larder.client()
    assert client.get_object(Bucket=bucket, Key="k", IfMatch=etag)["Body"].read() == b"conditional"
    assert error_of(client.get_object, Bucket=bucket, Key="k", IfMatch='"0000"') == (412, "PreconditionFailed")
    status, _, _ = raw(larder, "GET", f"/{bucket}/k", {"If-None-Match": etag})
    assert status == 304


def eventually(probe, want="hit-memory", attempts=50):
    got = None
    for _ in range(attempts):
        got = probe()
        if got == want:
            break
        time.sleep(0.1)
    return got


def test_x_cache_and_admin_endpoints(larder, direct, bucket):
    direct.put_object(Bucket=bucket, Key="k", Body=b"y" * 20_000_000)
    path = f"/{bucket}/k"
    # The first block whole (a smaller range would be fetched as asked, as a part of its own).
    first_block = {"Range": f"bytes=0-{8 * 1024 * 1024 - 1}"}
    assert raw(larder, "GET", path, first_block)[1]["x-cache"] == "miss"
    assert eventually(lambda: raw(larder, "GET", path, first_block)[1]["x-cache"]) == "hit-memory"
    assert raw(larder, "GET", path, {"Range": "bytes=0-9"})[1]["x-cache"] == "hit-memory"
    assert raw(larder, "GET", path)[1]["x-cache"] == "partial"
    assert eventually(lambda: raw(larder, "GET", path)[1]["x-cache"]) == "hit-memory"
    for endpoint in ("/healthz", "/readyz"):
        with urllib.request.urlopen(larder.admin + endpoint, timeout=5) as r:
            assert r.status == 200
    metrics = larder.metrics()
    for name in ("larder_requests_total", "larder_upstream_requests_total", "larder_upstream_received_bytes_total",
                 "larder_served_bytes_total", "larder_memory_used_bytes", "larder_request_ttfb_seconds_bucket"):
        assert name in metrics, name
    assert 'cache="hit-memory"' in metrics
