"""Clients must sign with a key Larder knows (SigV4, header or presigned URL); each refusal carries
S3's own code. Larder re-signs upstream with its own credentials, so clients never hold them."""

import datetime
import os
import re
import subprocess
import time
import urllib.error
import urllib.request

import botocore.auth
import pytest
from botocore import UNSIGNED
from botocore.config import Config
from botocore.exceptions import ClientError

from conftest import ACCESS_KEY, CLIENT_KEY, READER_KEY, READER_SECRET, SECRET_KEY, metric, s3_client, wait_until
from test_headers_errors import error_of, raw


def fetch(url, method="GET", headers=None, data=None):
    """(status, body) of one plain HTTP request, errors included."""
    request = urllib.request.Request(url, method=method, headers=headers or {}, data=data)
    try:
        with urllib.request.urlopen(request, timeout=15) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_the_right_key_reads_and_every_wrong_one_gets_s3s_code(larder, direct, bucket):
    direct.put_object(Bucket=bucket, Key="k", Body=b"signed")
    assert larder.client().get_object(Bucket=bucket, Key="k")["Body"].read() == b"signed"
    cases = [
        # The upstream's own key means nothing to Larder: clients never need it.
        (larder.client(ACCESS_KEY, SECRET_KEY), (403, "InvalidAccessKeyId")),
        (larder.client("nobody", "whatever"), (403, "InvalidAccessKeyId")),
        (larder.client(CLIENT_KEY, "the-wrong-secret"), (403, "SignatureDoesNotMatch")),
        (larder.client(signature_version=UNSIGNED), (403, "AccessDenied")),
    ]
    for client, want in cases:
        assert error_of(client.get_object, Bucket=bucket, Key="k") == want
        # A HEAD's error has no body, as with S3: only the status.
        assert error_of(client.head_object, Bucket=bucket, Key="k")[0] == want[0]
        assert error_of(client.list_objects_v2, Bucket=bucket) == want
    status, _, body = raw(larder, "GET", f"/{bucket}/k", sign=False)
    assert status == 403 and b"<Code>AccessDenied</Code>" in body
    status, _, body = raw(larder, "GET", f"/{bucket}/k", {"Authorization": "AWS4-HMAC-SHA256 Credential=x"}, sign=False)
    assert status == 400 and b"<Code>AuthorizationHeaderMalformed</Code>" in body


def test_a_skewed_clock_is_refused(larder, direct, bucket, monkeypatch):
    direct.put_object(Bucket=bucket, Key="k", Body=b"x")
    real = botocore.auth.get_current_datetime
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: real() - datetime.timedelta(minutes=20))
    assert error_of(larder.client().get_object, Bucket=bucket, Key="k") == (403, "RequestTimeTooSkewed")
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: real() - datetime.timedelta(minutes=10))
    assert larder.client().get_object(Bucket=bucket, Key="k")["Body"].read() == b"x"


def test_presigned_urls_from_boto3_and_the_aws_cli_work_until_they_expire(larder, direct, bucket):
    direct.put_object(Bucket=bucket, Key="dir/pre signed+1.txt", Body=b"presigned bytes")
    url = larder.client().generate_presigned_url(
        "get_object", Params={"Bucket": bucket, "Key": "dir/pre signed+1.txt"}, ExpiresIn=300)
    assert fetch(url) == (200, b"presigned bytes")
    cli = subprocess.run(
        ["aws", "s3", "presign", f"s3://{bucket}/dir/pre signed+1.txt", "--expires-in", "300",
         "--endpoint-url", larder.endpoint],
        check=True, env=larder.cli_env(), capture_output=True, text=True, timeout=60)
    assert fetch(cli.stdout.strip()) == (200, b"presigned bytes")
    # SigV4 query form, as boto3 makes it when configured for s3v4.
    v4 = larder.client(signature_version="s3v4")
    url = v4.generate_presigned_url(
        "get_object", Params={"Bucket": bucket, "Key": "dir/pre signed+1.txt"}, ExpiresIn=300)
    assert "X-Amz-Signature=" in url
    assert fetch(url) == (200, b"presigned bytes")
    # A presigned upload.
    put = v4.generate_presigned_url("put_object", Params={"Bucket": bucket, "Key": "uploaded"}, ExpiresIn=300)
    request = urllib.request.Request(put, data=b"put by url", method="PUT")
    with urllib.request.urlopen(request, timeout=10) as r:
        assert r.status == 200
    assert direct.get_object(Bucket=bucket, Key="uploaded")["Body"].read() == b"put by url"
    # With response overrides, which are part of what was signed.
    url = larder.client().generate_presigned_url(
        "get_object", Params={"Bucket": bucket, "Key": "dir/pre signed+1.txt",
                              "ResponseContentDisposition": "attachment; filename=\"a b.txt\""}, ExpiresIn=300)
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.headers["Content-Disposition"] == "attachment; filename=\"a b.txt\""
    # Tampered: another key under the same signature.
    status, body = fetch(url.replace("pre%20signed", "pre%20signeD"))
    assert status == 403 and b"SignatureDoesNotMatch" in body
    short = larder.client().generate_presigned_url(
        "get_object", Params={"Bucket": bucket, "Key": "dir/pre signed+1.txt"}, ExpiresIn=1)
    time.sleep(2.1)
    status, body = fetch(short)
    assert status == 403 and b"<Code>AccessDenied</Code>" in body and b"expired" in body


def test_key_policies_limit_buckets_and_writes(make_larder, direct, bucket, workdir):
    other = bucket + "-other"
    direct.create_bucket(Bucket=other)
    for b in (bucket, other):
        direct.put_object(Bucket=b, Key="k", Body=b"policy")
    config = workdir / "policy.toml"
    config.write_text(f'[[auth_policies]]\naccess_key = "{READER_KEY}"\nbuckets = ["{bucket}"]\naccess = "read-only"\n')
    l = make_larder("--config", str(config))
    reader = l.client(READER_KEY, READER_SECRET)
    assert reader.get_object(Bucket=bucket, Key="k")["Body"].read() == b"policy"
    assert [o["Key"] for o in reader.list_objects_v2(Bucket=bucket)["Contents"]] == ["k"]
    assert error_of(reader.put_object, Bucket=bucket, Key="new", Body=b"no") == (403, "AccessDenied")
    assert error_of(reader.delete_object, Bucket=bucket, Key="k") == (403, "AccessDenied")
    assert error_of(reader.get_object, Bucket=other, Key="k") == (403, "AccessDenied")
    assert error_of(reader.list_buckets) == (403, "AccessDenied")
    assert direct.get_object(Bucket=bucket, Key="k")["Body"].read() == b"policy"
    # The key without a policy may do everything.
    writer = l.client()
    writer.put_object(Bucket=other, Key="new", Body=b"yes")
    assert direct.get_object(Bucket=other, Key="new")["Body"].read() == b"yes"


def replace_file(path, text):
    """Write `path` whole at once, as Kubernetes swaps a mounted Secret's files: a reader sees
    the old text or the new, never half of it."""
    part = path.with_name(path.name + ".new")
    part.write_text(text)
    os.replace(part, path)


def test_a_key_taken_out_of_the_credentials_file_is_refused_however_it_signs(make_larder, direct, bucket, workdir):
    """Revoking a leaked key, rotating a secret and adding a key take a change of the
    credentials file, not a restart: within seconds the leaked key is refused on every way it
    could sign (a header, presigned URLs minted before, a browser form's policy), even for a
    cached object, while the other keys, old and new, go on; a file that does not load changes
    nothing."""
    from test_attacks import _post_form  # test_attacks imports this module's `fetch`
    direct.put_object(Bucket=bucket, Key="k", Body=b"rotated")
    config = workdir / "rotating.toml"
    # A policy names the leaked key: taking the key out of the file revokes it all the same.
    config.write_text(f'[[auth_policies]]\naccess_key = "{CLIENT_KEY}"\nbuckets = ["{bucket}"]\n'
                      f'[[auth_policies]]\naccess_key = "{READER_KEY}"\naccess = "read-only"\n')
    larder = make_larder("--config", str(config), name="rotating")
    leaked = larder.client()
    assert leaked.get_object(Bucket=bucket, Key="k")["Body"].read() == b"rotated"
    assert leaked.get_object(Bucket=bucket, Key="k")["ResponseMetadata"]["HTTPHeaders"]["x-cache"] == "hit-memory"
    urls = [leaked.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "k"}, ExpiresIn=3600),
            larder.client(signature_version="s3").generate_presigned_url(
                "get_object", Params={"Bucket": bucket, "Key": "k"}, ExpiresIn=3600)]
    form = leaked.generate_presigned_post(bucket, "form/${filename}", ExpiresIn=3600)
    assert all(fetch(u)[0] == 200 for u in urls)
    assert _post_form(form["url"], form["fields"], "a.txt", b"before")[0] == 204

    # The leaked key out, the reader's secret rotated, a new key in.
    replace_file(larder.credentials, f"{READER_KEY}:rotated-reader-secret\nnewcomer:newcomer-secret\n")
    def refused():
        try:
            leaked.get_object(Bucket=bucket, Key="k")["Body"].read()
        except ClientError as e:
            return (e.response["ResponseMetadata"]["HTTPStatusCode"], e.response["Error"]["Code"])
        return None

    wait_until(lambda: refused() == (403, "InvalidAccessKeyId"), timeout=20, what="the leaked key refused",
               interval=0.2)
    for url in urls:
        status, body = fetch(url)
        assert status == 403 and b"<Code>InvalidAccessKeyId</Code>" in body, (url, status, body)
    status, body = _post_form(form["url"], form["fields"], "a.txt", b"after")
    assert status == 403 and b"InvalidAccessKeyId" in body, (status, body)
    # The refused form stored nothing: the object is the one uploaded before.
    assert direct.get_object(Bucket=bucket, Key="form/a.txt")["Body"].read() == b"before"
    # The reader's old secret no longer signs; its new one does, under its policy still.
    assert error_of(larder.client(READER_KEY, READER_SECRET).get_object, Bucket=bucket, Key="k") == (403, "SignatureDoesNotMatch")
    reader = larder.client(READER_KEY, "rotated-reader-secret")
    assert reader.get_object(Bucket=bucket, Key="k")["Body"].read() == b"rotated"
    assert error_of(reader.put_object, Bucket=bucket, Key="new", Body=b"no") == (403, "AccessDenied")
    newcomer = larder.client("newcomer", "newcomer-secret")
    assert newcomer.get_object(Bucket=bucket, Key="k")["Body"].read() == b"rotated"
    assert metric(larder, "larder_auth_credentials_reloads_total", outcome="applied") == 1
    keys = {m for m in re.findall(r'^larder_key_requests_total\{access_key="([^"]+)"', larder.metrics(), re.M)}
    assert keys == {READER_KEY, "newcomer"}, keys

    # A file that does not load is refused, and the keys in force stay.
    replace_file(larder.credentials, "newcomer newcomer-secret\n")
    wait_until(lambda: metric(larder, "larder_auth_credentials_reloads_total", outcome="refused") == 1,
               timeout=20, what="the broken file refused", interval=0.2)
    assert newcomer.get_object(Bucket=bucket, Key="k")["Body"].read() == b"rotated"
    assert error_of(leaked.get_object, Bucket=bucket, Key="k") == (403, "InvalidAccessKeyId")
    assert "client credentials not reloaded" in larder.log_path.read_text()
    assert metric(larder, "larder_auth_credentials_refused") == 1
    # Fixed, it loads, and the alert's gauge goes back to 0.
    replace_file(larder.credentials, "newcomer:newcomer-secret\n")
    wait_until(lambda: metric(larder, "larder_auth_credentials_reloads_total", outcome="applied") == 2,
               timeout=20, what="the fixed file applied", interval=0.2)
    assert metric(larder, "larder_auth_credentials_refused") == 0
    assert error_of(reader.get_object, Bucket=bucket, Key="k") == (403, "InvalidAccessKeyId")


def test_a_changed_policy_applies_without_a_restart_and_a_bad_one_changes_nothing(make_larder, direct, bucket, workdir):
    """Taking a bucket or write access from a key, giving it back, or changing its rate takes a
    change of the configuration file's `auth_policies`, not a restart: within seconds the key
    is refused what it lost however it signs, cached objects included, and gets what it was
    given. A policy that does not load (bad TOML, a key the credentials file lacks: a typo
    that would leave the key meant without its policy) changes nothing."""
    direct.put_object(Bucket=bucket, Key="k", Body=b"policed")
    config = workdir / "policies.toml"

    def policy(buckets, access="read-only", extra=""):
        return (f'block_size = "1MiB"\n[[auth_policies]]\naccess_key = "{READER_KEY}"\n'
                f'buckets = {buckets}\naccess = "{access}"\n{extra}')

    def reloads(outcome):
        return metric(larder, "larder_auth_policies_reloads_total", outcome=outcome)

    def outcome(call, **params):
        try:
            call(**params)
            return 200
        except ClientError as e:
            return e.response["Error"]["Code"]

    config.write_text(policy(f'["{bucket}"]'))
    larder = make_larder("--config", str(config), name="policed")
    reader = larder.client(READER_KEY, READER_SECRET, retries={"total_max_attempts": 1})
    params = {"Bucket": bucket, "Key": "k"}
    assert reader.get_object(**params)["Body"].read() == b"policed"
    assert reader.get_object(**params)["ResponseMetadata"]["HTTPHeaders"]["x-cache"] == "hit-memory"
    url = reader.generate_presigned_url("get_object", Params=params, ExpiresIn=3600)
    assert fetch(url) == (200, b"policed")
    assert outcome(reader.put_object, Bucket=bucket, Key="w", Body=b"no") == "AccessDenied"

    # The bucket taken away: the cached object, the URL minted before, the listing refused.
    replace_file(config, policy('["some-other-bucket"]'))
    wait_until(lambda: outcome(reader.get_object, **params) == "AccessDenied", timeout=20,
               what="the bucket taken from the reader", interval=0.2)
    status, body = fetch(url)
    assert status == 403 and b"<Code>AccessDenied</Code>" in body, (status, body)
    assert outcome(reader.list_objects_v2, Bucket=bucket) == "AccessDenied"
    assert reloads("applied") == 1
    # The key without a policy is untouched.
    assert larder.client().get_object(**params)["Body"].read() == b"policed"

    # Given back with write access: it writes, through to the upstream.
    replace_file(config, policy(f'["{bucket}"]', access="read-write"))
    wait_until(lambda: outcome(reader.put_object, Bucket=bucket, Key="w", Body=b"yes") == 200, timeout=20,
               what="write access given to the reader", interval=0.2)
    assert direct.get_object(Bucket=bucket, Key="w")["Body"].read() == b"yes"
    assert fetch(url) == (200, b"policed")

    # A rate of one request a second: a burst is told to slow down.
    replace_file(config, policy(f'["{bucket}"]', extra="requests_per_second = 1\n"))
    wait_until(lambda: reloads("applied") == 3, timeout=20, what="the rate applied", interval=0.2)
    burst = [outcome(reader.get_object, **params) for _ in range(10)]
    assert burst.count("SlowDown") >= 7, burst
    assert metric(larder, "larder_client_throttled_total") >= 7

    # Bad TOML, then a policy naming a key the credentials file lacks: both refused, and the
    # policy in force (its rate included) stays; the log says why.
    for n, bad in enumerate([policy(f'["{bucket}"]')[:-5], policy('["*"]', access="admin").replace(READER_KEY, "readr")], 1):
        replace_file(config, bad)
        wait_until(lambda: reloads("refused") == n, timeout=20, what=f"bad policies {n} refused", interval=0.2)
        assert metric(larder, "larder_auth_policies_refused") == 1
        time.sleep(1.1)
        assert outcome(reader.get_object, **params) == 200
        assert outcome(reader.get_object, **params) == "SlowDown"
        assert outcome(reader.put_object, Bucket=bucket, Key="w", Body=b"no") == "SlowDown"
    log = larder.log_path.read_text()
    assert "auth_policies not reloaded" in log and "readr" in log
    # Another setting changed with them: the policies apply, the setting waits for a restart.
    replace_file(config, policy(f'["{bucket}"]').replace('"1MiB"', '"2MiB"'))
    wait_until(lambda: reloads("applied") == 4, timeout=20, what="the fixed policies applied", interval=0.2)
    assert metric(larder, "larder_auth_policies_refused") == 0
    assert [outcome(reader.get_object, **params) for _ in range(5)] == [200] * 5
    assert "those settings apply at the next start" in larder.log_path.read_text()
    assert metric(larder, "larder_auth_credentials_reloads_total") == 0


def test_auth_none_must_be_chosen_and_says_so(make_larder, direct, bucket):
    direct.put_object(Bucket=bucket, Key="k", Body=b"open")
    l = make_larder("--auth", "none")
    anonymous = s3_client(l.endpoint, signature_version=UNSIGNED)
    assert anonymous.get_object(Bucket=bucket, Key="k")["Body"].read() == b"open"
    assert "auth = none" in l.log_path.read_text()


def test_larder_refuses_to_start_without_client_keys(workdir):
    from conftest import binary
    import os
    env = {k: v for k, v in os.environ.items() if not k.startswith("LARDER_")}
    r = subprocess.run([binary("larder"), "serve"], capture_output=True, text=True, env=env, timeout=30)
    assert r.returncode != 0 and "auth_credentials" in r.stderr, r.stderr
    keys = workdir / "bad.keys"
    keys.write_text("no colon here\n")
    r = subprocess.run([binary("larder"), "serve", "--auth-credentials", str(keys)], capture_output=True, text=True,
                       env=env, timeout=30)
    assert r.returncode != 0 and "bad.keys:1" in r.stderr, r.stderr
