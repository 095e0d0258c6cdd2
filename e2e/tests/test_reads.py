"""Reads through Larder return exactly S3's bytes, for whole objects and byte ranges, with every
real client: boto3, the aws CLI and aws-sdk-rust."""

import hashlib
import os
import random
import socket
import subprocess
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

import pytest
import urllib3
from botocore.exceptions import ClientError

from conftest import CLIENT_KEY, CLIENT_SECRET, REGION, ROOT, binary, metric, wait_until

MiB = 1 << 20
BLOCK = 8 * MiB


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def payload(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


def cli_env():
    env = dict(os.environ, AWS_ACCESS_KEY_ID=CLIENT_KEY, AWS_SECRET_ACCESS_KEY=CLIENT_SECRET, AWS_DEFAULT_REGION=REGION)
    env.pop("AWS_PROFILE", None)
    return env


SIZES = [0, 1, 1000, BLOCK - 1, BLOCK, BLOCK + 1, 3 * BLOCK + 12345]


def test_whole_objects_of_every_shape(larder, direct, bucket):
    client = larder.client()
    for i, size in enumerate(SIZES):
        data = payload(size, i)
        direct.put_object(Bucket=bucket, Key=f"obj-{size}", Body=data)
    def read(size):
        r = client.get_object(Bucket=bucket, Key=f"obj-{size}")
        body = r["Body"].read()
        assert len(body) == size
        assert sha(body) == sha(payload(size, SIZES.index(size))), f"size {size}"
        assert r["ContentLength"] == size
        return r["ResponseMetadata"]["HTTPHeaders"]["x-cache"]

    # Cold: each from the upstream.
    assert {read(size) for size in SIZES} <= {"miss", "coalesced"}
    # Then from cache: each whole object from memory (its blocks land just behind the response).
    for size in SIZES:
        wait_until(lambda: read(size) == "hit-memory", 5, f"obj-{size} from memory")


def test_large_object_with_aws_cli_boto3_and_rust_sdk(larder, direct, bucket, workdir):
    size = 200 * MiB + 7
    data = payload(size, 42)
    digest = sha(data)
    direct.put_object(Bucket=bucket, Key="big/object.bin", Body=data)

    out = workdir / "cli-download.bin"
    subprocess.run(
        ["aws", "s3", "cp", f"s3://{bucket}/big/object.bin", str(out), "--endpoint-url", larder.endpoint, "--no-progress"],
        check=True, env=cli_env(), capture_output=True,
    )
    assert sha(out.read_bytes()) == digest
    out.unlink()

    b3 = workdir / "boto3-download.bin"
    larder.client().download_file(bucket, "big/object.bin", str(b3))
    assert sha(b3.read_bytes()) == digest
    b3.unlink()

    res = subprocess.run(
        [binary("larder-e2e-sdk-client"), larder.endpoint, bucket, "big/object.bin"],
        check=True, env=cli_env(), capture_output=True, text=True,
    )
    assert res.stdout.split() == [digest, str(size)]


def curl_h2(url: str, out, *extra) -> list[str]:
    """curl over cleartext HTTP/2 (prior knowledge): the answer's HTTP version and status. One
    URL per curl: Debian's curl 7.88.1 fails reusing a prior-knowledge connection (curl#10634).
    Streams at once on one connection are tested over TLS (test_tls.py)."""
    args = ["curl", "--http2-prior-knowledge", "-sS", "--fail", "--max-time", "60", "-w",
            "%{http_version} %{http_code}", *extra, "-o", str(out), url]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (done.returncode, done.stderr)
    return done.stdout.split()


@pytest.mark.parametrize("by_reference", ["always", "auto", "remote"])
def test_a_hit_read_late_keeps_its_bytes_though_memory_reused_its_block(make_larder, direct, bucket, by_reference):
    """An HTTP/1.1 hit's body may leave by reference: the block's pages go to the socket without
    a copy, and wait there until the client reads them. A client that reads only after the block
    was evicted and its memory refilled with another object's bytes must still get the bytes it
    asked for. This client is on loopback: `always` lends to it, and so does the default (`auto`)
    for blocks of at most 256 KiB such as this one; `remote` copies."""
    larder = make_larder("--block-size", "1MiB", "--memory-capacity", "2MiB",
                         "--send-by-reference", by_reference, name=f"lend-{by_reference}")
    # The first object and the refills share a length no other block has, so the fills that
    # follow its eviction take its buffer from the pool (buffers are reused by exact length).
    # A quarter of a MiB: less than a connection's pipe holds, so the response is written whole
    # while its client reads nothing.
    odd = MiB // 4
    first = ("lend/first", payload(odd, 90))
    hot = {f"lend/hot{i:02d}": payload(MiB, 91 + i) for i in range(15)}
    refills = {f"lend/refill{i:02d}": payload(odd, 120 + i) for i in range(10)}
    for key, data in [first, *hot.items(), *refills.items()]:
        direct.put_object(Bucket=bucket, Key=key, Body=data)
    client = larder.client()
    # A block is lent once the memory tier has served it 16 times (cache-core's
    # LEND_AFTER_READS): read it that often first.
    for _ in range(17):
        assert client.get_object(Bucket=bucket, Key=first[0])["Body"].read() == first[1]
    # A hit asked on a connection nobody reads yet: all of it fits in the pipe and the socket.
    from_memory = metric(larder, "larder_served_bytes_total", tier="memory")
    url = urllib.parse.urlsplit(client.generate_presigned_url(
        "get_object", Params={"Bucket": bucket, "Key": first[0]}, ExpiresIn=300))
    late = socket.create_connection((url.hostname, url.port), timeout=30)
    late.sendall(f"GET {url.path}?{url.query} HTTP/1.1\r\nHost: {url.netloc}\r\n\r\n".encode())
    wait_until(lambda: metric(larder, "larder_served_bytes_total", tier="memory") >= from_memory + odd, 10,
               "the hit handed to the connection")
    # Objects read often push the first out of the two-block memory tier (its admission keeps
    # what is read most); then cold reads of the first's length refill its buffer.
    for _ in range(6):
        for key, data in hot.items():
            assert client.get_object(Bucket=bucket, Key=key)["Body"].read() == data, key
    for key, data in refills.items():
        for _ in range(4):
            assert client.get_object(Bucket=bucket, Key=key)["Body"].read() == data, key
    got = b""
    while b"\r\n\r\n" not in got:
        got += late.recv(65536)
    head, body = got.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 200"), head
    assert b"x-cache: hit-memory" in head.lower(), head
    while len(body) < odd:
        chunk = late.recv(MiB)
        assert chunk, "closed early"
        body += chunk
    late.close()
    assert body == first[1], "the late reader got other bytes than its object's"
    given_back = metric(larder, "larder_buffer_pool_given_back_total")
    if by_reference in ("always", "auto"):
        assert given_back > 0, "bodies were sent by reference"
    else:
        assert given_back == 0, "a client on this host was sent pages by reference"
    assert metric(larder, "larder_buffer_pool_stranded_total") == 0
    resp = client.get_object(Bucket=bucket, Key=first[0])
    assert resp["Body"].read() == first[1]
    assert resp["ResponseMetadata"]["HTTPHeaders"]["x-cache"] != "hit-memory", "the first block was evicted"


def test_a_host_busy_with_large_hits_is_lent_1_mib_bodies_a_lone_client_gets_copied(make_larder, direct, bucket):
    """Under the default `send_by_reference = "auto"` a client on this host is lent only the
    bodies of blocks of at most 256 KiB, unless eight or more connections on this host are
    sending large bodies at once: then blocks of up to 1 MiB too. One connection reading a hot
    1 MiB object gets every body copied; a dozen reading it at once are lent them (counted in
    `larder_buffer_pool_lent_bytes_total`), and every client gets the object's bytes."""
    larder = make_larder("--block-size", "1MiB", "--metadata-ttl", "1h", name="lend-busy")
    key, data = "lend/busy", payload(MiB, 140)
    direct.put_object(Bucket=bucket, Key=key, Body=data)
    client = larder.client()
    url = client.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=600)

    def read(times: int):
        pool = urllib3.PoolManager(maxsize=1)
        for _ in range(times):
            r = pool.request("GET", url, timeout=30)
            assert r.status == 200, r.status
            assert r.headers.get("x-cache") == "hit-memory", r.headers.get("x-cache")
            assert r.data == data, "a client got other bytes than its object's"
        pool.clear()

    def cached() -> str:
        r = client.get_object(Bucket=bucket, Key=key)
        assert r["Body"].read() == data
        return r["ResponseMetadata"]["HTTPHeaders"]["x-cache"]

    # The first read fetches the block; a read right after it may still join its flight (a
    # block of 1 MiB is cached once its readers had their bytes), so wait for it in memory.
    wait_until(lambda: cached() == "hit-memory", 10, "the block in memory")
    # Past cache-core's LEND_AFTER_READS (16), one connection at a time: copied.
    read(40)
    assert metric(larder, "larder_buffer_pool_lent_bytes_total") == 0, "a lone client was lent a 1 MiB body"
    # Twelve connections at once, in bursts until bodies are lent (at most five).
    for _ in range(5):
        with ThreadPoolExecutor(12) as pool:
            for done in [pool.submit(read, 15) for _ in range(12)]:
                done.result()
        if metric(larder, "larder_buffer_pool_lent_bytes_total") > 0:
            break
    assert metric(larder, "larder_buffer_pool_lent_bytes_total") >= MiB // 2, "twelve busy connections were not lent"
    assert metric(larder, "larder_buffer_pool_stranded_total") == 0


def test_http2_reads_get_every_byte_cold_and_warm(larder, direct, bucket, workdir):
    """An HTTP/2 connection's frames are gathered into few large writes: whole objects from 0
    bytes to several blocks, cold and from the cache, and ranges across a block boundary must
    each get exactly their bytes. A HEAD gets the length and no body."""
    sizes = [3 * BLOCK + 12345, 1000, 5 * MiB, 0]
    v4 = larder.client(signature_version="s3v4")
    urls = []
    for i, size in enumerate(sizes):
        direct.put_object(Bucket=bucket, Key=f"h2/{i}", Body=payload(size, 70 + i))
        urls.append(v4.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": f"h2/{i}"},
                                              ExpiresIn=300))
    for phase in ("cold", "warm"):
        from_memory = metric(larder, "larder_served_bytes_total", tier="memory")
        for i, size in enumerate(sizes):
            out = workdir / f"h2-{phase}-{i}"
            assert curl_h2(urls[i], out) == ["2", "200"], (phase, i)
            assert sha(out.read_bytes()) == sha(payload(size, 70 + i)), (phase, i)
        if phase == "warm":
            assert metric(larder, "larder_served_bytes_total", tier="memory") - from_memory == sum(sizes)
        else:
            # The blocks land just behind the responses.
            wait_until(lambda: all(in_memory(larder, bucket, f"h2/{i}") for i in range(len(sizes))), 10,
                       "every object in memory")
    for i, first, last in ((0, BLOCK - 100, 2 * BLOCK + 99), (2, 1000, 3_000_999)):
        out = workdir / f"h2-range-{i}"
        assert curl_h2(urls[i], out, "-r", f"{first}-{last}") == ["2", "206"]
        assert out.read_bytes() == payload(sizes[i], 70 + i)[first:last + 1], i
    # A HEAD over HTTP/2 has the GET's length and no body (curl's HTTP/2 library refuses DATA
    # on a HEAD's stream); so has a HEAD of a key that is not there, S3's 404.
    for i, size in enumerate(sizes):
        head = v4.generate_presigned_url("head_object", Params={"Bucket": bucket, "Key": f"h2/{i}"},
                                         ExpiresIn=300)
        out = workdir / f"h2-head-{i}"
        assert curl_h2(head, out, "-I") == ["2", "200"], i
        fields = dict(line.split(": ", 1) for line in out.read_text().splitlines()[1:] if ": " in line)
        assert fields["content-length"] == str(size), (i, fields)
    missing = v4.generate_presigned_url("head_object", Params={"Bucket": bucket, "Key": "h2/missing"},
                                        ExpiresIn=300)
    done = subprocess.run(["curl", "--http2-prior-knowledge", "-sS", "-I", "--max-time", "60", "-w",
                           "%{http_version} %{http_code}", "-o", os.devnull, missing],
                          capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout.split()) == (0, ["2", "404"]), done.stderr


def in_memory(larder, bucket, key) -> bool:
    r = larder.client().get_object(Bucket=bucket, Key=key)
    r["Body"].read()
    return r["ResponseMetadata"]["HTTPHeaders"]["x-cache"] == "hit-memory"


def random_ranges(size: int, n: int, rng: random.Random):
    """Ranges of every kind: inside a block, across block boundaries, first/last byte, suffix,
    open-ended, past the end."""
    out = ["bytes=0-0", f"bytes={size - 1}-{size - 1}", f"bytes={size - 1}-", "bytes=-1", f"bytes=-{size}", f"bytes=-{size + 10}",
           f"bytes=0-{size + 1000}", f"bytes={BLOCK - 1}-{BLOCK}", f"bytes={BLOCK}-{2 * BLOCK - 1}", f"bytes={BLOCK - 5}-{2 * BLOCK + 5}"]
    while len(out) < n:
        kind = rng.randrange(5)
        if kind == 0:
            a = rng.randrange(size)
            b = rng.randrange(a, min(size, a + 3 * BLOCK))
            out.append(f"bytes={a}-{b}")
        elif kind == 1:
            edge = BLOCK * rng.randrange(1, size // BLOCK + 1)
            out.append(f"bytes={max(0, edge - rng.randrange(1, 5000))}-{min(size - 1, edge + rng.randrange(0, 5000))}")
        elif kind == 2:
            out.append(f"bytes=-{rng.randrange(1, size)}")
        elif kind == 3:
            out.append(f"bytes={rng.randrange(size)}-")
        else:
            a = rng.randrange(size)
            out.append(f"bytes={a}-{a + rng.randrange(1, 2 * size)}")
    return out


def expected_slice(h: str, size: int):
    spec = h.removeprefix("bytes=")
    a, b = spec.split("-")
    if a == "":
        n = int(b)
        return max(0, size - n), size
    start = int(a)
    end = size if b == "" else min(size, int(b) + 1)
    return start, end


def test_hundreds_of_random_ranges_boto3(larder, direct, bucket):
    size = 3 * BLOCK + 12345
    data = payload(size, 7)
    direct.put_object(Bucket=bucket, Key="ranges.bin", Body=data)
    client = larder.client()
    rng = random.Random(1234)
    ranges = random_ranges(size, 300, rng)

    def check(h):
        r = client.get_object(Bucket=bucket, Key="ranges.bin", Range=h)
        body = r["Body"].read()
        a, b = expected_slice(h, size)
        assert body == data[a:b], h
        assert r["ContentRange"] == f"bytes {a}-{b - 1}/{size}", h
        assert r["ResponseMetadata"]["HTTPStatusCode"] == 206

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(check, ranges))


def test_ranges_with_rust_sdk_and_aws_cli(larder, direct, bucket, workdir):
    size = 2 * BLOCK + 999
    data = payload(size, 11)
    direct.put_object(Bucket=bucket, Key="dir/rust ranges+1.bin", Body=data)
    ranges = random_ranges(size, 40, random.Random(99))
    res = subprocess.run(
        [binary("larder-e2e-sdk-client"), larder.endpoint, bucket, "dir/rust ranges+1.bin", *ranges],
        check=True, env=cli_env(), capture_output=True, text=True,
    )
    lines = res.stdout.strip().splitlines()
    assert len(lines) == len(ranges)
    for h, line in zip(ranges, lines):
        a, b = expected_slice(h, size)
        assert line.split() == [sha(data[a:b]), str(b - a)], h

    for h in ranges[:6]:
        out = workdir / "cli-range.bin"
        subprocess.run(
            ["aws", "s3api", "get-object", "--bucket", bucket, "--key", "dir/rust ranges+1.bin", "--range", h, str(out),
             "--endpoint-url", larder.endpoint],
            check=True, env=cli_env(), capture_output=True,
        )
        a, b = expected_slice(h, size)
        assert out.read_bytes() == data[a:b], h


@pytest.mark.parametrize("size", [0, 1, 100, BLOCK + 5])
def test_range_semantics_match_the_real_server(larder, direct, bucket, size):
    """For well-formed single ranges, Larder answers what the S3 server behind it answers."""
    direct.put_object(Bucket=bucket, Key="k", Body=payload(size, size))
    headers = ["bytes=0-0", "bytes=0-", "bytes=-1", "bytes=-0", "bytes=-1000", f"bytes={size}-", f"bytes={max(size - 1, 0)}-{size + 100}",
               "bytes=0-1,5-6", "items=0-1", "bytes=abc", "bytes=", "bytes=-"]
    if size == 0:
        # MinIO answers 206 with a malformed Content-Range here; S3 serves the empty object.
        headers = [h for h in headers if not (h.startswith("bytes=-") and h not in ("bytes=-0", "bytes=-"))]

    def answer(client, h):
        try:
            r = client.get_object(Bucket=bucket, Key="k", Range=h)
            return r["ResponseMetadata"]["HTTPStatusCode"], r.get("ContentRange"), sha(r["Body"].read())
        except ClientError as e:
            return e.response["ResponseMetadata"]["HTTPStatusCode"], e.response["Error"]["Code"], None

    via = larder.client()
    for h in headers:
        assert answer(via, h) == answer(direct, h), h


def test_suffix_range_of_an_empty_object_is_the_empty_object(larder, direct, bucket):
    direct.put_object(Bucket=bucket, Key="empty", Body=b"")
    r = larder.client().get_object(Bucket=bucket, Key="empty", Range="bytes=-10")
    assert r["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert r["Body"].read() == b""


def test_unsatisfiable_range_has_content_range_star(larder, direct, bucket):
    direct.put_object(Bucket=bucket, Key="k", Body=b"x" * 10)
    with pytest.raises(ClientError) as e:
        larder.client().get_object(Bucket=bucket, Key="k", Range="bytes=10-20")
    assert e.value.response["Error"]["Code"] == "InvalidRange"
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 416
    assert e.value.response["ResponseMetadata"]["HTTPHeaders"]["content-range"] == "bytes */10"


# MinIO refuses keys with an empty path segment ("a//b") and segments over 255 bytes, so those
# are covered by the addressing unit tests; "/leading" still puts "//" in the request path.
KEYS = ["with space.txt", "unicodé/ключ/鍵.bin", "percent%25literal%", "plus+sign", "/leading", "trailing/",
        "q?mark#hash", "amp&eq=semi;", "tilde~star*(paren)", "back\\slash", ("b" * 200 + "/") * 5 + "c" * 19]


def test_keys_with_any_valid_characters(larder, direct, bucket, workdir):
    client = larder.client()
    for i, key in enumerate(KEYS):
        direct.put_object(Bucket=bucket, Key=key, Body=payload(100 + i, i))
    for i, key in enumerate(KEYS):
        assert client.get_object(Bucket=bucket, Key=key)["Body"].read() == payload(100 + i, i), key
        assert client.head_object(Bucket=bucket, Key=key)["ContentLength"] == 100 + i
    out = workdir / "cli-key.bin"
    for i, key in enumerate(KEYS[:5]):
        subprocess.run(
            ["aws", "s3api", "get-object", "--bucket", bucket, "--key", key, str(out), "--endpoint-url", larder.endpoint],
            check=True, env=cli_env(), capture_output=True,
        )
        assert out.read_bytes() == payload(100 + i, i), key


def multipart(direct, bucket, key, parts, **checksum):
    """Upload `parts` as one multipart object at `key`, in that order (with `ChecksumAlgorithm=`,
    the server stores each part's checksum of that kind)."""
    up = direct.create_multipart_upload(Bucket=bucket, Key=key, **checksum)
    done = []
    for i, p in enumerate(parts):
        sent = direct.upload_part(Bucket=bucket, Key=key, UploadId=up["UploadId"], PartNumber=i + 1, Body=p,
                                  **checksum)
        # A part's checksum, when stored, is named again on completion.
        sums = {k: v for k, v in sent.items() if k.startswith("Checksum") and k[8:] in checksum.values()}
        done.append({"PartNumber": i + 1, "ETag": sent["ETag"], **sums})
    direct.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=up["UploadId"],
                                     MultipartUpload={"Parts": done})


def test_parts_of_a_multipart_upload_come_from_the_cache_from_their_first_read(larder, direct, bucket, upstream):
    """A `partNumber` read (boto3's `PartNumber`; the AWS SDK for Java's multipart download reads
    every part so) is, the first time, Larder's own GET of that part: the real server's 206 says
    where the part lies, and its body fills the cache. From then on, while the object keeps that
    ETag, the part is read from the cache and answered as the server answers it, with the part's
    own checksum (boto3 asks for checksums on every read, and checks the part's bytes against
    it). A first HEAD passes through and is learnt. Read whole after its parts, the object costs
    no GET: the blocks its parts cut are assembled from the pieces. A write through Larder sends
    the next read of a part to the upstream again, and the new object's parts are learnt anew."""
    from test_headers_errors import checksums, error_of, object_headers
    parts = [payload(5 * MiB, 41), payload(5 * MiB, 42), payload(2 * MiB + 3, 43)]
    multipart(direct, bucket, "mp", parts, ChecksumAlgorithm="CRC32")
    direct.put_object(Bucket=bucket, Key="single", Body=payload(1000, 44))
    # Parts as long as Larder's blocks (8 MiB, boto3's and the AWS CLI's part size too).
    aligned = [payload(BLOCK, 47), payload(BLOCK, 48), payload(MiB + 5, 49)]
    multipart(direct, bucket, "aligned", aligned)
    multipart(direct, bucket, "headed", [payload(5 * MiB, 50), payload(MiB, 51)])
    via = larder.client()
    upstream.reset()

    def read(key, n, head=False):
        if head:
            r = via.head_object(Bucket=bucket, Key=key, PartNumber=n)
            theirs = direct.head_object(Bucket=bucket, Key=key, PartNumber=n)
        else:
            r = via.get_object(Bucket=bucket, Key=key, PartNumber=n)
            theirs = direct.get_object(Bucket=bucket, Key=key, PartNumber=n)
            got, want = r["Body"].read(), theirs["Body"].read()
            assert got == want, (key, n)
        assert r["ResponseMetadata"]["HTTPStatusCode"] == theirs["ResponseMetadata"]["HTTPStatusCode"] == 206
        assert object_headers(r) == object_headers(theirs), (key, n)
        assert checksums(r) == checksums(theirs), (key, n)
        return r["ResponseMetadata"]["HTTPHeaders"]["x-cache"]

    def first_reads(key):
        """The first read of each part is one upstream GET, of that part, and nothing else."""
        for n in (1, 2, 3):
            before = len(upstream.seen(None, f"/{bucket}/{key}"))
            assert read(key, n) == "miss", (key, n)
            sent = upstream.seen(None, f"/{bucket}/{key}")[before:]
            assert len(sent) == 1 and sent[0][0] == "GET" and f"partNumber={n}" in sent[0][1], sent

    # Parts laid on blocks: one GET each, then none. Right after a part's first read its fill
    # may still be closing its flight (a read then joins it, "coalesced", and still sends no
    # GET): memory holds the part once the flight is done.
    first_reads("aligned")
    sent = len(upstream.seen(None, f"/{bucket}/aligned"))
    for n in (3, 1, 2):
        wait_until(lambda: read("aligned", n) == "hit-memory", 10, f"aligned part {n} from memory")
        assert read("aligned", n, head=True) == "hit-memory", n
    assert len(upstream.seen(None, f"/{bucket}/aligned")) == sent
    # Parts across blocks (5 MiB: the part size of the AWS SDK for Go's uploader and of
    # rclone): one GET each too, whose body fills the pieces of the blocks the part covers, as
    # the parts cut them (a block two parts share is not fetched again whole); then from memory.
    first_reads("mp")
    for n in (1, 2, 3):
        wait_until(lambda: read("mp", n) == "hit-memory", 10, f"part {n} from memory")
    # Read whole now: the blocks the parts cut into pieces are assembled from those pieces,
    # with no GET (they were fetched again before).
    # The object's metadata came with a part's answer, which carried that part's checksum: a
    # whole read is never answered with it (botocore would fail the body against it).
    gets = len(upstream.seen(None, f"/{bucket}/mp"))
    whole = via.get_object(Bucket=bucket, Key="mp", ChecksumMode="ENABLED")
    assert whole["Body"].read() == b"".join(parts)
    assert whole["ResponseMetadata"]["HTTPHeaders"]["x-cache"] == "hit-memory"
    assert len(upstream.seen(None, f"/{bucket}/mp")) == gets, upstream.seen(None, f"/{bucket}/mp")[gets:]
    theirs = direct.get_object(Bucket=bucket, Key="mp", ChecksumMode="ENABLED")
    # Read to the end: a body left unread holds MinIO's read lock on the key, and the write
    # below would wait 30 s for it.
    assert theirs["Body"].read() == b"".join(parts)
    assert checksums(whole) in ({}, checksums(theirs)), (checksums(whole), checksums(theirs))
    gets = len(upstream.seen(None, f"/{bucket}/mp"))
    for n in (3, 1, 2):
        assert read("mp", n) == "hit-memory", n
        assert read("mp", n, head=True) == "hit-memory", n
    assert len(upstream.seen(None, f"/{bucket}/mp")) == gets, upstream.seen(None, f"/{bucket}/mp")
    cached = via.get_object(Bucket=bucket, Key="mp", PartNumber=2)
    assert cached["PartsCount"] == 3
    # The upload stored a CRC32 of each part, which the server sends with the part and botocore
    # checks the body against as it is read.
    assert "x-amz-checksum-crc32" in checksums(cached)
    assert type(cached["Body"]).__name__ == "StreamingChecksumBody"
    assert cached["Body"].read() == parts[1]
    # An object uploaded whole has one part, the whole object (206, no count of parts).
    assert read("single", 1) == "miss"
    wait_until(lambda: read("single", 1) == "hit-memory", 10, "the single part from memory")
    # A first HEAD of a part passes through, and what it said is learnt.
    assert read("headed", 2, head=True) == "pass"
    assert read("headed", 2) == "miss"
    wait_until(lambda: read("headed", 2) == "hit-memory", 10, "the headed part from memory")
    # What S3 refuses is still S3's to refuse: a part past the last, a part with a range.
    for key, n in (("mp", 4), ("single", 2)):
        assert error_of(via.get_object, Bucket=bucket, Key=key, PartNumber=n) == \
            error_of(direct.get_object, Bucket=bucket, Key=key, PartNumber=n) == (416, "InvalidPartNumber")
    assert error_of(via.get_object, Bucket=bucket, Key="mp", PartNumber=2, Range="bytes=0-9") == \
        error_of(direct.get_object, Bucket=bucket, Key="mp", PartNumber=2, Range="bytes=0-9")
    # Written again (through Larder, which forgets its metadata), as two parts of other sizes:
    # no part is answered from the old layout.
    parts = [payload(6 * MiB, 45), payload(MiB, 46)]
    up = via.create_multipart_upload(Bucket=bucket, Key="mp")
    done = [{"PartNumber": i + 1, "ETag": via.upload_part(Bucket=bucket, Key="mp", UploadId=up["UploadId"],
                                                          PartNumber=i + 1, Body=p)["ETag"]}
            for i, p in enumerate(parts)]
    via.complete_multipart_upload(Bucket=bucket, Key="mp", UploadId=up["UploadId"], MultipartUpload={"Parts": done})
    before = len(upstream.seen(None, f"/{bucket}/mp"))
    for n in (1, 2):
        assert read("mp", n) == "miss", n
    # One GET a part, of the part: not first a GET of where part 1 lay before the write.
    sent = upstream.seen(None, f"/{bucket}/mp")[before:]
    assert len(sent) == 2 and all(m == "GET" and "partNumber=" in p for m, p, _ in sent), sent
    assert error_of(via.get_object, Bucket=bucket, Key="mp", PartNumber=3) == (416, "InvalidPartNumber")
    for n in (2, 1):
        wait_until(lambda: read("mp", n) == "hit-memory", 10, f"the new part {n} from memory")


def test_version_id_reads_return_that_version_cached_apart(larder, direct, bucket, upstream):
    direct.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    v1, v2 = payload(BLOCK + 10, 31), payload(3000, 32)
    id1 = direct.put_object(Bucket=bucket, Key="doc", Body=v1)["VersionId"]
    id2 = direct.put_object(Bucket=bucket, Key="doc", Body=v2)["VersionId"]
    assert id1 and id2 and id1 != id2
    client = larder.client()
    upstream.reset()

    def get(**kw):
        r = client.get_object(Bucket=bucket, Key="doc", **kw)
        return r["Body"].read(), r["ResponseMetadata"]["HTTPHeaders"]

    # The old version by its id, whole and by range; the latest without one.
    body, headers = get(VersionId=id1)
    assert body == v1 and headers["x-amz-version-id"] == id1
    body, headers = get(VersionId=id1, Range="bytes=8388600-8388609")
    assert body == v1[8388600:8388610] and headers["x-amz-version-id"] == id1
    body, headers = get()
    assert body == v2 and headers["x-amz-version-id"] == id2
    # Each fetch named its version at the upstream (nothing of v1 was fetched as "the latest").
    # v1's two blocks came in one GET or in one each: a cold read's first GET runs on over the
    # blocks its connection is expected to bring (docs/architecture.md, step 2), as far as
    # what the upstream gains from parallel GETs says.
    gets = upstream.seen("GET", f"/{bucket}/doc")
    named = sum(f"versionId={id1}" in p for _, p, _ in gets)
    assert named in (1, 2), gets
    assert all(f"versionId={id1}" in p for _, p, _ in gets[:named]), gets
    assert len(gets) == named + 1 and "versionId" not in gets[-1][1], gets
    # Read again: from cache, still each its own bytes, no further upstream GET.
    for _ in range(2):
        wait_until(lambda: get(VersionId=id1)[1]["x-cache"] == "hit-memory", 5, "v1 from memory")
    assert get(VersionId=id1)[0] == v1
    assert get(VersionId=id2)[0] == v2
    assert get()[0] == v2
    assert len(upstream.seen("GET", f"/{bucket}/doc")) <= len(gets) + 1  # id2 by its id: at most one more
    # HEAD by id, and an id that does not exist: the upstream's own answer.
    assert client.head_object(Bucket=bucket, Key="doc", VersionId=id1)["ContentLength"] == len(v1)
    with pytest.raises(ClientError) as mine:
        client.get_object(Bucket=bucket, Key="doc", VersionId="00000000-0000-0000-0000-000000000000")
    with pytest.raises(ClientError) as theirs:
        direct.get_object(Bucket=bucket, Key="doc", VersionId="00000000-0000-0000-0000-000000000000")
    assert mine.value.response["Error"]["Code"] == theirs.value.response["Error"]["Code"]
    assert (mine.value.response["ResponseMetadata"]["HTTPStatusCode"]
            == theirs.value.response["ResponseMetadata"]["HTTPStatusCode"])
