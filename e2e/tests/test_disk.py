"""The disk tier end to end: the real `larder` binary with --disk-path over real MinIO, restarted
gracefully and killed with SIGKILL; bytes checked against what was uploaded, upstream traffic
counted by the pass-through in front of MinIO."""

import random
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

MiB = 1 << 20


def disk_args(workdir, name, *extra):
    return ("--disk-path", str(workdir / f"{name}.cache"), "--disk-capacity", "512MiB",
            "--disk-region-size", "32MiB", "--memory-capacity", "64MiB", *extra)


def metric(larder, name):
    m = re.search(rf"^larder_{name}(?:_total)? (\d+)", larder.metrics(), re.M)
    assert m, f"metric {name} missing"
    return int(m.group(1))


def test_a_restarted_larder_serves_from_disk_with_zero_upstream_gets(workdir, make_larder, direct, bucket, upstream):
    rng = random.Random(11)
    objects = {"big.bin": rng.randbytes(40 * MiB + 123), "small.bin": rng.randbytes(1000),
               "dir/mid.bin": rng.randbytes(9 * MiB)}
    for key, data in objects.items():
        direct.put_object(Bucket=bucket, Key=key, Body=data)
    first = make_larder(*disk_args(workdir, "restart"), name="disk-first")
    client = first.client()
    for key, data in objects.items():
        assert client.get_object(Bucket=bucket, Key=key)["Body"].read() == data
    first.stop()  # SIGTERM: graceful, finishes the disk writes in flight

    upstream.reset()
    second = make_larder(*disk_args(workdir, "restart"), name="disk-second")
    assert metric(second, "disk_recovered_entries") >= 5 + 2 + 1
    client = second.client()
    # A small range across a block boundary, first: read from disk by range (only the chunks it
    # touches), before anything is promoted to memory.
    a = 8 * MiB - 10
    resp = client.get_object(Bucket=bucket, Key="big.bin", Range=f"bytes={a}-{a + 99}")
    assert resp["Body"].read() == objects["big.bin"][a:a + 100]
    assert resp["ResponseMetadata"]["HTTPHeaders"]["x-cache"] == "hit-disk"
    for key, data in objects.items():
        resp = client.get_object(Bucket=bucket, Key=key)
        assert resp["Body"].read() == data
        assert resp["ResponseMetadata"]["HTTPHeaders"]["x-cache"] == "hit-disk", key
    for key in objects:
        assert upstream.seen("GET", f"/{bucket}/{key}") == [], key
    # Disk counters are read at most every 100 ms for the metrics: give them a moment.
    deadline = time.monotonic() + 5
    while metric(second, "disk_hits") < 8 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert metric(second, "disk_hits") >= 8
    assert metric(second, "disk_corrupt_reads") == 0


def test_sigkill_during_heavy_writes_never_serves_wrong_bytes(workdir, make_larder, direct, bucket):
    rng = random.Random(12)
    objects = {f"obj-{i}.bin": rng.randbytes(rng.randrange(1, 20) * MiB + rng.randrange(MiB)) for i in range(24)}
    for key, data in objects.items():
        direct.put_object(Bucket=bucket, Key=key, Body=data)
    recovered = []
    for round_ in range(3):
        larder = make_larder(*disk_args(workdir, "sigkill", "--disk-write-rate", "0"), name=f"disk-kill-{round_}")
        recovered.append(metric(larder, "disk_recovered_entries"))
        stop = threading.Event()

        def reader(seed):
            client = larder.client(retries={"max_attempts": 1})
            r = random.Random(seed)
            while not stop.is_set():
                key = r.choice(list(objects))
                try:
                    client.get_object(Bucket=bucket, Key=key)["Body"].read()
                except Exception:  # the kill cuts reads off mid-body; that is the point
                    return

        threads = [threading.Thread(target=reader, args=(round_ * 10 + i,)) for i in range(6)]
        for t in threads:
            t.start()
        time.sleep(1.0 + round_ * 0.7)
        larder.proc.kill()  # SIGKILL, mid-write
        stop.set()
        for t in threads:
            t.join(timeout=30)
        larder.proc.wait(timeout=10)

    # After the last kill: everything served is exactly what was uploaded.
    larder = make_larder(*disk_args(workdir, "sigkill"), name="disk-kill-verify")
    client = larder.client()
    for key, data in objects.items():
        assert client.get_object(Bucket=bucket, Key=key)["Body"].read() == data, key
    assert max(recovered[1:] + [metric(larder, "disk_recovered_entries")]) > 0, recovered
    assert metric(larder, "disk_hits") > 0
