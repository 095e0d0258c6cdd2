"""The disk tier end to end: the real `larder` binary with --disk-path over real MinIO, restarted
gracefully and killed with SIGKILL; bytes checked against what was uploaded, upstream traffic
counted by the pass-through in front of MinIO."""

import mmap
import random
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from conftest import wait_until

MiB = 1 << 20


def disk_args(workdir, name, *extra, memory="64MiB"):
    return ("--disk-path", str(workdir / f"{name}.cache"), "--disk-capacity", "512MiB",
            "--disk-region-size", "32MiB", "--memory-capacity", memory, *extra)


def metric(larder, name):
    m = re.search(rf"^larder_{name}(?:_total)?(?:{{[^}}]*}})? (\d+)", larder.metrics(), re.M)
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
    # Written on evict (the default), the blocks are in memory only (it holds them all):
    # SIGTERM writes them down, then finishes the disk writes in flight.
    time.sleep(0.3)  # disk counters reach the metrics every 100 ms
    assert metric(first, "disk_written_bytes") < MiB
    first.stop()
    assert "wrote the memory tier down to disk" in first.log_path.read_text()

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
    disk_served = []  # per round: bodies served whole, with at least one block from disk
    for round_ in range(3):
        larder = make_larder(*disk_args(workdir, "sigkill", "--disk-write-rate", "0"), name=f"disk-kill-{round_}")
        recovered.append(metric(larder, "disk_recovered_entries"))
        stop = threading.Event()
        wrong = []
        whole = []

        def reader(seed):
            client = larder.client(retries={"max_attempts": 1})
            r = random.Random(seed)
            while not stop.is_set():
                key = r.choice(list(objects))
                try:
                    resp = client.get_object(Bucket=bucket, Key=key)
                    body = resp["Body"].read()
                except Exception:  # the kill cuts reads off mid-body; that is the point
                    return
                # Every body that arrives whole, from a Larder that recovered what the last kill
                # left on disk, is exactly what was uploaded.
                if body != objects[key]:
                    wrong.append((key, len(body)))
                else:
                    whole.append(resp["ResponseMetadata"]["HTTPHeaders"]["x-cache"])

        threads = [threading.Thread(target=reader, args=(round_ * 10 + i,), daemon=True) for i in range(6)]
        for t in threads:
            t.start()
        time.sleep(1.0 + round_ * 0.7)
        larder.proc.kill()  # SIGKILL, mid-write
        stop.set()
        for t in threads:
            t.join(timeout=30)
        assert not any(t.is_alive() for t in threads), "a reader hung on a killed Larder"
        larder.proc.wait(timeout=10)
        assert not wrong, f"round {round_}: wrong bytes {wrong[:5]}"
        assert whole, f"round {round_}: no read completed before the kill"
        disk_served.append(sum(c == "hit-disk" for c in whole))

    # After the last kill: everything served is exactly what was uploaded, and what the kills left
    # on disk is served from it (checked, not only found).
    larder = make_larder(*disk_args(workdir, "sigkill"), name="disk-kill-verify")
    client = larder.client()
    from_disk = 0
    for key, data in objects.items():
        resp = client.get_object(Bucket=bucket, Key=key)
        assert resp["Body"].read() == data, key
        from_disk += resp["ResponseMetadata"]["HTTPHeaders"]["x-cache"] == "hit-disk"
    assert max(recovered[1:] + [metric(larder, "disk_recovered_entries")]) > 0, recovered
    # Blocks read from disk (of whole hits and of partly cached objects alike) were served, and
    # every body above is exact: a torn write is a counted miss, never bytes.
    wait_until(lambda: metric(larder, "disk_hits") > 0, 5, f"disk hits ({from_disk} whole, rounds {disk_served})")
    print(f"\nrecovered entries per start {recovered}; whole bodies from disk per round {disk_served}; "
          f"objects served (partly) from disk after the last kill: {from_disk}/{len(objects)}")


def test_a_block_failing_its_checksum_part_way_on_disk_is_served_right_the_upstream_finishing_it(
        workdir, make_larder, direct, bucket, upstream):
    # A disk hit alone is streamed in pieces, each sent once verified; a later piece that fails
    # its checksum must neither reach the client nor cost the bytes already sent: the upstream
    # sends the rest of the block, from the first piece not sent.
    data = random.Random(13).randbytes(8 * MiB)  # one block, random so its bytes are unique
    direct.put_object(Bucket=bucket, Key="flip.bin", Body=data)
    first = make_larder(*disk_args(workdir, "flip"), name="flip-first")
    assert first.client().get_object(Bucket=bucket, Key="flip.bin")["Body"].read() == data
    first.stop()  # writes the memory tier down to disk
    with open(workdir / "flip.cache", "r+b") as f, mmap.mmap(f.fileno(), 0) as device:
        start = device.find(data[:4096])
        assert start > 0, "the block is on disk"
        device[start + 5 * MiB] ^= 0x5A
        device.flush()

    upstream.reset()
    second = make_larder(*disk_args(workdir, "flip"), name="flip-second")
    assert second.client().get_object(Bucket=bucket, Key="flip.bin")["Body"].read() == data
    gets = upstream.seen("GET", f"/{bucket}/flip.bin")
    assert len(gets) == 1, gets
    m = re.fullmatch(r"bytes=(\d+)-(\d+)", gets[0][2] or "")
    assert m, gets
    assert 0 < int(m.group(1)) <= 5 * MiB and int(m.group(2)) == 8 * MiB - 1, gets
    wait_until(lambda: metric(second, "disk_corrupt_reads") == 1, 5, "the corrupt read counted")


def test_a_disk_hit_read_from_the_page_cache_is_verified_too(workdir, make_larder, direct, bucket, upstream):
    # Disk hits are read through the kernel's page cache (`disk_page_cache`, the default), on
    # the request's own thread when every page is cached. Bytes changed there (what a page
    # left over from a rewritten region would be) must fail their checksum like bytes from the
    # device: the client gets the object's bytes from the upstream, never the changed ones.
    data = random.Random(17).randbytes(MiB - 100)  # one block, random so its bytes are unique
    direct.put_object(Bucket=bucket, Key="pc.bin", Body=data)
    first = make_larder(*disk_args(workdir, "pc"), name="pc-first")
    assert first.client().get_object(Bucket=bucket, Key="pc.bin")["Body"].read() == data
    first.stop()  # writes the memory tier down to disk

    upstream.reset()
    second = make_larder(*disk_args(workdir, "pc"), name="pc-second")
    client = second.client()

    def read_head():
        resp = client.get_object(Bucket=bucket, Key="pc.bin", Range="bytes=0-99")
        return resp["Body"].read(), resp["ResponseMetadata"]["HTTPHeaders"]["x-cache"]

    # The first read brings the pages into the page cache (an I/O thread reads them); the
    # second finds them there.
    assert read_head() == (data[:100], "hit-disk")
    assert read_head() == (data[:100], "hit-disk")
    wait_until(lambda: metric(second, "disk_page_cache_reads") >= 2, 5, "reads served from the page cache")
    assert upstream.seen("GET", f"/{bucket}/pc.bin") == []

    with open(workdir / "pc.cache", "r+b") as f, mmap.mmap(f.fileno(), 0) as device:
        start = device.find(data[:4096])
        assert start > 0, "the block is on disk"
        device[start + 50] ^= 0x5A  # a shared mapping: the page cache itself changes
    # Labelled before its body is read (from the index: on disk), the read is served by the
    # upstream once the disk's bytes fail their check.
    assert read_head()[0] == data[:100]
    assert len(upstream.seen("GET", f"/{bucket}/pc.bin")) == 1
    wait_until(lambda: metric(second, "disk_corrupt_reads") == 1, 5, "the corrupt read counted")


def labelled(larder, name, **labels) -> int:
    """A metric's value for one label set (0 when absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    m = re.search(rf"^larder_{name}\{{{re.escape(want)}\}} (\d+)", larder.metrics(), re.M)
    return int(m.group(1)) if m else 0


def put_blocks(direct, bucket, prefix, n, size=MiB - 100, seed=0):
    """`n` objects of one 1 MiB block each; their bytes by key."""
    rng = random.Random(seed)
    objects = {f"{prefix}{i:03d}": rng.randbytes(size) for i in range(n)}
    for key, data in objects.items():
        direct.put_object(Bucket=bucket, Key=key, Body=data)
    return objects


def read_all(larder, bucket, objects) -> dict:
    """Read each object once through `larder`, checking its bytes; how each was served."""
    client = larder.client()
    served = {}
    for key, data in objects.items():
        resp = client.get_object(Bucket=bucket, Key=key)
        assert resp["Body"].read() == data, key
        served[resp["ResponseMetadata"]["HTTPHeaders"]["x-cache"]] = served.get(
            resp["ResponseMetadata"]["HTTPHeaders"]["x-cache"], 0) + 1
    return served


def test_second_hit_admission_writes_only_reused_blocks_once_the_disk_is_full(workdir, make_larder, direct, bucket,
                                                                             upstream):
    fill = put_blocks(direct, bucket, "fill/", 34, seed=20)
    objects = put_blocks(direct, bucket, "scan/", 12, seed=21)
    # 2 MiB of memory for one-block objects: most leave memory unread. A small disk: twelve
    # 4 MiB regions of three blocks each, two kept ready for writers.
    args = ("--block-size", "1MiB", "--memory-capacity", "2MiB", "--disk-path", str(workdir / "admission.cache"),
            "--disk-capacity", "49MiB", "--disk-region-size", "4MiB", "--disk-write-rate", "0")
    larder = make_larder(*args, "--disk-admission", "second-hit", name="admission")

    def written():
        time.sleep(0.3)  # disk counters reach the metrics every 100 ms
        return metric(larder, "disk_written_bytes")

    # Never-used space is filled with whatever memory lets go.
    read_all(larder, bucket, fill)
    wait_until(lambda: metric(larder, "disk_free_regions") <= 2 and metric(larder, "disk_inflight_entries") == 0, 10,
               "the disk filled")
    assert written() >= 25 * MiB
    # Full: a one-off scan is offered and refused (blocks, and the one-page notes that say
    # which objects the disk holds), nothing written.
    refused, before = labelled(larder, "disk_writes_dropped_total", reason="admission"), written()
    upstream.reset()
    served_scan = read_all(larder, bucket, objects)
    assert len(upstream.seen("GET", f"/{bucket}/scan/")) == 12
    wait_until(lambda: labelled(larder, "disk_writes_dropped_total", reason="admission") >= refused + 20, 5,
               "the scan's blocks and notes refused")
    # Nothing written, but for a block its own request found already in memory (the request's
    # block lookup raced the fetch it started: rarely): that counts as read again.
    assert written() - before <= served_scan.get("hit-memory", 0) * (MiB + 4096), served_scan
    # The second pass fetches again what memory let go: those blocks were turned away recently
    # (S3-FIFO's ghost), so they are written now.
    upstream.reset()
    before = written()
    read_all(larder, bucket, objects)
    refetched = len(upstream.seen("GET", f"/{bucket}/scan/"))
    assert refetched >= 10, refetched
    wait_until(lambda: written() - before >= (refetched - 2) * MiB, 5, "the refetched blocks written")
    larder.stop()
    # After a restart they are served from disk, exactly right.
    again = make_larder(*args, "--disk-admission", "second-hit", name="admission-again")
    upstream.reset()
    served = read_all(again, bucket, objects)
    assert served.get("hit-disk", 0) >= refetched - 2, served
    # `always` writes every block memory lets go.
    always = make_larder(*[str(workdir / "always.cache") if a.endswith("admission.cache") else a for a in args],
                         "--disk-admission", "always", name="admission-always")
    read_all(always, bucket, objects)
    wait_until(lambda: metric(always, "disk_writes") >= 10, 5, "blocks written on evict")


def test_a_herds_blocks_reach_a_full_disk_that_turns_away_blocks_read_once(workdir, make_larder, direct, bucket,
                                                                          upstream):
    """`second-hit` writes a block memory lets go only if it was read again. Eight readers of
    a herd read each block through one fetch: that is read again, though none of them read it
    from memory, and the block must reach the disk, so that a reader after memory let it go
    finds it there instead of fetching it a second time. A block one reader fetched is turned
    away, as before."""
    fill = put_blocks(direct, bucket, "fill/", 34, seed=20)
    once = put_blocks(direct, bucket, "once/", 4, seed=26)
    herd = put_blocks(direct, bucket, "herd/", 4, seed=25)
    push = put_blocks(direct, bucket, "push/", 4, seed=27)
    args = ("--block-size", "1MiB", "--memory-capacity", "2MiB", "--disk-path", str(workdir / "herd.cache"),
            "--disk-capacity", "49MiB", "--disk-region-size", "4MiB", "--disk-write-rate", "0")
    larder = make_larder(*args, "--disk-admission", "second-hit", name="herd-admission")
    read_all(larder, bucket, fill)
    wait_until(lambda: metric(larder, "disk_free_regions") <= 2 and metric(larder, "disk_inflight_entries") == 0, 10,
               "the disk filled")
    read_all(larder, bucket, once)
    # Each herd object's GET answers after 0.3 s: its eight readers all join the one fetch.
    upstream.delay = 0.3
    clients = [larder.client() for _ in range(8)]
    for key, data in herd.items():
        barrier = threading.Barrier(8)

        def read(client, key=key, barrier=barrier):
            barrier.wait(timeout=60)
            return client.get_object(Bucket=bucket, Key=key)["Body"].read()

        with ThreadPoolExecutor(8) as pool:
            assert all(b == data for b in pool.map(read, clients)), key
    upstream.delay = 0.0
    assert len(upstream.seen("GET", f"/{bucket}/herd/")) == 4
    # Memory (two blocks) lets the herd's blocks go for blocks read more often than their eight
    # readers did (its admission weighs reads).
    for _ in range(12):
        read_all(larder, bucket, push)
    wait_until(lambda: metric(larder, "disk_inflight_entries") == 0, 10, "the disk's writes landed")
    upstream.reset()
    served = read_all(larder, bucket, herd)
    assert upstream.seen("GET", f"/{bucket}/herd/") == []
    assert served == {"hit-disk": 4}, served
    # Blocks one reader fetched were turned away: fetched again.
    assert read_all(larder, bucket, once) == {"miss": 4}


def test_a_block_one_reader_fetched_reaches_a_full_disk_when_a_reader_behind_will_read_it(workdir, make_larder,
                                                                                          direct, bucket, upstream):
    """A herd whose readers come one after another shares no fetch with the readers behind: a
    block is fetched for the first and read by the next once memory let it go. A response in
    progress over the block (the reader behind) makes it read again for `second-hit`, which
    must write it, so that the reader behind finds it on disk instead of fetching it again."""
    fill = put_blocks(direct, bucket, "fill/", 34, seed=20)
    size = 16 * MiB - 100
    data = random.Random(28).randbytes(size)
    direct.put_object(Bucket=bucket, Key="ckpt.bin", Body=data)
    # One block opened ahead per response: the reader behind opens no block of the first's.
    args = ("--block-size", "1MiB", "--memory-capacity", "2MiB", "--disk-path", str(workdir / "behind.cache"),
            "--disk-capacity", "49MiB", "--disk-region-size", "4MiB", "--disk-write-rate", "0",
            "--read-window", "1", "--prefetch", "off")
    larder = make_larder(*args, "--disk-admission", "second-hit", name="behind")
    read_all(larder, bucket, fill)
    wait_until(lambda: metric(larder, "disk_free_regions") <= 2 and metric(larder, "disk_inflight_entries") == 0, 10,
               "the disk filled")
    upstream.reset()
    # The reader behind asks for the whole object and reads its first bytes only, for now.
    behind = larder.client().get_object(Bucket=bucket, Key="ckpt.bin")["Body"]
    head = behind.read(1024)
    # The first reader reads the second half, each block fetched for it alone.
    second_half = larder.client().get_object(Bucket=bucket, Key="ckpt.bin", Range=f"bytes={8 * MiB}-")
    assert second_half["Body"].read() == data[8 * MiB:]
    wait_until(lambda: metric(larder, "disk_inflight_entries") == 0, 10, "the disk's writes landed")
    fetched = len(upstream.seen("GET", f"/{bucket}/ckpt.bin"))
    # The reader behind reads on: the second half comes from disk (or the two blocks memory
    # holds), not from the upstream again.
    assert head + behind.read() == data
    gets = upstream.seen_with_headers("GET", f"/{bucket}/ckpt.bin")
    again = [h.get("range") for _, _, h in gets[fetched:] if int(h["range"].split("=")[1].split("-")[0]) >= 8 * MiB]
    assert again == [], again


def test_write_on_evict_writes_only_what_memory_lets_go(workdir, make_larder, direct, bucket, upstream):
    objects = put_blocks(direct, bucket, "e/", 40, seed=22)
    first = dict(list(objects.items())[:4])
    args = ("--block-size", "1MiB", "--memory-capacity", "8MiB", "--disk-path", str(workdir / "evict.cache"),
            "--disk-capacity", "256MiB", "--disk-region-size", "8MiB", "--disk-write-rate", "0",
            "--disk-write-policy", "on-evict")
    larder = make_larder(*args, name="on-evict")
    read_all(larder, bucket, first)
    # Four blocks fit in memory: no block is written (only the objects' few-byte notes are, which
    # go straight to disk under either policy). The same reads with on-insert write each block at
    # once: the admission test above.
    assert metric(larder, "disk_written_bytes") < MiB - 100
    # Forty blocks do not: what memory evicts goes to disk, and is read back from there.
    read_all(larder, bucket, objects)
    wait_until(lambda: metric(larder, "disk_written_bytes") >= (40 - 8) * (MiB - 100), 5,
               "at least the 32 blocks memory cannot hold written")
    upstream.reset()
    served = read_all(larder, bucket, objects)
    assert served.get("hit-disk", 0) >= 32 - 8, served
    assert len(upstream.seen("GET", f"/{bucket}/e/")) == 40 - served.get("hit-disk", 0) - served.get("hit-memory", 0)


def test_a_partition_keeps_its_buckets_through_a_scan_of_another(workdir, make_larder, direct, bucket, upstream):
    hot_bucket = f"{bucket}-hot"[:63]
    direct.create_bucket(Bucket=hot_bucket)
    hot = put_blocks(direct, hot_bucket, "t/", 6, seed=23)
    scan = put_blocks(direct, bucket, "s/", 80, seed=24)
    config = workdir / "partitions.toml"
    config.write_text(f'block_size = "1MiB"\nmemory_capacity = "4MiB"\ndisk_path = "{workdir / "partitions.cache"}"\n'
                      'disk_capacity = "64MiB"\ndisk_region_size = "4MiB"\ndisk_write_rate = "0"\n'
                      # Every block written, so that the one-off scan does fill and wrap its
                      # partition (`second-hit` would stop writing it once the partition is full).
                      'disk_admission = "always"\n'
                      f'[[disk_partitions]]\nname = "tables"\ncapacity = "16MiB"\nbuckets = ["{hot_bucket}"]\n')
    larder = make_larder("--config", str(config), name="partitions")
    read_all(larder, hot_bucket, hot)
    # A scan of 80 MiB through a default partition of 48 MiB: it wraps, evicting its own oldest.
    read_all(larder, bucket, scan)
    wait_until(lambda: metric(larder, "disk_reclaimed_regions") > 0, 5, "the default partition wrapped")
    larder.stop()
    again = make_larder("--config", str(config), name="partitions-again")
    upstream.reset()
    # The scan's first objects are (mostly) gone from disk; the other partition's, written before
    # all of them, are all still there. (One partition for all would have evicted those first.)
    assert read_all(again, bucket, dict(list(scan.items())[:8])).get("hit-disk", 0) < 8
    assert read_all(again, hot_bucket, hot) == {"hit-disk": 6}
    assert upstream.seen("GET", f"/{hot_bucket}/") == []


def test_idle_buffers_kept_for_reuse_stay_within_a_quarter_of_the_response_buffer(workdir, make_larder, direct,
                                                                                  bucket):
    """Disk hits and fills reuse large buffers from a pool instead of zeroing fresh memory; what
    the pool keeps idle is bounded by `response_buffer` / 4, whatever the reads held at once."""
    rng = random.Random(12)
    objects = {f"pool/{i}": rng.randbytes(8 * MiB) for i in range(6)}
    for key, data in objects.items():
        direct.put_object(Bucket=bucket, Key=key, Body=data)
    larder = make_larder(*disk_args(workdir, "pool", "--response-buffer", "48MiB", "--disk-write-policy", "on-insert",
                                    memory="8MiB"), name="disk-pool")
    assert metric(larder, "buffer_pool_limit_bytes") == 12 * MiB
    client = larder.client()

    def read_all_at_once():
        got = {}
        def read(key):
            got[key] = client.get_object(Bucket=bucket, Key=key)["Body"].read()

        readers = [threading.Thread(target=read, args=(k,)) for k in objects]
        for t in readers:
            t.start()
        for t in readers:
            t.join()
        assert got == objects

    read_all_at_once()
    # Written as fetched (`on-insert`), behind the responses: wait for all six on disk.
    wait_until(lambda: metric(larder, "disk_entries") >= len(objects), 20, "the blocks written to disk")
    for _ in range(2):
        read_all_at_once()
    time.sleep(0.3)  # disk counters reach the metrics every 100 ms
    assert metric(larder, "disk_hits") > 0  # the rest from memory, promoted by the first
    held = metric(larder, "buffer_pool_bytes")
    # Buffers came back (six 8 MiB disk reads at once, twice), none beyond the bound.
    assert 0 < held <= 12 * MiB, held
    assert metric(larder, "buffer_pool_fresh") > 0


def sealed_entries(path):
    """(offset, header length, value length) of every sealed entry (`LENC`) on a cache device:
    entries start on a page, their header's length at byte 24 and the value's at byte 16."""
    found = []
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as device:
        at = device.find(b"LENC")
        while at >= 0:
            if at % 4096 == 0:
                found.append((at, int.from_bytes(device[at + 24:at + 28], "little"),
                              int.from_bytes(device[at + 16:at + 24], "little")))
            at = device.find(b"LENC", at + 4)
    return found


def test_an_encrypted_disk_tier_holds_nothing_in_clear_and_serves_nothing_changed_or_foreign(
        workdir, make_larder, direct, bucket, upstream):
    # The threat: whoever holds the device (a stolen or recycled disk, a volume snapshot) reads
    # the cached objects, or writes bytes for Larder to serve. With `disk_encryption_key_file`
    # the device holds no object byte and no object name in clear, a changed byte is fetched
    # again instead of served, and a device sealed under another key (or none) is started
    # empty, never read.
    rng = random.Random(21)
    objects = {"hr/payroll-2026-confidential.csv": rng.randbytes(3 * MiB + 77),
               "hr/small-confidential.txt": rng.randbytes(3000)}
    for key, data in objects.items():
        direct.put_object(Bucket=bucket, Key=key, Body=data)
    key_a, key_b = workdir / "disk-a.key", workdir / "disk-b.key"
    key_a.write_text(rng.randbytes(32).hex() + "\n")
    key_b.write_text(rng.randbytes(32).hex())
    device = workdir / "sealed.cache"

    def start(name, *extra):
        return make_larder(*disk_args(workdir, "sealed", *extra), name=name)

    def refused(name, *extra):
        """The log of a Larder that must not start."""
        try:
            start(name, *extra)
        except RuntimeError:
            (log,) = workdir.glob(f"{name}-*.log")
            return log.read_text()
        raise AssertionError(f"{name} started")

    def read_all(larder):
        got = {}
        for key, data in objects.items():
            resp = larder.client().get_object(Bucket=bucket, Key=key)
            assert resp["Body"].read() == data, key
            got[key] = resp["ResponseMetadata"]["HTTPHeaders"]["x-cache"]
        return got

    first = start("sealed-first", "--disk-encryption-key-file", str(key_a))
    assert metric(first, "disk_encrypted") == 1
    read_all(first)
    first.stop()  # writes the memory tier down to disk, sealed
    assert "wrote the memory tier down to disk" in first.log_path.read_text()

    raw = device.read_bytes()
    big = objects["hr/payroll-2026-confidential.csv"]
    for at in (0, 4096, MiB + 5, 3 * MiB):
        assert big[at:at + 64] not in raw, f"bytes {at}.. of the object are on the device in clear"
    assert objects["hr/small-confidential.txt"][:64] not in raw
    for name in (b"payroll-2026", b"small-confidential", bucket.encode()):
        assert name not in raw, f"{name!r} is on the device in clear"
    entries = sealed_entries(device)
    assert {value for _, _, value in entries} >= {len(big), 3000}, entries
    del raw

    # The same key: everything is read back from disk, decrypted, with no upstream GET.
    upstream.reset()
    second = start("sealed-second", "--disk-encryption-key-file", str(key_a))
    assert metric(second, "disk_recovered_entries") >= 2
    assert set(read_all(second).values()) == {"hit-disk"}
    assert upstream.seen("GET", f"/{bucket}/hr/payroll-2026-confidential.csv") == []
    second.stop()

    # A byte changed on the device, 2 MiB into the object's ciphertext, fails authentication:
    # the client gets the object's bytes, the rest of the block from the upstream.
    at, header_len, _ = next(e for e in entries if e[2] == len(big))
    with open(device, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
        m[at + header_len + 2 * MiB] ^= 0x01
        m.flush()
    upstream.reset()
    third = start("sealed-third", "--disk-encryption-key-file", str(key_a))
    assert third.client().get_object(Bucket=bucket, Key="hr/payroll-2026-confidential.csv")["Body"].read() == big
    assert len(upstream.seen("GET", f"/{bucket}/hr/payroll-2026-confidential.csv")) == 1
    wait_until(lambda: metric(third, "disk_corrupt_reads") == 1, 5, "the failed authentication counted")
    third.stop()

    # Another key: the device is started empty, nothing of it read; the objects come from the
    # upstream. `strict` refuses to start instead.
    with_b = ("--disk-encryption-key-file", str(key_b))
    assert "encryption key changed" in refused("sealed-strict", *with_b, "--disk-recovery", "strict")
    upstream.reset()
    fourth = start("sealed-other-key", *with_b)
    assert "encryption key changed" in fourth.log_path.read_text()
    assert metric(fourth, "disk_recovered_entries") == 0
    assert set(read_all(fourth).values()) == {"miss"}
    assert len(upstream.seen("GET", f"/{bucket}/hr/small-confidential.txt")) == 1
    fourth.stop()

    # Encryption turned off: the sealed device is started empty, its ciphertext never served.
    fifth = start("sealed-off")
    assert "encryption turned off" in fifth.log_path.read_text()
    assert metric(fifth, "disk_encrypted") == 0
    assert metric(fifth, "disk_recovered_entries") == 0
    assert set(read_all(fifth).values()) == {"miss"}
    fifth.stop()

    # A key file that is not 32 bytes of hex stops the start, naming the file.
    short = workdir / "short.key"
    short.write_text("00112233")
    log = refused("sealed-short", "--disk-encryption-key-file", str(short))
    assert "short.key" in log and "64 hexadecimal digits" in log, log[:1000]


def test_a_rotated_disk_key_keeps_the_cache_and_the_key_rotated_out_opens_it_no_more(
        workdir, make_larder, direct, bucket, upstream):
    # A key rotation (`disk_encryption_previous_key_file`): the device's data key is wrapped
    # under the new key, so the cache survives it. The attack it must stop: the old key (leaked,
    # or held by whoever was meant to lose access) still opening the device as it is now.
    rng = random.Random(22)
    objects = {"rotate/big.bin": rng.randbytes(2 * MiB + 5), "rotate/small.bin": rng.randbytes(5000)}
    for key, data in objects.items():
        direct.put_object(Bucket=bucket, Key=key, Body=data)
    old, new = workdir / "old.key", workdir / "new.key"
    old_bytes, new_bytes = rng.randbytes(32), rng.randbytes(32)
    old.write_text(old_bytes.hex())
    new.write_text(new_bytes.hex())
    device = workdir / "rotate.cache"

    def start(name, *extra):
        return make_larder(*disk_args(workdir, "rotate", *extra), name=name)

    def key_label(larder):
        (label,) = re.findall(r'^larder_disk_encrypted\{.*key="([0-9a-f]{16})".*\} 1$', larder.metrics(), re.M)
        return label

    def read_all(larder):
        got = set()
        for key, data in objects.items():
            resp = larder.client().get_object(Bucket=bucket, Key=key)
            assert resp["Body"].read() == data, key
            got.add(resp["ResponseMetadata"]["HTTPHeaders"]["x-cache"])
        return got

    first = start("rotate-old", "--disk-encryption-key-file", str(old))
    old_label = key_label(first)
    read_all(first)
    first.stop()
    superblock = device.read_bytes()[:4096]

    # The new key with the old as the previous one: nothing refetched, the new key's
    # fingerprint reported, the superblock rewritten.
    upstream.reset()
    rotating = ("--disk-encryption-key-file", str(new), "--disk-encryption-previous-key-file", str(old))
    second = start("rotate-rotating", *rotating)
    assert "disk encryption key rotated" in second.log_path.read_text()
    assert metric(second, "disk_recovered_entries") >= 2
    assert read_all(second) == {"hit-disk"}
    assert upstream.seen("GET", f"/{bucket}/rotate/big.bin") == []
    assert key_label(second) not in ("", old_label)
    second.stop()
    rotated = device.read_bytes()
    assert rotated[:4096] != superblock
    for secret in (old_bytes, new_bytes):
        assert secret not in rotated, "a configured key is on the device"
    del rotated

    # Left set once done, the previous key changes nothing; the new key alone opens it.
    for name, args in (("rotate-again", rotating), ("rotate-new", ("--disk-encryption-key-file", str(new)))):
        upstream.reset()
        larder = start(name, *args)
        assert "disk encryption key rotated" not in larder.log_path.read_text()
        assert read_all(larder) == {"hit-disk"}, name
        assert upstream.seen("GET", f"/{bucket}/rotate/big.bin") == []
        larder.stop()

    # The old key opens the device no more: strict refuses it as another key, quiet starts
    # empty and refetches.
    try:
        start("rotate-old-strict", "--disk-encryption-key-file", str(old), "--disk-recovery", "strict")
        raise AssertionError("the old key opened the rotated device")
    except RuntimeError:
        (log,) = workdir.glob("rotate-old-strict-*.log")
        assert "encryption key changed" in log.read_text()
    upstream.reset()
    stale = start("rotate-old-again", "--disk-encryption-key-file", str(old))
    assert metric(stale, "disk_recovered_entries") == 0
    assert read_all(stale) == {"miss"}
    assert len(upstream.seen("GET", f"/{bucket}/rotate/small.bin")) == 1
    stale.stop()

    # A previous key file that is not a key stops the start, naming its option.
    short = workdir / "previous-short.key"
    short.write_text("0011")
    try:
        start("rotate-short", "--disk-encryption-key-file", str(new), "--disk-encryption-previous-key-file",
              str(short))
        raise AssertionError("a short previous key was accepted")
    except RuntimeError:
        (log,) = workdir.glob("rotate-short-*.log")
        text = log.read_text()
        assert "disk_encryption_previous_key_file" in text and "previous-short.key" in text, text[:1000]
