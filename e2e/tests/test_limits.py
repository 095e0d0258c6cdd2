"""A slow or greedy client cannot take the S3 listener away from everyone else."""

import os
import random
import socket
import threading
import time
import urllib.error
import urllib.request

from botocore.exceptions import ClientError

from conftest import CLIENT_KEY, READER_KEY, READER_SECRET, assert_dashboard_metrics_exported, metric, wait_until
from test_attacks import _post_form
from test_headers_errors import raw
from test_reads import curl_h2


def test_a_client_that_never_finishes_its_headers_is_disconnected(make_larder, direct, bucket):
    direct.put_object(Bucket=bucket, Key="k", Body=b"served")
    larder = make_larder("--client-header-timeout", "1s")
    slow = socket.create_connection(("127.0.0.1", larder.port), timeout=10)
    slow.sendall(b"GET /" + bucket.encode() + b"/k HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Dribble: ")
    started = time.monotonic()
    # Everyone else is served meanwhile.
    assert raw(larder, "GET", f"/{bucket}/k")[2] == b"served"
    received = b""
    try:
        while chunk := slow.recv(4096):  # ends when the server closes the connection
            received += chunk
    except ConnectionResetError:
        pass
    waited = time.monotonic() - started
    slow.close()
    assert 0.5 < waited < 8, f"closed after {waited:.1f}s"
    assert b"served" not in received


def test_connections_beyond_the_cap_wait_until_one_closes(make_larder, direct, bucket):
    direct.put_object(Bucket=bucket, Key="k", Body=b"eventually")
    larder = make_larder("--max-connections", "2", "--client-header-timeout", "60s")
    idle = [socket.create_connection(("127.0.0.1", larder.port), timeout=10) for _ in range(2)]
    time.sleep(0.3)  # let Larder accept both
    result = {}

    def third():
        result["status"], _, result["body"] = raw(larder, "GET", f"/{bucket}/k")

    t = threading.Thread(target=third)
    t.start()
    t.join(timeout=1.5)
    assert t.is_alive(), "a third connection was served while two were held"
    idle[0].close()
    t.join(timeout=10)
    assert not t.is_alive()
    assert (result["status"], result["body"]) == (200, b"eventually")
    idle[1].close()


def until_closed(s: socket.socket) -> bytes:
    """Everything the server sends on `s` until it closes the connection. A server that holds
    the connection open past the socket's timeout fails the test: hanging is not closing."""
    got = b""
    try:
        while chunk := s.recv(65536):
            got += chunk
    except ConnectionResetError:
        pass
    except socket.timeout:
        raise AssertionError(f"the server neither closed the connection nor reset it within {s.gettimeout()}s; "
                             f"it sent {got[:80]!r}") from None
    finally:
        s.close()
    return got


def exchange(port, data: bytes, timeout=10) -> bytes:
    """Send `data` on a fresh connection; everything the server answers until it closes."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.sendall(data)
    return until_closed(s)


def test_hostile_requests_get_an_error_or_a_closed_connection(make_larder, direct, bucket):
    direct.put_object(Bucket=bucket, Key="k", Body=b"still serving")
    larder = make_larder("--client-header-timeout", "3s")
    get = f"GET /{bucket}/k HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode()
    cases = {
        "a 1 MiB header": get + b"X-Big: " + b"a" * (1 << 20) + b"\r\n\r\n",
        "a 1 MiB URL": f"GET /{bucket}/{'k' * (1 << 20)} HTTP/1.1\r\nHost: x\r\n\r\n".encode(),
        "10000 headers": get + b"".join(b"X-%d: 1\r\n" % i for i in range(10000)) + b"\r\n",
        "Content-Length with Transfer-Encoding": f"PUT /{bucket}/smuggled HTTP/1.1\r\nHost: x\r\n"
        f"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /{bucket}/k HTTP/1.1\r\nHost: x\r\n\r\n".encode(),
        "two Content-Lengths": f"PUT /{bucket}/k2 HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab".encode(),
        "not HTTP": b"\x16\x03\x01\x02\x00" + bytes(range(256)) * 4,
        "a bad request line": b"GET\r\n\r\n",
    }
    for what, data in cases.items():
        answer = exchange(larder.port, data)
        first = answer.split(b"\r\n", 1)[0]
        # Either refused with a 4xx, or the connection was closed without a response; never a 2xx,
        # and never a second (smuggled) response.
        assert answer == b"" or first.split(b" ")[1][:1] == b"4", (what, first)
        assert answer.count(b"HTTP/1.1 ") <= 1, what
    # Everyone else is still served.
    assert raw(larder, "GET", f"/{bucket}/k")[2] == b"still serving"


def test_an_idle_keep_alive_connection_is_closed(make_larder, direct, bucket):
    direct.put_object(Bucket=bucket, Key="k", Body=b"x")
    larder = make_larder("--client-header-timeout", "1s")
    s = socket.create_connection(("127.0.0.1", larder.port), timeout=15)
    s.sendall(f"GET /{bucket}/k HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    started = time.monotonic()
    got = until_closed(s)
    assert got.startswith(b"HTTP/1.1 403"), got[:40]  # unsigned: refused, then the connection idles
    assert time.monotonic() - started < 8, "an idle connection was held open"


def rss_mib(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def stalled_reader(larder, bucket: str, key: str) -> socket.socket:
    """A client that asks for `key` (signed) and reads nothing of the answer: once the
    socket's buffers are full, its response can send no more."""
    presign = larder.client(signature_version="s3v4")
    url = presign.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=300)
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
    s.settimeout(10)
    s.connect(("127.0.0.1", larder.port))
    s.sendall(f"GET {url.split(str(larder.port), 1)[1]} HTTP/1.1\r\nHost: 127.0.0.1:{larder.port}\r\n\r\n".encode())
    return s


def test_slow_readers_hold_no_more_than_the_responses_buffer(make_larder, direct, bucket):
    """Six clients each start reading a 64 MiB object, then stop reading. Each response would
    hold the block it sends and the blocks it opened ahead (all eight of its object's 8 MiB
    blocks, 384 MiB in all, beyond a 16 MiB memory tier); the responses' buffer lets them hold
    24 MiB, so the later ones wait for room (their headers too: a response starts when its
    first block is open). Larder's memory stays near that bound, the waits are counted, a
    reader that comes once the slow ones have gone is served the right bytes, and all the room
    comes back."""
    size, keys = 64 << 20, [f"slow/{i}" for i in range(6)]
    for i, k in enumerate(keys):
        direct.put_object(Bucket=bucket, Key=k, Body=bytes([i]) * size)
    larder = make_larder("--response-buffer", "24MiB", "--memory-capacity", "16MiB")
    before = rss_mib(larder.proc.pid)
    slow = [stalled_reader(larder, bucket, k) for k in keys]
    # What the responses could fetch, they have fetched by now.
    time.sleep(3)
    held = metric(larder, "larder_response_buffer_bytes")
    grew = rss_mib(larder.proc.pid) - before
    assert 0 < held <= 24 << 20, held
    assert metric(larder, "larder_response_buffer_waits_total") >= 1
    # Bounded: the buffer, the memory tier, the pool of reused buffers (64 MiB at most) and
    # blocks fetched but not yet sent; 99 MiB when written. With `--response-buffer 1GiB` the
    # six held 384 MiB of blocks and Larder grew by 688 MiB, and this test fails.
    assert grew < 200, f"resident memory grew by {grew:.0f} MiB"
    for s in slow:
        s.close()
    data = b"after the slow readers" * 1000
    direct.put_object(Bucket=bucket, Key="next", Body=data)
    assert larder.client().get_object(Bucket=bucket, Key="next")["Body"].read() == data
    wait_until(lambda: metric(larder, "larder_response_buffer_bytes") == 0, timeout=20,
               what="the responses' buffer to be given back")


def test_readers_that_stop_reading_do_not_hold_up_a_reader_that_reads(make_larder, direct, bucket):
    """Four clients start reading 32-block objects and stop (a data loader that stalls, a
    client that went away without closing). Each response holds the block it sends and the
    next, and further blocks only as room to spare (at most half the buffer in all), so a
    fifth client reading a 16-block object gets room for its blocks as fast as it sends them.
    When a response held all of its `read_window` blocks ahead, the four held the whole
    buffer (4 × 9 blocks of 32) and the fifth read waited until they were cut off at
    `client_idle_timeout`: this test fails then."""
    block = 1 << 20
    keys = [f"stalled/{i}" for i in range(4)]
    for i, k in enumerate(keys):
        direct.put_object(Bucket=bucket, Key=k, Body=bytes([i]) * 32 * block)
    data = random.Random(7).randbytes(16 * block)
    direct.put_object(Bucket=bucket, Key="reads-on", Body=data)
    larder = make_larder("--block-size", "1MiB", "--response-buffer", "32MiB", "--memory-capacity", "256MiB",
                         "--client-idle-timeout", "20s")
    stalled = [stalled_reader(larder, bucket, k) for k in keys]
    # What the stalled responses could send and open, they have by now.
    time.sleep(3)
    held = metric(larder, "larder_response_buffer_bytes")
    assert held <= 32 * block, held
    waits = metric(larder, "larder_response_buffer_waits_total")
    client = larder.client(read_timeout=60, retries={"max_attempts": 1})
    started = time.monotonic()
    got = client.get_object(Bucket=bucket, Key="reads-on")["Body"].read()
    took = time.monotonic() - started
    assert got == data
    assert took < 10, f"the reader waited {took:.1f}s for room the stalled readers held"
    assert metric(larder, "larder_response_buffer_waits_total") == waits, "it waited for room"
    for s in stalled:
        s.close()
    wait_until(lambda: metric(larder, "larder_response_buffer_bytes") == 0, timeout=20,
               what="the responses' buffer to be given back")


def limited(make_larder, workdir, rates: str):
    """A Larder where READER_KEY has the limits `rates` (TOML lines) and CLIENT_KEY none."""
    config = workdir / "limits.toml"
    config.write_text(f'[[auth_policies]]\naccess_key = "{READER_KEY}"\n{rates}\n')
    return make_larder("--config", str(config))


def test_a_key_over_its_request_rate_is_told_to_slow_down_whichever_way_it_signs(make_larder, workdir, direct, bucket):
    """A key limited to 5 requests a second, signing in the header, with a SigV4 presigned
    URL, with a SigV2 one and with a browser form's POST policy in turn: the rate is the key's,
    whatever carries its signature. The other key, in step with it, is never refused."""
    direct.put_object(Bucket=bucket, Key="k", Body=b"rated")
    larder = limited(make_larder, workdir, "requests_per_second = 5")
    # One attempt each: boto3's `max_attempts` counts retries, `total_max_attempts` all.
    batch = larder.client(READER_KEY, READER_SECRET, retries={"total_max_attempts": 1})
    other = larder.client()
    params = {"Bucket": bucket, "Key": "k"}
    urls = [larder.client(READER_KEY, READER_SECRET, signature_version=v).generate_presigned_url(
        "get_object", Params=params, ExpiresIn=300) for v in ("s3v4", "s3")]

    def header_signed():
        try:
            assert batch.get_object(**params)["Body"].read() == b"rated"
            return 200, None
        except ClientError as e:
            return e.response["ResponseMetadata"]["HTTPStatusCode"], e.response["Error"]["Code"]

    def presigned(url):
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                assert r.read() == b"rated"
                return r.status, None
        except urllib.error.HTTPError as e:
            body = e.read().decode()
            return e.code, body.split("<Code>")[1].split("</Code>")[0]

    form = larder.client(READER_KEY, READER_SECRET).generate_presigned_post(bucket, "form/${filename}", ExpiresIn=300)

    def form_upload():
        status, body = _post_form(form["url"], form["fields"], "f.txt", b"rated")
        return (status, None) if status == 204 else (status, body.decode().split("<Code>")[1].split("</Code>")[0])

    ways = [header_signed, lambda: presigned(urls[0]), lambda: presigned(urls[1]), form_upload]
    outcomes = {i: [] for i in range(len(ways))}
    started = time.monotonic()
    for i in range(60):
        outcomes[i % len(ways)].append(ways[i % len(ways)]())
        assert other.get_object(**params)["Body"].read() == b"rated"
    elapsed = time.monotonic() - started
    admitted = sum(o in ((200, None), (204, None)) for way in outcomes.values() for o in way)
    refused = sum(o == (503, "SlowDown") for way in outcomes.values() for o in way)
    assert admitted + refused == 60, outcomes
    # A second's worth at once, then five a second.
    assert 5 <= admitted <= 5 + 5 * elapsed + 1, (admitted, elapsed)
    for i, way in outcomes.items():
        assert (503, "SlowDown") in way, (i, way)
    assert metric(larder, "larder_client_throttled_total", access_key=READER_KEY) == refused
    # Only limited keys have a limits series (every key has its `larder_key_*` savings).
    limit_series = [line for line in larder.metrics().splitlines() if line.startswith("larder_client_")]
    assert limit_series and not any(f'access_key="{CLIENT_KEY}"' in line for line in limit_series), limit_series
    assert_dashboard_metrics_exported(larder, ("larder_client_",), 2, "a Larder with a key's limits")
    assert "request failed" not in larder.log_path.read_text()
    # An SDK retries SlowDown with backoff: a client that keeps to its retries slows down, and
    # every read succeeds.
    patient = larder.client(READER_KEY, READER_SECRET, retries={"max_attempts": 10, "mode": "standard"})
    for _ in range(15):
        assert patient.get_object(**params)["Body"].read() == b"rated"


def test_a_key_limited_in_bytes_a_second_is_paced_and_no_other_key_is(make_larder, workdir, direct, bucket):
    """A key limited to 2 MiB a second reads a cached 6 MiB object in about three seconds,
    every byte right, over HTTP/1.1 (boto3) and HTTP/2 (curl) alike; the other key reads it
    meanwhile at the cache's speed."""
    body = os.urandom(6 << 20)
    direct.put_object(Bucket=bucket, Key="big", Body=body)
    larder = limited(make_larder, workdir, 'bytes_per_second = "2MiB"')
    other = larder.client()
    assert other.get_object(Bucket=bucket, Key="big")["Body"].read() == body
    batch = larder.client(READER_KEY, READER_SECRET)
    result = {}

    def paced_read():
        started = time.monotonic()
        result["body"] = batch.get_object(Bucket=bucket, Key="big")["Body"].read()
        result["took"] = time.monotonic() - started

    reader = threading.Thread(target=paced_read)
    reader.start()
    fast = []
    while reader.is_alive() and len(fast) < 5:
        started = time.monotonic()
        assert other.get_object(Bucket=bucket, Key="big")["Body"].read() == body
        fast.append(time.monotonic() - started)
    reader.join(timeout=60)
    assert result["body"] == body
    # 6 MiB at 2 MiB/s, less a tenth of a second's burst: 2.9 s at the least.
    assert result["took"] >= 2.5, result["took"]
    assert len(fast) == 5 and max(fast) < 1.0, fast
    assert metric(larder, "larder_client_paced_seconds_total", access_key=READER_KEY) >= 2.5
    # Over HTTP/2 too (curl, cleartext with prior knowledge, a presigned URL).
    url = larder.client(READER_KEY, READER_SECRET, signature_version="s3v4").generate_presigned_url(
        "get_object", Params={"Bucket": bucket, "Key": "big"}, ExpiresIn=300)
    out = workdir / "paced-h2"
    started = time.monotonic()
    assert curl_h2(url, out) == ["2", "200"]
    took = time.monotonic() - started
    assert out.read_bytes() == body
    assert took >= 2.5, took
    # A range of it is paced by its own bytes: 512 KiB in about a quarter of a second.
    started = time.monotonic()
    part = batch.get_object(Bucket=bucket, Key="big", Range="bytes=1048576-1572863")["Body"].read()
    assert part == body[1 << 20:(1 << 20) + (512 << 10)]
    assert time.monotonic() - started < 2.0
