#!/usr/bin/env bash
# Installs what the test suite needs on a fresh machine, and reuses what is already there:
# rustfmt and clippy, nightly and cargo-fuzz, openssl, MinIO (built with `go install` at a pinned version), ElasticMQ
# (from Maven Central), and the Python clients.
#
#   e2e/setup.sh                 # everything
#   e2e/setup.sh rust fuzz e2e   # some of it: rust (rustfmt, clippy), fuzz (nightly, cargo-fuzz),
#                                # e2e (apt packages, Docker, MinIO, helm, tflint, ElasticMQ,
#                                # Python clients)
# e2e/test-all.sh installs `rust` first and the other two behind the Rust builds, which leave
# cores and the network idle for long stretches (a crate compiling alone, a binary linking).
set -euo pipefail
cd "$(dirname "$0")/.."

MINIO_MODULE="github.com/minio/minio"
MINIO_VERSION="v0.0.0-20260212201848-7aac2a2c5b7c"

rust() {
  command -v cargo >/dev/null || { echo "cargo is required (https://rustup.rs)" >&2; exit 1; }
  if command -v rustup >/dev/null; then
    rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt
    rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy
  fi
}

fuzz() {
  # The fuzz targets build with nightly (sanitizers) through cargo-fuzz.
  CARGO_FUZZ_VERSION="0.13.2"
  if command -v rustup >/dev/null && ! rustup toolchain list | grep -q '^nightly'; then
    echo "setup: installing the nightly toolchain for cargo-fuzz"
    rustup toolchain install nightly --profile minimal
  fi
  if ! cargo fuzz --version 2>/dev/null | grep -q "$CARGO_FUZZ_VERSION"; then
    echo "setup: installing cargo-fuzz $CARGO_FUZZ_VERSION (about 2 minutes)"
    cargo install cargo-fuzz --locked --version "$CARGO_FUZZ_VERSION"
  fi
}

e2e() {
  # From Debian: openssl (the TLS tests make certificates), curl (the HTTP/2 client of the read
  # tests), Prometheus (scrapes Larder in the observability tests), Chromium (renders the status
  # page headless) and docker.io (runs the container image test). About 30 s when missing.
  apt_missing=()
  command -v openssl >/dev/null || apt_missing+=(openssl)
  command -v curl >/dev/null || apt_missing+=(curl)
  command -v prometheus >/dev/null || apt_missing+=(prometheus)
  command -v chromium >/dev/null || apt_missing+=(chromium)
  command -v dockerd >/dev/null || apt_missing+=(docker.io)
  if [ ${#apt_missing[@]} -gt 0 ]; then
    echo "setup: installing ${apt_missing[*]} from apt"
    sudo_if_needed() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
    sudo_if_needed apt-get install -y -q --no-install-recommends "${apt_missing[@]}" \
      || { sudo_if_needed apt-get update -q && sudo_if_needed apt-get install -y -q --no-install-recommends "${apt_missing[@]}"; }
  fi

  [ -x /usr/local/go/bin/go ] && PATH="$PATH:/usr/local/go/bin"
  gobin="$(go env GOPATH 2>/dev/null || echo "$HOME/go")/bin"
  minio="$gobin/minio"
  if [ -x "$minio" ] && go version -m "$minio" 2>/dev/null | grep -q "$MINIO_VERSION"; then
    echo "setup: MinIO $MINIO_VERSION already installed at $minio"
  else
    command -v go >/dev/null || { echo "go is required to build MinIO for the e2e tests" >&2; exit 1; }
    echo "setup: building MinIO $MINIO_VERSION with go install (about 5 minutes)"
    GOFLAGS=-mod=mod go install "$MINIO_MODULE@$MINIO_VERSION"
  fi
  # The image test needs a running Docker daemon (no registry access is needed: it builds FROM scratch).
  if ! docker info >/dev/null 2>&1; then
    echo "setup: starting dockerd"
    if [ "$(id -u)" = 0 ]; then (dockerd >/tmp/larder-e2e-dockerd.log 2>&1 &); else (sudo dockerd >/tmp/larder-e2e-dockerd.log 2>&1 &); fi
    for _ in $(seq 1 30); do docker info >/dev/null 2>&1 && break; sleep 1; done
    docker info >/dev/null 2>&1 || { echo "dockerd did not start; see /tmp/larder-e2e-dockerd.log" >&2; exit 1; }
  fi

  # Helm renders the chart in the tests (the dashboards ConfigMap); built with go install (~1 min).
  HELM_VERSION="v3.22.0"
  if [ -x "$gobin/helm" ] && go version -m "$gobin/helm" 2>/dev/null | grep -q "helm.sh/helm/v3[[:space:]]*$HELM_VERSION"; then
    echo "setup: helm $HELM_VERSION already installed"
  else
    echo "setup: building helm $HELM_VERSION with go install (about 1 minute)"
    go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  fi

  # tflint (its bundled Terraform ruleset works offline) checks the Terraform modules; ~2 minutes.
  TFLINT_VERSION="v0.64.0"
  # (Output captured first: `| grep -q` under pipefail fails when grep stops reading early.)
  tflint_have="$("$gobin/tflint" --version 2>/dev/null || true)"
  if [[ "$tflint_have" == *"${TFLINT_VERSION#v}"* ]]; then
    echo "setup: tflint $TFLINT_VERSION already installed"
  else
    echo "setup: building tflint $TFLINT_VERSION with go install (about 2 minutes)"
    go install "github.com/terraform-linters/tflint@$TFLINT_VERSION"
  fi
  # terraform itself comes with the machine image (no Debian package; providers cannot be fetched).
  command -v terraform >/dev/null || { echo "terraform is required for the Terraform checks (terraform fmt)" >&2; exit 1; }

  # checkov pins its own boto3, so it lives in a virtualenv of its own.
  CHECKOV_VERSION="3.3.30"
  checkov_env="$HOME/.local/share/larder-e2e/checkov"
  checkov_have="$("$checkov_env/bin/checkov" --version 2>/dev/null || true)"
  if [[ "$checkov_have" != *"$CHECKOV_VERSION"* ]]; then
    echo "setup: installing checkov $CHECKOV_VERSION into $checkov_env (about 1 minute)"
    python3 -m venv "$checkov_env"
    "$checkov_env/bin/pip" install -q --disable-pip-version-check "checkov==$CHECKOV_VERSION"
  fi

  # ElasticMQ (an SQS-compatible server, from Maven Central) feeds Larder's S3 event queue
  # consumer in the events tests; Java and Maven come with the machine image. ~10 s.
  elasticmq_lib="$HOME/.local/share/larder-e2e/elasticmq/lib"
  if ! ls "$elasticmq_lib"/elasticmq-server_2.13-1.7.1.jar >/dev/null 2>&1; then
    command -v mvn >/dev/null || { echo "maven is required to fetch ElasticMQ for the e2e tests" >&2; exit 1; }
    echo "setup: fetching ElasticMQ 1.7.1 from Maven Central into $elasticmq_lib"
    rm -rf "$elasticmq_lib"
    mvn -q -B -f e2e/elasticmq/pom.xml dependency:copy-dependencies \
      -DoutputDirectory="$elasticmq_lib" -DincludeScope=runtime
  fi

  # A Python whose packages the system manages (PEP 668) gets them in the user's site instead.
  python3 -m pip install -q --disable-pip-version-check -r e2e/requirements.txt 2>/dev/null \
    || python3 -m pip install -q --disable-pip-version-check --user --break-system-packages -r e2e/requirements.txt
  PATH="$PATH:$HOME/.local/bin"
  command -v aws >/dev/null || { echo "the aws CLI did not install onto PATH" >&2; exit 1; }
}

parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(rust fuzz e2e)
for part in "${parts[@]}"; do
  case "$part" in
    rust | fuzz | e2e) "$part" ;;
    *) echo "usage: $0 [rust] [fuzz] [e2e]" >&2; exit 2 ;;
  esac
done
