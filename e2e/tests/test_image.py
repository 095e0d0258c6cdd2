"""The container image, as far as this machine allows. Docker runs here, but no base image can be
pulled, so the Dockerfile's build and distroless stages cannot run. What is checked instead: the
Dockerfile builds the server (the package `larder`, which has no demo: that is `larder-demo`) as the test
suite builds it, and a `FROM scratch` image holding that very binary (with the libraries it links, CA certificates and a passwd entry
for the unprivileged user) and the Dockerfile's own USER, EXPOSE, ENTRYPOINT and CMD starts,
passes `--check-config`, has no `demo` command, and serves S3 reads against MinIO on loopback."""

import os
import re
import shutil
import subprocess
import urllib.request

import pytest

from conftest import ACCESS_KEY, CLIENT_KEY, CLIENT_SECRET, ROOT, SECRET_KEY, binary, free_port, s3_client, wait_http, wait_until

DOCKERFILE = (ROOT / "Dockerfile").read_text()


def docker(*args, check=True, timeout=300):
    return subprocess.run(["docker", *args], check=check, capture_output=True, text=True, timeout=timeout)


def runtime_instructions() -> list[str]:
    """The final stage's instructions other than FROM and COPY, as written."""
    final = DOCKERFILE.rsplit("\nFROM ", 1)[1]
    return [l for l in final.splitlines()[1:] if re.match(r"^(USER|EXPOSE|ENTRYPOINT|CMD|ENV) ", l)]


def test_the_dockerfile_builds_as_ci_does():
    build = re.search(r"RUN (cargo build [^&]+)&&", DOCKERFILE).group(1).strip()
    assert build == "cargo build --release --locked -p larder"
    # The suite builds the whole workspace, `larder` with no feature chosen (it has none) beside
    # the demo and the e2e tools: the same code, its dependencies' features unified over more.
    suite = re.search(r"^cargo build --release --locked (.+)$", (ROOT / "e2e" / "test-all.sh").read_text(), re.M)
    assert suite.group(1) == "--workspace"
    assert 'members = ["cache-core", "proxy", ' in (ROOT / "Cargo.toml").read_text()
    assert "[features]" not in (ROOT / "proxy" / "Cargo.toml").read_text()
    assert "USER 65532:65532" in DOCKERFILE and ":nonroot" in DOCKERFILE


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    assert shutil.which("docker"), "docker is installed by e2e/setup.sh"
    assert docker("info", check=False).returncode == 0, "the docker daemon is not running (e2e/setup.sh starts it)"
    ctx = tmp_path_factory.mktemp("image")
    root = ctx / "rootfs"
    larder = binary("larder")
    (root / "usr/local/bin").mkdir(parents=True)
    shutil.copy2(larder, root / "usr/local/bin/larder")
    libs = re.findall(r"(/\S+\.so[.\d]*)", subprocess.run(["ldd", larder], capture_output=True, text=True).stdout)
    for lib in libs:
        dest = root / lib.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(os.path.realpath(lib), dest)
    (root / "etc/ssl/certs").mkdir(parents=True)
    shutil.copy2("/etc/ssl/certs/ca-certificates.crt", root / "etc/ssl/certs/ca-certificates.crt")
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")
    (root / "tmp").mkdir()
    (ctx / "Dockerfile").write_text("FROM scratch\nCOPY rootfs/ /\n" + "\n".join(runtime_instructions()) + "\n")
    tag = f"larder-e2e:{os.getpid()}"
    docker("build", "-t", tag, str(ctx))
    yield tag
    docker("rmi", "-f", tag, check=False)


def test_the_image_serves_s3_reads(image, minio, direct, bucket, workdir):
    inspect = docker("image", "inspect", image, "--format", "{{.Config.User}} {{json .Config.Entrypoint}} {{json .Config.Cmd}}").stdout
    assert inspect.startswith("65532:65532 ") and "serve" in inspect
    assert "larder" in docker("run", "--rm", "--network", "none", image, "--version").stdout
    demo = docker("run", "--rm", "--network", "none", image, "demo", check=False)
    assert demo.returncode != 0 and "unrecognized subcommand" in demo.stderr, "the production image carries no demo"

    keys = workdir / "image-keys"
    keys.write_text(f"{CLIENT_KEY}:{CLIENT_SECRET}\n")
    keys.chmod(0o644)
    port, admin = free_port(), free_port()
    config = workdir / "image-larder.toml"
    config.write_text(f'listen = "127.0.0.1:{port}"\nadmin_listen = "127.0.0.1:{admin}"\n'
                      f'auth_credentials = "/etc/larder/keys"\nupstream_endpoint = "{minio.endpoint}"\n'
                      'upstream_path_style = true\nmemory_capacity = "64MiB"\n')
    config.chmod(0o644)
    mounts = ["-v", f"{config}:/etc/larder/larder.toml:ro", "-v", f"{keys}:/etc/larder/keys:ro"]
    check = docker("run", "--rm", "--network", "none", *mounts, image, "serve", "--config", "/etc/larder/larder.toml",
                   "--check-config", check=False)
    assert check.returncode == 0, check.stderr
    # Host networking keeps every connection on loopback; the default CMD is used as is.
    name = f"larder-e2e-{os.getpid()}"
    docker("run", "-d", "--name", name, "--network", "host", "--read-only", "--cap-drop", "ALL",
           "-e", f"AWS_ACCESS_KEY_ID={ACCESS_KEY}", "-e", f"AWS_SECRET_ACCESS_KEY={SECRET_KEY}", *mounts, image)
    try:
        wait_http(f"http://127.0.0.1:{admin}/readyz", timeout=30)
        direct.put_object(Bucket=bucket, Key="from-the-image", Body=b"i" * 100_000)
        client = s3_client(f"http://127.0.0.1:{port}", CLIENT_KEY, CLIENT_SECRET)
        assert client.get_object(Bucket=bucket, Key="from-the-image")["Body"].read() == b"i" * 100_000
        def hit():
            # The block lands in memory as its fetch finishes, just behind the response.
            r = client.get_object(Bucket=bucket, Key="from-the-image")
            assert r["Body"].read() == b"i" * 100_000
            return r["ResponseMetadata"]["HTTPHeaders"]["x-cache"] == "hit-memory"
        wait_until(hit, 10, "a read served from memory")
        with urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=5) as m:
            assert b"larder_requests_total" in m.read()
    finally:
        logs = docker("logs", name, check=False)
        docker("rm", "-f", name, check=False)
    assert "larder is serving" in logs.stdout + logs.stderr
