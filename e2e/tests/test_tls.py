"""TLS on the S3 listener (rustls): real clients verify Larder's certificate, and a renewed
certificate is served without a restart."""

import random
import re
import ssl
import subprocess
import time

from conftest import s3_client, wait_until, CLIENT_KEY, CLIENT_SECRET
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
