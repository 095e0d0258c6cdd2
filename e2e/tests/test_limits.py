"""A slow or greedy client cannot take the S3 listener away from everyone else."""

import socket
import threading
import time

from test_headers_errors import raw


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
