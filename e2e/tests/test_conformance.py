"""The upstream conformance suite (proxy/tests/upstream_conformance.rs) against real MinIO: the
same checks the in-memory upstream passes in `cargo test`, run by the real S3 client
(aws-sdk-s3), so the in-process tests that use the in-memory upstream stand for the real one in
what the suite covers."""

import os
import subprocess

from conftest import ACCESS_KEY, ROOT, SECRET_KEY


def test_the_s3_client_and_the_in_memory_upstream_pass_the_same_suite(minio):
    env = dict(os.environ, LARDER_CONFORMANCE_ENDPOINT=minio.endpoint,
               AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY)
    # `--workspace`, as the suite's `cargo test`: the packages named decide the dependencies'
    # features, and `-p larder` alone compiled the AWS SDK again (100 s in CI).
    run = subprocess.run(
        ["cargo", "test", "--locked", "--workspace", "--test", "upstream_conformance", "--", "--nocapture"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    assert "test the_s3_client_conforms_against_a_real_s3_server ... ok" in out, out[-4000:]
    assert "LARDER_CONFORMANCE_ENDPOINT is not set" not in out, "the real-S3 half did not run"
    assert "test the_in_memory_upstream_conforms ... ok" in out, out[-4000:]
