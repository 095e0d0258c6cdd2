"""Every operation the cache does not answer passes through to the real server, re-signed, and
streams both ways; writes through Larder make what it cached of that key stale at once."""

import base64
import datetime
import hashlib
import hmac
import random
import subprocess
import zlib

from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from conftest import CLIENT_KEY, CLIENT_SECRET, REGION
from test_headers_errors import error_of, raw

MiB = 1 << 20


def body(size, seed):
    return random.Random(seed).randbytes(size)


def test_listings_and_bucket_operations(larder, direct, bucket):
    for k in ("a/1", "a/2", "b/3", "top"):
        direct.put_object(Bucket=bucket, Key=k, Body=k.encode())
    via = larder.client()
    got = via.list_objects_v2(Bucket=bucket, Prefix="a/")
    assert [o["Key"] for o in got["Contents"]] == ["a/1", "a/2"]
    assert got["ResponseMetadata"]["HTTPHeaders"]["x-cache"] == "pass"
    got = via.list_objects_v2(Bucket=bucket, Delimiter="/")
    assert [p["Prefix"] for p in got["CommonPrefixes"]] == ["a/", "b/"]
    assert [o["Key"] for o in via.list_objects(Bucket=bucket)["Contents"]] == ["a/1", "a/2", "b/3", "top"]
    assert bucket in [b["Name"] for b in via.list_buckets()["Buckets"]]
    via.head_bucket(Bucket=bucket)
    created = bucket + "-made"
    via.create_bucket(Bucket=created)
    assert created in [b["Name"] for b in direct.list_buckets()["Buckets"]]
    via.delete_bucket(Bucket=created)


def test_uploads_land_upstream_and_replace_what_was_cached(larder, direct, bucket):
    via = larder.client()
    direct.put_object(Bucket=bucket, Key="k", Body=b"version one")
    assert via.get_object(Bucket=bucket, Key="k")["Body"].read() == b"version one"
    # Metadata is now cached for 60 s; a write through Larder makes it stale at once.
    via.put_object(Bucket=bucket, Key="k", Body=b"version two, longer")
    assert direct.get_object(Bucket=bucket, Key="k")["Body"].read() == b"version two, longer"
    got = via.get_object(Bucket=bucket, Key="k")
    assert got["Body"].read() == b"version two, longer"
    assert got["ETag"] == direct.head_object(Bucket=bucket, Key="k")["ETag"]
    via.copy_object(Bucket=bucket, Key="k", CopySource={"Bucket": bucket, "Key": "k"},
                    Metadata={"colour": "green"}, MetadataDirective="REPLACE")
    assert via.head_object(Bucket=bucket, Key="k")["Metadata"] == {"colour": "green"}
    via.put_object_tagging(Bucket=bucket, Key="k", Tagging={"TagSet": [{"Key": "t", "Value": "1"}]})
    assert via.get_object_tagging(Bucket=bucket, Key="k")["TagSet"] == [{"Key": "t", "Value": "1"}]
    via.delete_object(Bucket=bucket, Key="k")
    assert error_of(via.get_object, Bucket=bucket, Key="k") == (404, "NoSuchKey")
    for k in ("x", "y"):
        direct.put_object(Bucket=bucket, Key=k, Body=b"doomed")
        assert via.get_object(Bucket=bucket, Key=k)["Body"].read() == b"doomed"
    via.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "x"}, {"Key": "y"}]})
    for k in ("x", "y"):
        assert error_of(via.get_object, Bucket=bucket, Key=k) == (404, "NoSuchKey")


def test_multipart_uploads_from_the_aws_cli_and_boto3(larder, direct, bucket, tmp_path):
    data = body(21 * MiB + 7, 1)
    src = tmp_path / "big.bin"
    src.write_bytes(data)
    subprocess.run(["aws", "s3", "cp", str(src), f"s3://{bucket}/cli/big.bin", "--endpoint-url", larder.endpoint,
                    "--no-progress"], check=True, env=larder.cli_env(), capture_output=True, timeout=300)
    got = direct.get_object(Bucket=bucket, Key="cli/big.bin")["Body"].read()
    assert hashlib.sha256(got).hexdigest() == hashlib.sha256(data).hexdigest()
    assert "-" in direct.head_object(Bucket=bucket, Key="cli/big.bin")["ETag"], "was not a multipart upload"

    via = larder.client()
    up = via.create_multipart_upload(Bucket=bucket, Key="sdk/parts.bin")
    parts = [body(5 * MiB, 2), body(3 * MiB, 3)]
    etags = [via.upload_part(Bucket=bucket, Key="sdk/parts.bin", UploadId=up["UploadId"], PartNumber=i + 1,
                             Body=p)["ETag"] for i, p in enumerate(parts)]
    listed = via.list_parts(Bucket=bucket, Key="sdk/parts.bin", UploadId=up["UploadId"])
    assert [p["PartNumber"] for p in listed["Parts"]] == [1, 2]
    via.complete_multipart_upload(Bucket=bucket, Key="sdk/parts.bin", UploadId=up["UploadId"], MultipartUpload={
        "Parts": [{"PartNumber": i + 1, "ETag": e} for i, e in enumerate(etags)]})
    assert via.get_object(Bucket=bucket, Key="sdk/parts.bin")["Body"].read() == b"".join(parts)
    # A part's first read is Larder's own GET of it, whose answer says where the part lies
    # (test_reads.py).
    part2 = via.get_object(Bucket=bucket, Key="sdk/parts.bin", PartNumber=2)
    assert part2["Body"].read() == parts[1]
    assert part2["ResponseMetadata"]["HTTPHeaders"]["x-cache"] == "miss"
    assert part2["PartsCount"] == 2
    aborted = via.create_multipart_upload(Bucket=bucket, Key="sdk/aborted")
    via.abort_multipart_upload(Bucket=bucket, Key="sdk/aborted", UploadId=aborted["UploadId"])


def test_conditional_reads_answer_as_the_server_does(larder, direct, bucket):
    direct.put_object(Bucket=bucket, Key="k", Body=b"conditional")
    head = direct.head_object(Bucket=bucket, Key="k")
    etag, modified = head["ETag"], head["LastModified"]
    before, after = modified - datetime.timedelta(days=1), modified + datetime.timedelta(days=1)
    larder.client().get_object(Bucket=bucket, Key="k")  # metadata now cached
    cases = [
        {"IfMatch": etag}, {"IfMatch": '"nope"'}, {"IfNoneMatch": etag}, {"IfNoneMatch": '"nope"'},
        {"IfModifiedSince": before}, {"IfModifiedSince": after},
        {"IfUnmodifiedSince": before}, {"IfUnmodifiedSince": after},
        # The two pairs S3's GetObject documentation specifies.
        {"IfMatch": etag, "IfUnmodifiedSince": before}, {"IfNoneMatch": etag, "IfModifiedSince": before},
    ]

    def outcome(client, kw):
        try:
            r = client.get_object(Bucket=bucket, Key="k", **kw)
            return 200, r["Body"].read()
        except Exception as e:  # noqa: BLE001 - the status is what is compared
            return e.response["ResponseMetadata"]["HTTPStatusCode"], None

    for kw in cases:
        assert outcome(larder.client(), kw) == outcome(direct.client, kw), kw


def test_sse_c_reads_bypass_the_cache(larder, direct, bucket, upstream):
    direct.put_object(Bucket=bucket, Key="k", Body=b"plain")
    headers = {
        "x-amz-server-side-encryption-customer-algorithm": "AES256",
        "x-amz-server-side-encryption-customer-key": "MDEyMzQ1Njc4OTAxMjM0NTY3ODkwMTIzNDU2Nzg5MDE=",
        "x-amz-server-side-encryption-customer-key-md5": "NTQ4OGZmMzU3ZTFhMjc4NDVjNmJkMzRjN2I5YjQyY2E=",
    }
    upstream.reset()
    for _ in range(2):  # twice: an answer is never cached for the next SSE-C read either
        status, got, _ = raw(larder, "GET", f"/{bucket}/k", headers)
        assert got["x-cache"] == "pass"
        # MinIO refuses SSE-C over plain HTTP, and says so.
        assert status == 400
    # Each read reached the upstream as one whole-object GET (no block range), with the key
    # headers the client sent, signed by Larder.
    gets = upstream.seen_with_headers("GET", f"/{bucket}/k")
    assert len(gets) == 2, gets
    for _, _, h in gets:
        assert "range" not in h and "if-match" not in h, h
        assert {k: h.get(k) for k in headers} == headers, h
        assert all(k in h["authorization"] for k in headers), "the key headers are signed"


class StreamingAuth(S3SigV4Auth):
    def payload(self, request):
        return "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"


def sign_chunk(key, date, scope, previous, data):
    string = "\n".join(["AWS4-HMAC-SHA256-PAYLOAD", date, scope, previous,
                        hashlib.sha256(b"").hexdigest(), hashlib.sha256(data).hexdigest()])
    return hmac.new(key, string.encode(), hashlib.sha256).hexdigest()


def chunked_upload(larder, bucket, key, chunks, tamper=False):
    """A PutObject with STREAMING-AWS4-HMAC-SHA256-PAYLOAD, as the AWS SDKs for Java and Go send it:
    botocore signs the headers (the seed), each chunk is signed in a chain from it."""
    decoded = sum(len(c) for c in chunks)
    headers = {"x-amz-content-sha256": "STREAMING-AWS4-HMAC-SHA256-PAYLOAD", "content-encoding": "aws-chunked",
               "x-amz-decoded-content-length": str(decoded)}
    # The framed length is fixed by the chunk sizes: each chunk adds its header, the signature, CRLFs.
    framed = sum(len(f"{len(c):x};chunk-signature=") + 64 + 4 + len(c) for c in chunks + [b""])
    headers["content-length"] = str(framed)
    request = AWSRequest(method="PUT", url=f"http://127.0.0.1:{larder.port}/{bucket}/{key}", headers=headers)
    StreamingAuth(Credentials(CLIENT_KEY, CLIENT_SECRET), "s3", REGION).add_auth(request)
    signed = dict(request.headers.items())
    assert signed["X-Amz-Content-SHA256"] == "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
    seed = signed["Authorization"].rsplit("Signature=", 1)[1]
    date = signed["X-Amz-Date"]
    scope = f"{date[:8]}/{REGION}/s3/aws4_request"
    k = f"AWS4{CLIENT_SECRET}".encode()
    for part in (date[:8], REGION, "s3", "aws4_request"):
        k = hmac.new(k, part.encode(), hashlib.sha256).digest()
    out, previous = b"", seed
    for i, c in enumerate(chunks + [b""]):
        sig = sign_chunk(k, date, scope, previous, c)
        previous = sig
        sent = c
        if tamper and i == len(chunks) - 1:
            sent = bytes([c[0] ^ 1]) + c[1:]
        out += f"{len(c):x};chunk-signature={sig}\r\n".encode() + sent + b"\r\n"
    assert len(out) == framed
    signed.pop("content-length", None)
    return raw(larder, "PUT", f"/{bucket}/{key}", signed, body=out, sign=False)


def test_signed_chunked_uploads_are_verified_chunk_by_chunk(larder, direct, bucket):
    chunks = [body(64 * 1024, 4), body(64 * 1024, 5), body(1000, 6)]
    status, _, answer = chunked_upload(larder, bucket, "chunked", chunks)
    assert status == 200, answer
    assert direct.get_object(Bucket=bucket, Key="chunked")["Body"].read() == b"".join(chunks)
    status, _, answer = chunked_upload(larder, bucket, "tampered", chunks, tamper=True)
    assert status == 403 and b"SignatureDoesNotMatch" in answer, answer
    assert error_of(direct.head_object, Bucket=bucket, Key="tampered")[0] == 404, "a tampered upload landed"


def test_streamed_uploads_from_the_rust_sdk(larder, direct, bucket, tmp_path):
    from conftest import binary
    data = body(3 * MiB + 5, 7)
    src = tmp_path / "up.bin"
    src.write_bytes(data)
    out = subprocess.run([binary("larder-e2e-sdk-client"), larder.endpoint, bucket, "rust/up.bin", "--put", str(src)],
                         check=True, env=larder.cli_env(), capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == direct.head_object(Bucket=bucket, Key="rust/up.bin")["ETag"]
    assert direct.get_object(Bucket=bucket, Key="rust/up.bin")["Body"].read() == data
    # The SDK signs each chunk and sends a CRC32 in a signed trailer; Larder verifies both and
    # passes the checksum on, so the server checked and stored it.
    crc = base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()
    assert direct.head_object(Bucket=bucket, Key="rust/up.bin", ChecksumMode="ENABLED")["ChecksumCRC32"] == crc
