"""Larder on S3's bad days: a fault-injecting pass-through between Larder and the real S3 server
answers 500/503, resets connections, cuts bodies mid-stream and adds latency. Clients (boto3, the
aws CLI) must get correct bytes or a clean S3 error — never a truncated or mixed body — and the
requests that reach the upstream stay within the stated bounds. Also: warm-up through
`larder warm`, and read-ahead, counted at the upstream."""

import json
import random
import re
import subprocess
import threading
import time

import pytest
from botocore.exceptions import BotoCoreError, ClientError

from conftest import CLIENT_KEY, READER_KEY, READER_SECRET, LatencyProxy, binary, metric, wait_until
from counting_proxy import CountingProxy
from test_auth import fetch

MiB = 1 << 20
BLOCK = 8 * MiB


@pytest.fixture
def faulty(minio):
    p = CountingProxy("127.0.0.1", minio.port)
    yield p
    p.close()


def start(make_larder, faulty, *extra, name="resilient"):
    return make_larder(*extra, name=name, upstream_url=f"http://127.0.0.1:{faulty.port}")


def object_gets(proxy, bucket, key):
    return [r for r in proxy.seen("GET", f"/{bucket}/{key}") if r[2]]


def test_5xx_and_slowdown_are_retried_within_the_attempt_budget(make_larder, faulty, direct, bucket):
    data = random.Random(1).randbytes(3 * MiB)
    direct.put_object(Bucket=bucket, Key="k", Body=data)
    direct.put_object(Bucket=bucket, Key="k2", Body=data)
    larder = start(make_larder, faulty)
    # The cold read's one GET (it brings the metadata too): 500, 503, then the good one — 3
    # attempts, the budget.
    faulty.inject("status", 1, (500, "InternalError"), method="GET")
    faulty.inject("status", 1, (503, "SlowDown"), method="GET")
    assert larder.client().get_object(Bucket=bucket, Key="k")["Body"].read() == data
    assert len(object_gets(faulty, bucket, "k")) == 3
    # A connection reset before any answer: retried too.
    faulty.inject("reset", 1, method="GET")
    assert larder.client().get_object(Bucket=bucket, Key="k2")["Body"].read() == data
    assert len(object_gets(faulty, bucket, "k2")) == 2
    # A client's HEAD is answered from an upstream HEAD, retried the same way.
    direct.put_object(Bucket=bucket, Key="k3", Body=b"x")
    faulty.inject("status", 1, (500, "InternalError"), method="HEAD")
    assert larder.client().head_object(Bucket=bucket, Key="k3")["ContentLength"] == 1
    assert len(faulty.seen("HEAD", f"/{bucket}/k3")) == 2


def test_a_persistent_5xx_is_a_clean_s3_error_after_the_budget(make_larder, faulty, direct, bucket):
    direct.put_object(Bucket=bucket, Key="k", Body=b"x" * 1000)
    larder = start(make_larder, faulty)
    faulty.inject("status", 100, (503, "SlowDown"), method=None)
    no_retries = larder.client(retries={"total_max_attempts": 1})
    with pytest.raises(ClientError) as e:
        no_retries.get_object(Bucket=bucket, Key="k")
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] in (500, 503)
    assert e.value.response["Error"]["Code"] in ("SlowDown", "ServiceUnavailable", "InternalError")
    # The first GET, sent before the prefix was paced, found the limit and does not count;
    # then upstream_max_attempts (3) paced attempts.
    assert len(faulty.seen(None, f"/{bucket}/k")) == 4, faulty.seen(None, f"/{bucket}/k")


def test_a_body_cut_mid_stream_is_resumed_and_the_client_sees_one_whole_body(make_larder, faulty, direct, bucket):
    data = random.Random(2).randbytes(3 * BLOCK)
    direct.put_object(Bucket=bucket, Key="k", Body=data)
    larder = start(make_larder, faulty)
    faulty.inject("cut", 2, 3 * MiB + 17)
    assert larder.client().get_object(Bucket=bucket, Key="k")["Body"].read() == data
    gets = object_gets(faulty, bucket, "k")
    # 3 blocks and 2 cuts (on whichever GETs came first, resumes included): 5 GETs, and each
    # resume starts exactly where a body broke.
    assert len(gets) == 5, gets
    starts = sorted(int(r[2].removeprefix("bytes=").split("-")[0]) for r in gets)
    resumed = [s for s in starts if s % BLOCK]
    assert len(resumed) == 2 and all((s % BLOCK) % (3 * MiB + 17) == 0 for s in resumed), starts
    # The aws CLI, too, through a fresh Larder (nothing cached), with a cut on every block.
    cli_larder = start(make_larder, faulty, name="resilient-cli")
    faulty.reset()
    faulty.inject("cut", 3, 1 * MiB)
    out = cli_larder.log_path.parent / "cli-download.bin"
    subprocess.run(["aws", "s3", "cp", f"s3://{bucket}/k", str(out), "--endpoint-url", cli_larder.endpoint],
                   check=True, env=cli_larder.cli_env(), capture_output=True, timeout=120)
    assert out.read_bytes() == data


def test_a_body_that_keeps_breaking_fails_loudly_not_short(make_larder, faulty, direct, bucket):
    data = random.Random(3).randbytes(BLOCK)
    direct.put_object(Bucket=bucket, Key="k", Body=data)
    larder = start(make_larder, faulty, "--upstream-max-resumes", "2", "--upstream-idle-timeout", "5s")
    faulty.inject("cut", 100, 2 * MiB)
    no_retries = larder.client(retries={"total_max_attempts": 1})
    with pytest.raises((BotoCoreError, ClientError)):
        # Either the first block fails before the headers (a clean 5xx) or the body ends short of
        # its Content-Length, which botocore reports: never a short body taken as whole.
        body = no_retries.get_object(Bucket=bucket, Key="k")["Body"].read()
        assert len(body) == len(data)
    # 1 GET + 2 resumes, then the read stopped.
    assert len(object_gets(faulty, bucket, "k")) == 3


def test_stale_metadata_is_served_while_the_upstream_is_down_only_when_allowed(make_larder, faulty, direct, bucket):
    data = b"s" * 100_000
    direct.put_object(Bucket=bucket, Key="k", Body=data)
    stale = start(make_larder, faulty, "--metadata-ttl", "1s", "--serve-stale-on-error", "1h", name="stale")
    strict = start(make_larder, faulty, "--metadata-ttl", "1s", name="strict")
    for larder in (stale, strict):
        assert larder.client().get_object(Bucket=bucket, Key="k")["Body"].read() == data
    time.sleep(1.5)
    faulty.inject("status", 1000, (503, "ServiceUnavailable"), method=None)
    r = stale.client().get_object(Bucket=bucket, Key="k")
    assert r["Body"].read() == data
    assert r["ResponseMetadata"]["HTTPHeaders"]["x-cache"] == "stale-hit-memory"
    with pytest.raises(ClientError) as e:
        strict.client(retries={"total_max_attempts": 1}).get_object(Bucket=bucket, Key="k")
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
    # A hot object while the upstream is down: its reads are served stale without asking the
    # failing upstream each time, only the first read of each second does (up to 3 attempts).
    # Every read used to send its own, and wait for its retries: 30 reads took 90 s.
    client = stale.client()
    asked_before = len(faulty.seen(None, f"/{bucket}/k"))
    started = time.monotonic()
    for _ in range(30):
        r = client.get_object(Bucket=bucket, Key="k")
        assert r["Body"].read() == data
        assert r["ResponseMetadata"]["HTTPHeaders"]["x-cache"] == "stale-hit-memory"
    seconds = time.monotonic() - started
    asked = len(faulty.seen(None, f"/{bucket}/k")) - asked_before
    print(f"during the outage: {asked} upstream requests for 30 stale reads in {seconds:.2f} s")
    assert asked <= 6, f"{asked} upstream requests for 30 reads in {seconds:.2f} s"
    # Nor does any read wait for the upstream once the outage is known: the revalidation each
    # second runs behind a read served stale. The read that revalidated used to wait for its
    # retries, about 2 s, every second or so.
    asked_before = len(faulty.seen(None, f"/{bucket}/k"))
    started, reads, slowest = time.monotonic(), 0, 0.0
    while time.monotonic() - started < 4.0:
        t0 = time.monotonic()
        r = client.get_object(Bucket=bucket, Key="k")
        assert r["Body"].read() == data
        assert r["ResponseMetadata"]["HTTPHeaders"]["x-cache"] == "stale-hit-memory"
        slowest = max(slowest, time.monotonic() - t0)
        reads += 1
    seconds = time.monotonic() - started
    asked = len(faulty.seen(None, f"/{bucket}/k")) - asked_before
    print(f"then {reads} stale reads in {seconds:.2f} s, the slowest {slowest * 1000:.0f} ms, "
          f"{asked} upstream requests")
    assert slowest < 1.0, f"a stale read waited {slowest:.2f} s for the failing upstream"
    assert asked <= 3 * (int(seconds) + 2), f"{asked} upstream requests in {seconds:.2f} s"


def test_a_slow_block_get_is_hedged(make_larder, faulty, direct, bucket):
    larder = start(make_larder, faulty, "--upstream-hedge-quantile", "0.9", "--block-size", "1MiB",
                   "--prefetch", "off")
    client = larder.client()
    for i in range(70):  # 70 fast block GETs teach Larder what normal looks like
        direct.put_object(Bucket=bucket, Key=f"warmup/{i}", Body=b"w" * 1000)
        client.get_object(Bucket=bucket, Key=f"warmup/{i}")["Body"].read()
    direct.put_object(Bucket=bucket, Key="slow", Body=b"z" * 5000)
    client.head_object(Bucket=bucket, Key="slow")  # metadata first, so only the GET is slow
    faulty.inject("delay", 1, 5.0)
    started = time.monotonic()
    assert client.get_object(Bucket=bucket, Key="slow")["Body"].read() == b"z" * 5000
    took = time.monotonic() - started
    assert took < 4.0, f"the hedge should have answered well before the 5 s stall, took {took:.1f}s"
    assert len(object_gets(faulty, bucket, "slow")) == 2
    won = re.search(r'^larder_upstream_hedges_total\{outcome="won"\} (\d+)', larder.metrics(), re.M)
    assert won and int(won.group(1)) >= 1


def test_larder_warm_fills_the_cache_so_the_job_reads_without_upstream_gets(make_larder, faulty, direct, bucket, workdir):
    rng = random.Random(4)
    objects = {f"table/part-{i}.parquet": rng.randbytes(rng.randint(1, 3 * MiB)) for i in range(5)}
    skip = rng.randbytes(4 * MiB + 5)
    objects["other/skip.bin"] = skip
    for key, data in objects.items():
        direct.put_object(Bucket=bucket, Key=key, Body=data)
    larder = start(make_larder, faulty, "--disk-path", str(workdir / f"{bucket}.cache"), "--disk-capacity", "512MiB",
                   "--disk-region-size", "32MiB", "--memory-capacity", "64MiB", "--block-size", "1MiB", name="warm")
    warm = subprocess.run([binary("larder"), "warm", "--admin", larder.admin, f"s3://{bucket}/table/"],
                          capture_output=True, text=True, timeout=300)
    assert warm.returncode == 0, warm.stderr
    assert "100.0%" in warm.stderr and "0 errors" in warm.stderr, warm.stderr
    # The warm fetched each block of the prefix once, and nothing outside it.
    table_blocks = sum(-(-len(d) // MiB) for k, d in objects.items() if k.startswith("table/"))
    assert len(object_gets(faulty, bucket, "table/")) == table_blocks
    assert faulty.seen(None, f"/{bucket}/other/") == []
    faulty.reset()
    client = larder.client()
    for key, data in objects.items():
        if key.startswith("table/"):
            r = client.get_object(Bucket=bucket, Key=key)
            assert r["Body"].read() == data
            assert r["ResponseMetadata"]["HTTPHeaders"]["x-cache"] == "hit-disk", key
    assert object_gets(faulty, bucket, "table/") == [], "the job's reads went upstream"

    # A range of one key: only the blocks under it are warmed (the last 64 KiB of 4 MiB + 5
    # bytes: the last two of five blocks).
    footer = subprocess.run([binary("larder"), "warm", "--admin", larder.admin, "--range", "bytes=-65536",
                             f"s3://{bucket}/other/skip.bin"], capture_output=True, text=True, timeout=60)
    assert footer.returncode == 0, footer.stderr
    assert sorted(r[2] for r in object_gets(faulty, bucket, "other/skip.bin")) == [
        f"bytes={3 * MiB}-{4 * MiB - 1}", f"bytes={4 * MiB}-{4 * MiB + 4}"]
    faulty.reset()
    r = client.get_object(Bucket=bucket, Key="other/skip.bin", Range="bytes=-65536")
    assert r["Body"].read() == skip[-65536:]
    assert r["ResponseMetadata"]["HTTPHeaders"]["x-cache"] == "hit-disk"
    assert object_gets(faulty, bucket, "other/skip.bin") == []
    # The rest of that key stayed cold: its bytes come from the upstream (just those asked, a
    # range this much smaller than its block being fetched as asked).
    r = client.get_object(Bucket=bucket, Key="other/skip.bin", Range="bytes=0-99")
    assert r["Body"].read() == skip[:100]
    assert r["ResponseMetadata"]["HTTPHeaders"]["x-cache"] == "miss"
    assert [g[2] for g in object_gets(faulty, bucket, "other/skip.bin")] == ["bytes=0-99"]

    # A job that cannot succeed (exit code 1).
    missing = subprocess.run([binary("larder"), "warm", "--admin", larder.admin, "--exact",
                              f"s3://{bucket}/no/such/key"], capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1 and "1 errors" in missing.stderr, missing.stderr


def test_a_recorded_access_profile_warms_just_the_ranges_the_job_read(make_larder, faulty, direct, bucket, workdir):
    # Three "Parquet files" of 3 MiB and a bit; a job reads each one's footer and one column
    # chunk, a small share of the whole.
    rng = random.Random(12)
    files = {f"lake/part-{i}.parquet": rng.randbytes(3 * MiB + 1000 * i) for i in range(3)}
    for key, data in files.items():
        direct.put_object(Bucket=bucket, Key=key, Body=data)
    chunk = (MiB + 100, MiB + 300_000)
    # Recorded on a Larder with the default 8 MiB blocks; the profile is of bytes, so it warms
    # a Larder of another block size just as well.
    recorder = start(make_larder, faulty, name="recorder")
    # Misspelt filters and bad durations are refused, and nothing records.
    for bad in ("acces_key=x", "for=0s", "for=8d", "for=soon"):
        status, answer = fetch(f"{recorder.admin}/profile?{bad}", "PUT")
        assert status == 400, (bad, answer)
    assert json.loads(fetch(f"{recorder.admin}/profile")[1])["recording"] is False
    # Only the job's key is recorded.
    status, answer = fetch(f"{recorder.admin}/profile?access_key={CLIENT_KEY}&for=10m", "PUT")
    assert status == 200 and json.loads(answer)["recording"] is True, answer
    job = recorder.client()
    for key, data in files.items():
        r = job.get_object(Bucket=bucket, Key=key, Range="bytes=-65536")
        assert r["Body"].read() == data[-65536:]
        r = job.get_object(Bucket=bucket, Key=key, Range=f"bytes={chunk[0]}-{chunk[1]}")
        assert r["Body"].read() == data[chunk[0]:chunk[1] + 1]
        job.head_object(Bucket=bucket, Key=key)
    # Another tenant's read of a range the job never read.
    other = recorder.client(READER_KEY, READER_SECRET)
    assert other.get_object(Bucket=bucket, Key="lake/part-0.parquet", Range="bytes=0-99")["Body"].read() == \
        files["lake/part-0.parquet"][:100]
    status, answer = fetch(f"{recorder.admin}/profile", "DELETE")
    profile = json.loads(answer)
    assert status == 200 and profile["recording"] is False, answer
    assert (profile["reads"], profile["objects"], profile["not_recorded"]) == (6, 3, 0), answer
    assert profile["access_key"] == CLIENT_KEY
    assert profile["warm"] == [{"bucket": bucket, "keys": [], "prefix": None, "range": None, "objects": [
        {"key": key, "ranges": [f"bytes={chunk[0]}-{chunk[1]}", f"bytes={len(d) - 65536}-{len(d) - 1}"]}
        for key, d in files.items()]}], answer
    saved = workdir / "job.profile.json"
    saved.write_bytes(answer)
    # A read after the stop is not recorded.
    job.get_object(Bucket=bucket, Key="lake/part-1.parquet", Range="bytes=0-9")["Body"].read()
    assert json.loads(fetch(f"{recorder.admin}/profile")[1])["reads"] == 6

    # A fresh Larder with 1 MiB blocks and a disk tier, warmed from the profile.
    faulty.reset()
    fresh = start(make_larder, faulty, "--disk-path", str(workdir / "fresh.cache"), "--disk-capacity", "256MiB",
                  "--disk-region-size", "16MiB", "--memory-capacity", "64MiB", "--block-size", "1MiB", name="fresh")
    warm = subprocess.run([binary("larder"), "warm", "--admin", fresh.admin, "--profile", str(saved)],
                          capture_output=True, text=True, timeout=300)
    assert warm.returncode == 0, warm.stderr
    assert "3/3 objects" in warm.stderr and "0 errors" in warm.stderr, warm.stderr

    def blocks_under(size, first, last):
        return {(b * MiB, min((b + 1) * MiB, size) - 1) for b in range(first // MiB, last // MiB + 1)}

    # The warm fetched the blocks under the ranges read, each once, and nothing else.
    expected = []
    for key, d in files.items():
        under = blocks_under(len(d), *chunk) | blocks_under(len(d), len(d) - 65536, len(d) - 1)
        expected += [(f"/{bucket}/{key}", f"bytes={a}-{b}") for a, b in sorted(under)]
    assert sorted((g[1], g[2]) for g in object_gets(faulty, bucket, "lake/")) == sorted(expected)
    faulty.reset()
    # The job's next run reads from the disk tier, with no upstream GET.
    job = fresh.client()
    for key, data in files.items():
        r = job.get_object(Bucket=bucket, Key=key, Range="bytes=-65536")
        assert r["Body"].read() == data[-65536:]
        assert r["ResponseMetadata"]["HTTPHeaders"]["x-cache"] == "hit-disk", key
        r = job.get_object(Bucket=bucket, Key=key, Range=f"bytes={chunk[0]}-{chunk[1]}")
        assert r["Body"].read() == data[chunk[0]:chunk[1] + 1]
        assert r["ResponseMetadata"]["HTTPHeaders"]["x-cache"] == "hit-disk", key
    assert object_gets(faulty, bucket, "lake/") == [], "the job's reads went upstream"
    # What the other tenant read was not warmed.
    r = job.get_object(Bucket=bucket, Key="lake/part-0.parquet", Range="bytes=0-99")
    assert r["Body"].read() == files["lake/part-0.parquet"][:100]
    assert r["ResponseMetadata"]["HTTPHeaders"]["x-cache"] == "miss"

    # A timed recording stops by itself; a profile with no reads is refused by the CLI.
    assert fetch(f"{fresh.admin}/profile?for=1s", "PUT")[0] == 200
    wait_until(lambda: json.loads(fetch(f"{fresh.admin}/profile")[1])["recording"] is False, timeout=15,
               what="the timed recording's stop")
    empty = workdir / "empty.profile.json"
    empty.write_bytes(fetch(f"{fresh.admin}/profile")[1])
    r = subprocess.run([binary("larder"), "warm", "--admin", fresh.admin, "--profile", str(empty)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "holds no reads" in r.stderr, r.stderr


def prefetch_metric(larder, name, outcome) -> float:
    m = re.search(rf'^larder_prefetch_{name}_total\{{outcome="{outcome}"\}} (\S+)', larder.metrics(), re.M)
    return float(m.group(1)) if m else 0.0


@pytest.mark.parametrize("mode", ["auto", "off"])
def test_in_order_ranged_reads_are_read_ahead(make_larder, faulty, direct, bucket, mode):
    size = 16 * MiB
    data = random.Random(5).randbytes(size)
    direct.put_object(Bucket=bucket, Key="stream.bin", Body=data)
    larder = start(make_larder, faulty, "--block-size", "1MiB", "--memory-capacity", "64MiB", "--prefetch", mode,
                   name=f"prefetch-{mode}")
    faulty.delay = 0.02  # an upstream as slow as S3, so reading ahead has something to win
    client = larder.client()
    served = []
    for i in range(16):
        r = client.get_object(Bucket=bucket, Key="stream.bin", Range=f"bytes={i * MiB}-{(i + 1) * MiB - 1}")
        assert r["Body"].read() == data[i * MiB:(i + 1) * MiB]
        served.append(r["ResponseMetadata"]["HTTPHeaders"]["x-cache"])
    faulty.delay = 0
    gets = object_gets(faulty, bucket, "stream.bin")
    # Read ahead or not, each block left the upstream exactly once, and nothing past the object.
    assert sorted(g[2] for g in gets) == sorted(f"bytes={i * MiB}-{(i + 1) * MiB - 1}" for i in range(16)), gets
    issued = prefetch_metric(larder, "blocks", "issued")
    used = prefetch_metric(larder, "bytes", "used")
    if mode == "off":
        assert served == ["miss"] * 16, served
        assert issued == 0 and used == 0
        return
    # The first two reads show the order; after them the reader found its blocks fetched or in
    # flight (a demand miss at most now and then, when the reader overtakes).
    assert served[:1] == ["miss"], served
    assert sum(s == "miss" for s in served[2:]) <= 2, served
    assert issued >= 12, issued
    # Every block read ahead was then read: all of it used, none wasted.
    assert used == issued * MiB, (used, issued)
    assert prefetch_metric(larder, "bytes", "wasted") == 0


def test_an_upstream_that_stalls_without_closing_is_timed_out_and_retried(make_larder, faulty, direct, bucket):
    data = random.Random(6).randbytes(3 * MiB)
    for key in ("hang", "stall", "dead"):
        direct.put_object(Bucket=bucket, Key=key, Body=data)
    larder = start(make_larder, faulty, "--upstream-first-byte-timeout", "1s", "--upstream-idle-timeout", "1s",
                   "--block-size", "1MiB", "--prefetch", "off")
    client = larder.client(read_timeout=30)
    # No headers at all: the attempt ends at the first-byte timeout and the next one is answered.
    faulty.inject("hang", 1, method="GET")
    started = time.monotonic()
    assert client.get_object(Bucket=bucket, Key="hang", Range="bytes=0-99")["Body"].read() == data[:100]
    took = time.monotonic() - started
    assert 0.9 < took < 10, f"took {took:.1f}s against a 1 s first-byte timeout"
    # (A cold range this small is fetched as asked: `cold_ranges = "exact"`.)
    assert [g[2] for g in object_gets(faulty, bucket, "hang")] == ["bytes=0-99"] * 2
    # Headers and part of the body, then silence: the fetch resumes where the bytes stopped.
    faulty.inject("stall", 1, 300_000, method="GET")
    started = time.monotonic()
    assert client.get_object(Bucket=bucket, Key="stall")["Body"].read() == data
    took = time.monotonic() - started
    assert 0.9 < took < 10, f"took {took:.1f}s against a 1 s idle timeout"
    ranges = [g[2] for g in object_gets(faulty, bucket, "stall")]
    assert f"bytes=300000-{MiB - 1}" in ranges and len(ranges) == 4, ranges
    # An upstream that never answers: a clean 5xx after the attempt budget, not a hung client.
    faulty.inject("hang", 10, method="GET")
    started = time.monotonic()
    with pytest.raises(ClientError) as e:
        larder.client(read_timeout=30, retries={"total_max_attempts": 1}).get_object(Bucket=bucket, Key="dead")
    took = time.monotonic() - started
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] in (500, 503, 504), e.value.response
    assert len(object_gets(faulty, bucket, "dead")) == 3
    assert took < 15, f"a dead upstream held the client {took:.1f}s"


def test_a_body_silent_for_less_than_the_idle_timeout_is_waited_for_not_cut(make_larder, faulty, direct, bucket):
    """How long an upstream body may fall silent is `upstream_idle_timeout`'s to say. The S3
    client's own stalled-stream protection used to cut any body silent for about 5 s, whatever
    the setting, and the resume layer then asked for the rest again (this test failed so, after
    6 s)."""
    data = random.Random(8).randbytes(MiB)
    direct.put_object(Bucket=bucket, Key="paused", Body=data)
    larder = start(make_larder, faulty, "--upstream-idle-timeout", "20s", "--block-size", "1MiB",
                   "--prefetch", "off")
    faulty.inject("pause", 1, (300_000, 9), method="GET")
    started = time.monotonic()
    assert larder.client(read_timeout=60).get_object(Bucket=bucket, Key="paused")["Body"].read() == data
    took = time.monotonic() - started
    assert 9 <= took < 20, f"took {took:.1f}s for a 9 s pause"
    # One GET, read to its end: nothing cut it and nothing asked for its rest again.
    assert [g[2] for g in object_gets(faulty, bucket, "paused")] == [f"bytes=0-{MiB - 1}"]
    assert metric(larder, "larder_upstream_resumes_total") == 0


@pytest.fixture
def s3_like(workdir, minio):
    """The latency proxy in front of MinIO: 5 ms per request, and S3's per-prefix rate limit."""
    p = LatencyProxy(workdir, minio.port)
    p.latency(delay_ms=5, jitter_ms=0, tail_fraction=0, tail_ms=0)
    yield p
    p.stop()


def test_a_cold_read_to_the_end_from_a_near_upstream_is_one_get(make_larder, s3_like, direct, bucket):
    """An upstream whose one connection brings several blocks per round trip (the latency proxy
    on loopback, 100 ms before each answer): once Larder has measured it, a cold GET of a whole
    object asks its first upstream GET for the blocks a round trip brings, instead of asking
    for each further block a round trip later. One GET for a four-block object, every byte
    right; without the run it is four."""
    objs = {f"near/o{i}": random.Random(200 + i).randbytes(4 * MiB) for i in range(3)}
    for key, body in objs.items():
        direct.put_object(Bucket=bucket, Key=key, Body=body)
    larder = make_larder("--block-size", "1MiB", "--memory-capacity", "64MiB", name="near",
                         upstream_url=s3_like.endpoint)
    s3_like.latency(delay_ms=100, jitter_ms=0, tail_fraction=0, tail_ms=0)
    client = larder.client()
    # The first cold read measures the round trip, and the rate on its first block.
    assert client.get_object(Bucket=bucket, Key="near/o0")["Body"].read() == objs["near/o0"]
    assert metric(larder, "larder_upstream_run_blocks_total") == 0
    s3_like.control("reset")
    assert client.get_object(Bucket=bucket, Key="near/o1")["Body"].read() == objs["near/o1"]
    # 1 MiB per round trip needs only 10 MB/s through the proxy: the run covers the object.
    assert s3_like.control("stats")["by_method"].get("GET", 0) == 1
    # Counted as each block's fetch ends, which may be a moment after its bytes went out.
    wait_until(lambda: metric(larder, "larder_upstream_run_blocks_total") >= 3, 5, "the run's blocks counted")
    assert metric(larder, "larder_upstream_run_blocks_total") == 3
    # Cached block by block, as any fetch: a range in the last block is a hit.
    last = client.get_object(Bucket=bucket, Key="near/o1", Range=f"bytes={3 * MiB}-{3 * MiB + 99}")
    assert last["Body"].read() == objs["near/o1"][3 * MiB:3 * MiB + 100]
    assert s3_like.control("stats")["by_method"].get("GET", 0) == 1

    # The upstream turns S3-shaped: 10 MB/s per connection, 1 MB per round trip. The next run,
    # planned on the old rate, stops once its first block came at under half that rate: the
    # second block, whose bytes are already on their way, still comes in the run (a GET of its
    # own would ask them again), and the last two are asked for at once, a GET each; without
    # the stop, one slow connection would bring all four.
    s3_like.limits(connection_mbps=10)
    s3_like.control("reset")
    assert client.get_object(Bucket=bucket, Key="near/o2")["Body"].read() == objs["near/o2"]
    assert s3_like.control("stats")["by_method"].get("GET", 0) == 3
    wait_until(lambda: metric(larder, "larder_upstream_run_blocks_total") >= 4, 5, "the run's blocks counted")
    assert metric(larder, "larder_upstream_run_blocks_total") == 4


def test_a_prefix_answering_slowdown_is_paced_and_other_prefixes_are_not(make_larder, s3_like, direct, bucket):
    """S3 answers 503 SlowDown past a prefix's request rate. Larder, fanning each cold read out
    into block GETs, must slow down that prefix, not every request to the upstream, and not
    keep hammering it: its block GETs wait for the prefix's pace, so few are refused, clients
    get every byte, and a read of another prefix goes out at once."""
    rps = 10
    hot = {f"hot/o{i}": random.Random(i).randbytes(MiB) for i in range(16)}
    cool = random.Random(99).randbytes(768 * 1024)
    for key, body in hot.items():
        direct.put_object(Bucket=bucket, Key=key, Body=body)
    direct.put_object(Bucket=bucket, Key="cool/o", Body=cool)
    larder = make_larder("--block-size", "256KiB", "--memory-capacity", "64MiB", name="throttled",
                         upstream_url=s3_like.endpoint)
    s3_like.limits(prefix_rps=rps)
    s3_like.control("reset")

    # 16 readers at once, each object 4 blocks: 64 block GETs wanted at once of a prefix that
    # allows 10 a second (after a burst of 10). A real client, with its own default retries.
    client = larder.client(retries={"mode": "standard", "max_attempts": 3})
    got = {}

    def read(key):
        try:
            got[key] = client.get_object(Bucket=bucket, Key=key)["Body"].read()
        except Exception as e:  # noqa: BLE001 - reported below, per key
            got[key] = e

    readers = [threading.Thread(target=read, args=(k,)) for k in hot]
    for t in readers:
        t.start()
    # Once the hot prefix is paced, a cold read of another (3 blocks, within its own burst)
    # goes out at once: paced with the hot one, it would wait ~0.3 s or more for tokens.
    wait_until(lambda: metric(larder, "larder_upstream_throttle_total", event="limited") >= 1, 10,
               "the hot prefix throttled")
    started = time.monotonic()
    assert larder.client().get_object(Bucket=bucket, Key="cool/o")["Body"].read() == cool
    cool_took = time.monotonic() - started
    for t in readers:
        t.join(timeout=60)
    # Compared per key, not as one dict: pytest's diff of 16 MiB of bodies takes many minutes.
    wrong = {k: (repr(v)[:200] if isinstance(v, Exception) else f"{len(v)} bytes, not the object's")
             for k, v in got.items() if not isinstance(v, bytes) or v != hot[k]}
    assert not wrong and len(got) == len(hot), f"every hot body whole and right: {wrong}"
    assert cool_took < 0.25, f"the other prefix's read took {cool_took:.3f} s"

    stats = s3_like.control("stats")["by_method"]
    forwarded, refused = stats.get("GET", 0) + stats.get("HEAD", 0), stats.get("SlowDown", 0)
    # Without pacing, every block GET retried on its own backoff: refused requests outnumber
    # the forwarded ones several times over (measured: see the closing note of issue 19).
    print(f"\nthe throttled prefix: {forwarded} requests forwarded, {refused} refused; the other prefix's read"
          f" {cool_took * 1000:.1f} ms")
    assert refused <= forwarded // 2, f"{refused} refused against {forwarded} forwarded"
    assert metric(larder, "larder_upstream_throttle_total", event="delayed") > 0


def test_a_block_fetched_in_pieces_is_pinned_piece_by_piece_and_served_whole(make_larder, faulty, direct, bucket):
    """`upstream_fetch_pieces`: each block of an object whose version is known goes out as
    ranged GETs sent at once, every one pinned with If-Match to the ETag (so no piece can come
    from another version), and the client gets the object whole, a piece cut part-way resumed
    from its byte."""
    data = random.Random(5).randbytes(2 * BLOCK + 3 * MiB)  # blocks of 8, 8 and 3 MiB
    direct.put_object(Bucket=bucket, Key="k", Body=data)
    etag = direct.head_object(Bucket=bucket, Key="k")["ETag"]
    larder = start(make_larder, faulty, "--upstream-fetch-pieces", "4", name="pieces")
    client = larder.client()
    # The HEAD makes the version known, so every block GET is pinned and cut in pieces.
    assert client.head_object(Bucket=bucket, Key="k")["ETag"] == etag
    faulty.inject("cut", 1, 700 * 1024, method="GET")
    assert client.get_object(Bucket=bucket, Key="k")["Body"].read() == data
    gets = faulty.seen_with_headers("GET", f"/{bucket}/k")
    assert gets and all(h.get("if-match") == etag for _, _, h in gets), [h.get("if-match") for _, _, h in gets]
    ranges = sorted(tuple(int(x) for x in h["range"].removeprefix("bytes=").split("-")) for _, _, h in gets)
    # Blocks 0 and 1 in four 2 MiB pieces, block 2 in three of 1 MiB, and one resume that
    # starts where the cut body stopped, 700 KiB into its piece.
    resumed = [r for r in ranges if r[0] % MiB]
    pieces = [r for r in ranges if not r[0] % MiB]
    assert [(a, b + 1 - a) for a, b in pieces] == (
        [(i * 2 * MiB, 2 * MiB) for i in range(8)] + [(2 * BLOCK + i * MiB, MiB) for i in range(3)]), ranges
    assert len(resumed) == 1 and resumed[0][0] % MiB == 700 * 1024, ranges
