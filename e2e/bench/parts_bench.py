"""An object read by its parts (`GET ?partNumber=N`), as the AWS SDK for Java's multipart
download reads every object, through Larder and straight from the upstream, round after round:
how long each round took and what it cost the upstream.

    python3 e2e/bench/parts_bench.py --size 64 --part 8 --threads 8 --rounds 3

The upstream is MinIO behind the latency proxy (compare.py's: 20 ms + up to 30 ms before every
answer). One object of `--size` MiB is uploaded in parts of `--part` MiB (the last may be
shorter). Each round reads every part once, `--threads` at a time, each reader on its own
keep-alive connection, every body checked against the part's bytes. Direct reads are anonymous
(the bucket is public-read); Larder's are SigV4-presigned and verified. The upstream's GETs,
HEADs and bytes are counted at the latency proxy once it has gone quiet after the round. With
`--capped`, the proxy also caps each connection at S3's rate (compare.py's cold_capped). With
`--then-whole`, the object is then read whole once (one GET, as a job reading it after the
parts would): its time and what it cost the upstream. Not part of the test suite.
"""

import argparse
import http.client
import sys
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import BUCKET, S3_CONNECTION_MBPS, MiB, Bench, Target, content, s3_client  # noqa: E402


def upload(bench: Bench, key: str, size: int, part: int) -> list[tuple[int, int]]:
    """Upload `key` in parts of `part` bytes; each part's (first byte, length)."""
    data = content(key, size)
    spans = [(a, min(part, size - a)) for a in range(0, size, part)]
    s3 = s3_client(bench.minio.endpoint)
    up = s3.create_multipart_upload(Bucket=BUCKET, Key=key)
    done = [{"PartNumber": i + 1, "ETag": s3.upload_part(Bucket=BUCKET, Key=key, UploadId=up["UploadId"],
                                                         PartNumber=i + 1, Body=bytes(data[a:a + n]))["ETag"]}
            for i, (a, n) in enumerate(spans)]
    s3.complete_multipart_upload(Bucket=BUCKET, Key=key, UploadId=up["UploadId"],
                                 MultipartUpload={"Parts": done})
    return spans


def part_path(t: Target, key: str, n: int) -> str:
    if t.presigner is None:
        return f"/{BUCKET}/{key}?partNumber={n}"
    url = t.presigner.generate_presigned_url("get_object", Params={"Bucket": BUCKET, "Key": key, "PartNumber": n},
                                             ExpiresIn=3600)
    u = urllib.parse.urlsplit(url)
    return f"{u.path}?{u.query}"


def read_round(t: Target, key: str, size: int, spans, threads: int) -> tuple[float, dict[str, int]]:
    """Every part once, `threads` at a time: the round's wall time (ms) and its X-Cache counts."""
    data = content(key, size)
    paths = [part_path(t, key, i + 1) for i in range(len(spans))]
    conns = [http.client.HTTPConnection(t.host, t.port, timeout=120) for _ in range(threads)]
    for c in conns:
        c.connect()
    labels: dict[str, int] = {}

    def one(i: int):
        conn = conns[i % threads]
        conn.request("GET", paths[i])
        r = conn.getresponse()
        body = r.read()
        a, n = spans[i]
        if r.status != 206 or body != data[a:a + n]:
            raise RuntimeError(f"{t.name}: part {i + 1}: status {r.status}, {len(body)} bytes, wrong")
        return r.getheader("x-cache") or "-"

    t0 = time.perf_counter()
    # One worker per connection: part i goes to connection i % threads, never two at once.
    with ThreadPoolExecutor(threads) as pool:
        results = list(pool.map(lambda w: [one(i) for i in range(w, len(spans), threads)], range(threads)))
    ms = (time.perf_counter() - t0) * 1000
    for c in conns:
        c.close()
    for label in (x for r in results for x in r):
        labels[label] = labels.get(label, 0) + 1
    return ms, labels


def read_whole(t: Target, key: str, size: int) -> tuple[float, str]:
    """`key` read whole in one GET, checked: the wall time (ms) and its X-Cache."""
    path = f"/{BUCKET}/{key}"
    if t.presigner is not None:
        u = urllib.parse.urlsplit(t.presigner.generate_presigned_url(
            "get_object", Params={"Bucket": BUCKET, "Key": key}, ExpiresIn=3600))
        path = f"{u.path}?{u.query}"
    conn = http.client.HTTPConnection(t.host, t.port, timeout=120)
    conn.connect()
    t0 = time.perf_counter()
    conn.request("GET", path)
    r = conn.getresponse()
    body = r.read()
    ms = (time.perf_counter() - t0) * 1000
    conn.close()
    if r.status != 200 or body != content(key, size):
        raise RuntimeError(f"{t.name}: whole read: status {r.status}, {len(body)} bytes, wrong")
    return ms, r.getheader("x-cache") or "-"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=64, help="object MiB")
    ap.add_argument("--part", type=int, default=8, help="part MiB (at least 5, S3's least)")
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--then-whole", action="store_true", help="read the object whole after the rounds")
    ap.add_argument("--capped", action="store_true",
                    help=f"cap each upstream connection at {S3_CONNECTION_MBPS} MB/s, as S3 does")
    args = ap.parse_args()
    bench = Bench("quick", Path("/tmp"))
    try:
        bench.start()
        if args.capped:
            bench.proxy.control(f"limits?connection_mbps={S3_CONNECTION_MBPS}")
        size = args.size * MiB
        _, larder = bench.larder("larder", "--memory-capacity", "1GiB")
        for t in (bench.direct(), larder):
            key = f"parts-{t.name}"
            spans = upload(bench, key, size, args.part * MiB)
            for r in range(args.rounds):
                before = bench.settle()
                ms, labels = read_round(t, key, size, spans, args.threads)
                after = bench.settle()
                gets, heads = after["gets"] - before["gets"], after["heads"] - before["heads"]
                mib = (after["bytes"] - before["bytes"]) / MiB
                print(f"{t.name:7} round {r + 1}: {ms:8.1f} ms, {len(spans)} parts, upstream {gets} GETs "
                      f"{heads} HEADs {mib:.1f} MiB, x-cache {labels}", flush=True)
            if args.then_whole:
                before = bench.settle()
                ms, label = read_whole(t, key, size)
                after = bench.settle()
                print(f"{t.name:7} whole:   {ms:8.1f} ms, upstream {after['gets'] - before['gets']} GETs "
                      f"{after['heads'] - before['heads']} HEADs {(after['bytes'] - before['bytes']) / MiB:.1f} MiB, "
                      f"x-cache {label}", flush=True)
    finally:
        bench.stop()


if __name__ == "__main__":
    main()
