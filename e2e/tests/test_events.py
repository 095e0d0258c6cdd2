"""Freshness from S3 event notifications, end to end: MinIO publishes its own bucket notifications
to Larder's `POST /v1/events` (a webhook target with an auth token) or, through a real
SQS-compatible server (ElasticMQ), to a queue Larder polls; with `metadata_ttl = 1h` an object
overwritten or deleted straight in MinIO is served new (or 404) through Larder within a second.
SNS subscriptions are confirmed only on SNS's own origins. Repeated listings and 404s cost no upstream request until a write makes them stale. A
fleet of three sees a write through any replica, and an event received by one. When the event
stream stops, Larder falls back to a short TTL by itself. Forged events (no token, a wrong token)
are refused and change nothing."""

import base64
import json
import threading
import time
import urllib.error
import urllib.request

import pytest
from botocore.exceptions import ClientError

from conftest import assert_dashboard_metrics_exported, ElasticMQ, FleetOf, Larder, LatencyProxy, Listener, Minio, free_port, metric, s3_client

TOKEN = "events-token-for-e2e-0123456789"
BUCKET = "events"


@pytest.fixture(scope="module")
def notified(workdir):
    """Larder with `metadata_ttl = 1h` in front of a MinIO that notifies it of every write."""
    token_file = workdir / "events-token"
    token_file.write_text(TOKEN + "\n")
    minio_port = free_port()
    # Larder first: MinIO checks its webhook target when it starts.
    larder = Larder(workdir, f"http://127.0.0.1:{minio_port}", "--metadata-ttl", "1h",
                    "--list-ttl", "1h", "--negative-ttl", "1h",
                    "--events-token-file", str(token_file), name="larder-events")
    minio, direct = notifying_minio(workdir, "minio-events", minio_port, larder, BUCKET)
    yield larder, direct
    larder.stop()
    minio.stop()


NOTIFY_ALL = {"QueueConfigurations": [{
    "QueueArn": "arn:minio:sqs::LARDER:webhook", "Events": ["s3:ObjectCreated:*", "s3:ObjectRemoved:*"]}]}


def notifying_minio(workdir, name, port, larder, bucket, endpoint=None):
    """A MinIO on `port` whose `bucket` notifies `larder` (or `endpoint`, unauthenticated) of
    every write; and a client of it."""
    minio = Minio(workdir, name=name, port=port, env={
        "MINIO_NOTIFY_WEBHOOK_ENABLE_LARDER": "on",
        "MINIO_NOTIFY_WEBHOOK_ENDPOINT_LARDER": endpoint or f"{larder.admin}/v1/events",
        **({} if endpoint else {"MINIO_NOTIFY_WEBHOOK_AUTH_TOKEN_LARDER": TOKEN}),
    })
    direct = s3_client(minio.endpoint)
    direct.create_bucket(Bucket=bucket)
    direct.put_bucket_notification_configuration(Bucket=bucket, NotificationConfiguration=NOTIFY_ALL)
    return minio, direct


def upstream_requests(node, operation) -> float:
    return metric(node, "larder_upstream_requests_total", operation=operation)


def seen_within(read, expected, limit: float) -> float:
    """Seconds until `read()` returns `expected`, polling every 10 ms; fails past `limit`."""
    started = time.monotonic()
    while True:
        got = read()
        elapsed = time.monotonic() - started
        if got == expected:
            return elapsed
        assert elapsed < limit, f"still {got!r} after {elapsed:.2f}s, expected {expected!r}"
        time.sleep(0.01)


def test_writes_straight_to_the_bucket_are_seen_within_a_second_with_a_one_hour_ttl(notified):
    larder, direct = notified
    client = larder.client()

    def body():
        try:
            return client.get_object(Bucket=BUCKET, Key="table/part-0.parquet")["Body"].read()
        except ClientError as e:
            return e.response["Error"]["Code"]

    direct.put_object(Bucket=BUCKET, Key="table/part-0.parquet", Body=b"version 0")
    seen_within(body, b"version 0", 5.0)
    assert body() == b"version 0"  # cached now, trusted for an hour
    lags = []
    for i in range(1, 21):
        new = f"version {i} ".encode() * (i + 1)
        direct.put_object(Bucket=BUCKET, Key="table/part-0.parquet", Body=new)
        lags.append(seen_within(body, new, 5.0))
    direct.delete_object(Bucket=BUCKET, Key="table/part-0.parquet")
    lags.append(seen_within(body, "NoSuchKey", 5.0))
    lags.sort()
    print(f"overwrite/delete visible through Larder after p50 {lags[len(lags) // 2] * 1000:.0f} ms, "
          f"max {lags[-1] * 1000:.0f} ms ({len(lags)} writes, metadata_ttl = 1h)")
    # p99 of 21 writes is the slowest one.
    assert lags[-1] < 1.0, lags
    assert metric(larder, "larder_events_total", outcome="applied") >= 21


def test_forged_events_are_refused_and_drop_nothing(notified):
    larder, direct = notified
    client = larder.client()
    direct.put_object(Bucket=BUCKET, Key="kept", Body=b"kept")
    assert client.get_object(Bucket=BUCKET, Key="kept")["Body"].read() == b"kept"
    heads = metric(larder, "larder_upstream_requests_total", operation="HeadObject")
    gets = metric(larder, "larder_upstream_requests_total", operation="GetObject")
    event = json.dumps({"Records": [{"eventName": "s3:ObjectRemoved:Delete",
                                     "s3": {"bucket": {"name": BUCKET}, "object": {"key": "kept"}}}]}).encode()
    for auth in [None, "Bearer wrong-token-0123456789abcdef", TOKEN, f"Basic {TOKEN}"]:
        req = urllib.request.Request(f"{larder.admin}/v1/events", data=event, method="POST",
                                     headers={"Content-Type": "application/json",
                                              **({"Authorization": auth} if auth else {})})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(req, timeout=5)
        assert refused.value.code == 401, auth
    # Still trusted: the next read asks the upstream nothing.
    response = client.get_object(Bucket=BUCKET, Key="kept")
    assert response["Body"].read() == b"kept"
    assert response["ResponseMetadata"]["HTTPHeaders"]["x-cache"] == "hit-memory"
    assert metric(larder, "larder_upstream_requests_total", operation="HeadObject") == heads
    assert metric(larder, "larder_upstream_requests_total", operation="GetObject") == gets
    # A body that is no S3 event is refused with the token too.
    req = urllib.request.Request(f"{larder.admin}/v1/events", data=b"{not json", method="POST",
                                 headers={"Authorization": f"Bearer {TOKEN}"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(req, timeout=5)
    assert refused.value.code == 400
    assert metric(larder, "larder_events_total", outcome="malformed") >= 1


def test_without_a_token_file_every_event_is_refused(larder):
    event = json.dumps({"Records": []}).encode()
    req = urllib.request.Request(f"{larder.admin}/v1/events", data=event, method="POST",
                                 headers={"Authorization": f"Bearer {TOKEN}"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(req, timeout=5)
    assert refused.value.code == 403


def test_listings_and_missing_keys_cost_nothing_until_a_write_straight_to_the_bucket(notified):
    larder, direct = notified
    client = larder.client()
    for i in range(3):
        direct.put_object(Bucket=BUCKET, Key=f"ds/part-{i}.parquet", Body=b"x" * (i + 1))

    def listing():
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix="ds/", PaginationConfig={"PageSize": 2})
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))

    def missing():
        try:
            return client.get_object(Bucket=BUCKET, Key="ds/_SUCCESS")["Body"].read()
        except ClientError as e:
            return e.response["Error"]["Code"]

    keys = [f"ds/part-{i}.parquet" for i in range(3)]
    seen_within(listing, keys, 5.0)
    assert missing() == "NoSuchKey"
    with pytest.raises(ClientError) as head:
        client.head_object(Bucket=BUCKET, Key="ds/_SUCCESS")
    assert head.value.response["Error"]["Code"] == "404"
    lists, heads, gets = (upstream_requests(larder, op) for op in ("ListObjectsV2", "HeadObject", "GetObject"))
    # Repeated: two pages of listing, a GET and a HEAD of the missing key, five times over.
    for _ in range(5):
        assert listing() == keys
        assert missing() == "NoSuchKey"
        with pytest.raises(ClientError):
            client.head_object(Bucket=BUCKET, Key="ds/_SUCCESS")
    assert (upstream_requests(larder, "ListObjectsV2"), upstream_requests(larder, "HeadObject"),
            upstream_requests(larder, "GetObject")) == (lists, heads, gets), "repeats reached the upstream"
    # The listing is S3's own answer, byte for byte: compare with MinIO's (request ids aside).
    via = client.list_objects_v2(Bucket=BUCKET, Prefix="ds/")
    straight = direct.list_objects_v2(Bucket=BUCKET, Prefix="ds/")
    assert [(o["Key"], o["ETag"], o["Size"]) for o in via["Contents"]] == \
        [(o["Key"], o["ETag"], o["Size"]) for o in straight["Contents"]]
    # A write straight to the bucket: the marker appears and the listing shows it within a second.
    direct.put_object(Bucket=BUCKET, Key="ds/_SUCCESS", Body=b"done")
    marker_lag = seen_within(missing, b"done", 5.0)
    listing_lag = seen_within(listing, sorted(keys + ["ds/_SUCCESS"]), 5.0)
    direct.delete_object(Bucket=BUCKET, Key="ds/part-0.parquet")
    delete_lag = seen_within(listing, sorted(keys[1:] + ["ds/_SUCCESS"]), 5.0)
    print(f"404 then written: visible after {marker_lag * 1000:.0f} ms; listing after a write "
          f"{listing_lag * 1000:.0f} ms, after a delete {delete_lag * 1000:.0f} ms")
    assert max(marker_lag, listing_lag, delete_lag) < 1.0


def test_an_event_arriving_while_the_first_read_is_in_flight_keeps_the_version_it_announces(workdir):
    """An object written straight to the bucket and read at once through Larder: the write's event
    reaches Larder while that first read's GET is still in flight. Here the upstream holds every
    request 400 ms and MinIO's webhook reaches Larder through a relay that holds each event 150 ms,
    so the event lands in the middle of the GET every time. The GET brings the very version the
    event announces, so Larder keeps it: the next read is a memory hit with no upstream request.
    (Larder used to drop whatever a fetch brought across any change, so the next read was a GET
    again; the heartbeat test below failed that way when its event raced its first read.) An
    overwrite, announced while nothing is in flight, is still seen at once."""
    token_file = workdir / "events-token-inflight"
    token_file.write_text(TOKEN + "\n")
    minio_port = free_port()
    proxy = LatencyProxy(workdir, minio_port)
    proxy.latency(delay_ms=400, jitter_ms=0, tail_fraction=0)
    larder = Larder(workdir, proxy.endpoint, "--metadata-ttl", "1h", "--events-token-file", str(token_file),
                    name="larder-inflight")

    def forward(body: bytes):
        req = urllib.request.Request(f"{larder.admin}/v1/events", data=body, method="POST",
                                     headers={"Authorization": f"Bearer {TOKEN}"})
        urllib.request.urlopen(req, timeout=10).close()

    relay = Listener(on_post=lambda body: threading.Timer(0.15, forward, [body]).start())
    minio, direct = notifying_minio(workdir, "minio-inflight", minio_port, larder, "inflight", endpoint=relay.url)
    client = larder.client()

    def not_cached() -> float:
        return metric(larder, "larder_events_total", outcome="not_cached")

    def upstream_gets() -> int:
        return proxy.control("stats")["by_method"].get("GET", 0)

    try:
        events = not_cached()
        direct.put_object(Bucket="inflight", Key="obj", Body=b"v1")
        assert not_cached() == events, "the event came before the read: the relay did not hold it"
        assert client.get_object(Bucket="inflight", Key="obj")["Body"].read() == b"v1"
        assert not_cached() == events + 1, "the event did not arrive while the read was in flight"
        gets, heads = upstream_gets(), upstream_requests(larder, "HeadObject")
        again = client.get_object(Bucket="inflight", Key="obj")
        assert again["Body"].read() == b"v1"
        assert again["ResponseMetadata"]["HTTPHeaders"]["x-cache"] == "hit-memory"
        assert (upstream_gets(), upstream_requests(larder, "HeadObject")) == (gets, heads)
        # Overwritten: the event (nothing in flight now) drops v1, and v2 is read.
        direct.put_object(Bucket="inflight", Key="obj", Body=b"v2")
        seen_within(lambda: client.get_object(Bucket="inflight", Key="obj")["Body"].read(), b"v2", 5.0)
    finally:
        larder.stop()
        minio.stop()
        proxy.stop()
        relay.close()


@pytest.fixture(scope="module")
def heartbeat(workdir):
    """Larder with `metadata_ttl = 1h` that writes a heartbeat object every ~0.7 s and takes the
    stream as broken after 2 s without an event, falling back to a 1 s TTL."""
    token_file = workdir / "events-token-hb"
    token_file.write_text(TOKEN + "\n")
    minio_port = free_port()
    larder = Larder(workdir, f"http://127.0.0.1:{minio_port}", "--metadata-ttl", "1h",
                    "--events-token-file", str(token_file), "--events-max-silence", "2s",
                    "--events-fallback-ttl", "1s", "--events-heartbeat", "beat/.larder/heartbeat",
                    name="larder-heartbeat")
    minio, direct = notifying_minio(workdir, "minio-heartbeat", minio_port, larder, "beat")
    yield larder, direct
    larder.stop()
    minio.stop()


def healthy(node) -> float:
    return metric(node, "larder_events_stream_healthy")


def test_a_heartbeat_keeps_a_quiet_stream_healthy_and_a_broken_one_falls_back_to_the_short_ttl(heartbeat):
    larder, direct = heartbeat
    client = larder.client()
    seen_within(lambda: healthy(larder), 1.0, 10.0)
    direct.put_object(Bucket="beat", Key="obj", Body=b"v1")
    seen_within(lambda: client.get_object(Bucket="beat", Key="obj")["Body"].read(), b"v1", 5.0)
    # Nothing but heartbeats for 5 s (2.5x the silence bound): still healthy, still trusted.
    time.sleep(5)
    assert healthy(larder) == 1.0
    heads = upstream_requests(larder, "HeadObject")
    assert client.get_object(Bucket="beat", Key="obj")["ResponseMetadata"]["HTTPHeaders"]["x-cache"] == "hit-memory"
    assert upstream_requests(larder, "HeadObject") == heads
    # The bucket stops notifying (a lost webhook, a deleted queue): Larder notices within the bound.
    direct.put_bucket_notification_configuration(Bucket="beat", NotificationConfiguration={})
    started = time.monotonic()
    seen_within(lambda: healthy(larder), 0.0, 10.0)
    noticed = time.monotonic() - started
    assert "falling back to events_fallback_ttl" in larder.log_path.read_text()
    # An overwrite nobody announces is seen within the fallback TTL, not the hour.
    direct.put_object(Bucket="beat", Key="obj", Body=b"v2")
    lag = seen_within(lambda: client.get_object(Bucket="beat", Key="obj")["Body"].read(), b"v2", 5.0)
    print(f"broken stream noticed after {noticed:.1f} s (bound 2 s); unannounced overwrite seen after {lag * 1000:.0f} ms (fallback TTL 1 s)")
    assert lag < 1.5
    # Notifications back: healthy again, and the hour's TTL with it.
    direct.put_bucket_notification_configuration(Bucket="beat", NotificationConfiguration=NOTIFY_ALL)
    seen_within(lambda: healthy(larder), 1.0, 10.0)


def test_a_fleet_of_three_sees_a_write_through_any_replica_and_an_event_received_by_one(make_larder, workdir):
    token_file = workdir / "events-token-fleet"
    token_file.write_text(TOKEN + "\n")
    minio_port = free_port()
    fleet = FleetOf(lambda *a, **kw: make_larder(*a, upstream_url=f"http://127.0.0.1:{minio_port}", **kw),
                    workdir, "fresh-fleet", "--metadata-ttl", "1h", "--list-ttl", "1h",
                    "--events-token-file", str(token_file))
    fleet.start(3)
    # Only the first replica receives the bucket's events (one webhook target, as behind a Service).
    minio, direct = notifying_minio(workdir, "minio-fleet", minio_port, fleet.nodes[0], "shared")
    try:
        clients = [node.client() for node in fleet.nodes]

        def body(c):
            return lambda: c.get_object(Bucket="shared", Key="k")["Body"].read()

        def listed(c):
            return lambda: [o["Key"] for o in c.list_objects_v2(Bucket="shared").get("Contents", [])]

        direct.put_object(Bucket="shared", Key="k", Body=b"v0")
        for c in clients:
            seen_within(body(c), b"v0", 5.0)
            seen_within(listed(c), ["k"], 5.0)
        lags = []
        # A write through replica 1: replicas 0 and 2 drop what they held.
        clients[1].put_object(Bucket="shared", Key="k", Body=b"v1 through replica 1")
        clients[1].put_object(Bucket="shared", Key="new", Body=b"n")
        for c in (clients[0], clients[2]):
            lags.append(seen_within(body(c), b"v1 through replica 1", 5.0))
            lags.append(seen_within(listed(c), ["k", "new"], 5.0))
        # A write straight to the bucket, announced to replica 0 only: 1 and 2 hear it from 0.
        direct.put_object(Bucket="shared", Key="k", Body=b"v2 straight to the bucket")
        for c in clients:
            lags.append(seen_within(body(c), b"v2 straight to the bucket", 5.0))
        lags.sort()
        print(f"fleet of 3: writes visible on every replica after p50 {lags[len(lags) // 2] * 1000:.0f} ms, "
              f"max {lags[-1] * 1000:.0f} ms ({len(lags)} checks, metadata_ttl = 1h)")
        assert lags[-1] < 1.0, lags
        for node in fleet.nodes[1:]:
            assert metric(node, "larder_fleet_notices_total", outcome="received") >= 2
            # Told of events by replica 0, they know the stream is alive too (checked each second).
            seen_within(lambda: healthy(node), 1.0, 3.0)
        assert metric(fleet.nodes[0], "larder_fleet_notices_total", outcome="failed") == 0
    finally:
        minio.stop()


@pytest.fixture(scope="module")
def queued(workdir):
    """Larder with `metadata_ttl = 1h` polling an ElasticMQ queue, which MinIO's events reach as
    S3's reach a queue on AWS: MinIO has no SQS target, so a loopback relay sends each event its
    webhook POSTs, unchanged, to the queue."""
    sqs = ElasticMQ(workdir, ["larder-events"])
    queue = sqs.queue_url("larder-events")
    relay = Listener(on_post=lambda body: sqs.client.send_message(QueueUrl=queue, MessageBody=body.decode()))
    minio_port = free_port()
    larder = Larder(workdir, f"http://127.0.0.1:{minio_port}", "--metadata-ttl", "1h", "--list-ttl", "1h",
                    "--events-sqs-queue-url", queue, name="larder-sqs")
    minio, direct = notifying_minio(workdir, "minio-sqs", minio_port, larder, BUCKET, endpoint=relay.url)
    direct.create_bucket(Bucket="bridged")  # no notifications: EventBridge-shaped events are sent by hand
    yield larder, direct, sqs, queue
    larder.stop()
    minio.stop()
    relay.close()
    sqs.stop()


def queue_depth(sqs, queue) -> int:
    attrs = sqs.client.get_queue_attributes(
        QueueUrl=queue, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"])
    return sum(int(v) for v in attrs["Attributes"].values())


def test_events_from_an_sqs_queue_make_direct_writes_visible_within_a_second_and_are_deleted(queued):
    larder, direct, sqs, queue = queued
    client = larder.client()

    def body(bucket, key):
        def read():
            try:
                return client.get_object(Bucket=bucket, Key=key)["Body"].read()
            except ClientError as e:
                return e.response["Error"]["Code"]
        return read

    direct.put_object(Bucket=BUCKET, Key="q/obj", Body=b"v0")
    seen_within(body(BUCKET, "q/obj"), b"v0", 5.0)
    seen_within(lambda: healthy(larder), 1.0, 5.0)
    lags = []
    for i in range(1, 11):
        new = f"v{i} ".encode() * (i + 1)
        direct.put_object(Bucket=BUCKET, Key="q/obj", Body=new)
        lags.append(seen_within(body(BUCKET, "q/obj"), new, 5.0))
    direct.delete_object(Bucket=BUCKET, Key="q/obj")
    lags.append(seen_within(body(BUCKET, "q/obj"), "NoSuchKey", 5.0))
    lags.sort()
    print(f"through SQS (ElasticMQ): overwrite/delete visible after p50 {lags[len(lags) // 2] * 1000:.0f} ms, "
          f"max {lags[-1] * 1000:.0f} ms ({len(lags)} writes, metadata_ttl = 1h)")
    assert lags[-1] < 1.0, lags
    assert metric(larder, "larder_events_total", outcome="applied") >= 11

    # EventBridge -> SQS: the EventBridge event shape, for a bucket that notifies nothing else.
    direct.put_object(Bucket="bridged", Key="t/a b.parquet", Body=b"old")
    seen_within(body("bridged", "t/a b.parquet"), b"old", 5.0)
    etag = direct.put_object(Bucket="bridged", Key="t/a b.parquet", Body=b"new")["ETag"].strip('"')
    assert body("bridged", "t/a b.parquet")() == b"old", "trusted for an hour without an event"
    sqs.client.send_message(QueueUrl=queue, MessageBody=json.dumps({
        "version": "0", "id": "e2e", "detail-type": "Object Created", "source": "aws.s3",
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "region": "us-east-1",
        "resources": ["arn:aws:s3:::bridged"],
        "detail": {"version": "0", "bucket": {"name": "bridged"},
                   "object": {"key": "t/a+b.parquet", "size": 3, "etag": etag, "sequencer": "00"},
                   "reason": "PutObject"}}))
    lag = seen_within(body("bridged", "t/a b.parquet"), b"new", 5.0)
    print(f"EventBridge-shaped event through SQS: visible after {lag * 1000:.0f} ms")

    # A message that is no event is counted and deleted, not redelivered for ever.
    malformed = metric(larder, "larder_events_total", outcome="malformed")
    sqs.client.send_message(QueueUrl=queue, MessageBody="{not an event")
    seen_within(lambda: metric(larder, "larder_events_total", outcome="malformed"), malformed + 1, 5.0)
    # Every message was deleted once applied: nothing waits, nothing is in flight.
    seen_within(lambda: queue_depth(sqs, queue), 0, 5.0)
    # Every events metric the dashboards query is exported by a Larder expecting events.
    assert_dashboard_metrics_exported(larder, ("larder_events_",), 2, "a Larder expecting events")


def sns_confirmation(subscribe_url: str) -> bytes:
    return json.dumps({
        "Type": "SubscriptionConfirmation", "MessageId": "e2e", "Token": "t0k3n",
        "TopicArn": "arn:aws:sns:us-east-1:123456789012:lake", "Message": "confirm",
        "SubscribeURL": subscribe_url, "Timestamp": "2026-11-24T00:00:00.000Z"}).encode()


def post_event(larder, body: bytes, auth: str | None) -> int:
    req = urllib.request.Request(f"{larder.admin}/v1/events", data=body, method="POST",
                                 headers={"Content-Type": "text/plain; charset=UTF-8",
                                          **({"Authorization": auth} if auth else {})})
    try:
        with urllib.request.urlopen(req, timeout=15) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def basic(password: str) -> str:
    return "Basic " + base64.b64encode(f"sns:{password}".encode()).decode()


def test_an_sns_subscription_is_confirmed_only_on_an_allowed_origin(make_larder, workdir):
    """SNS authenticates with the token as a Basic password, and Larder GETs the SubscribeURL of a
    confirmation: only on `events_sns_origins`, never an address an attacker names. (No SNS is
    reachable here: a loopback listener stands where SNS would, and records what Larder asks.)"""
    token_file = workdir / "events-token-sns"
    token_file.write_text(TOKEN + "\n")
    sns = Listener()
    try:
        # Default origins (SNS's own, https only): a loopback URL is refused and never fetched.
        default = make_larder("--events-token-file", str(token_file), name="larder-sns-default")
        trap = f"{sns.url}/?Action=ConfirmSubscription&TopicArn=x&Token=t"
        for url in [trap, f"https://sns.us-east-1.amazonaws.com@127.0.0.1:{sns.port}/?Action=ConfirmSubscription",
                    "http://169.254.169.254/latest/meta-data/?Action=ConfirmSubscription"]:
            assert post_event(default, sns_confirmation(url), basic(TOKEN)) == 403, url
        # Without the token (SNS's first try, before the challenge) or with a wrong one: 401.
        assert post_event(default, sns_confirmation(trap), None) == 401
        assert post_event(default, sns_confirmation(trap), basic("wrong-token-0123456789abcdef")) == 401
        assert sns.requests == [], "Larder fetched a URL it must not"

        # With the listener as an allowed origin: one GET of exactly that URL.
        allowed = make_larder("--events-token-file", str(token_file), "--events-sns-origins", sns.url,
                              name="larder-sns-allowed")
        assert post_event(allowed, sns_confirmation(trap), basic(TOKEN)) == 200
        assert [(m, p) for m, p, _ in sns.requests] == [("GET", trap[len(sns.url):])]
        # Another action on the allowed origin is refused too.
        assert post_event(allowed, sns_confirmation(f"{sns.url}/?Action=Publish&Message=x"), basic(TOKEN)) == 403
        assert len(sns.requests) == 1
        # The S3 events SNS then delivers are accepted with the same Basic credentials.
        notification = json.dumps({"Type": "Notification", "Message": json.dumps({"Records": []})}).encode()
        assert post_event(allowed, notification, basic(TOKEN)) == 200
    finally:
        sns.close()
