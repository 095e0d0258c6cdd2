#!/usr/bin/env bash
# Installs what the test suite needs on a fresh machine, and reuses what is already there:
# rustfmt and clippy, nightly and cargo-fuzz, openssl, MinIO (built with `go install` at a pinned version), and the Python clients.
set -euo pipefail
cd "$(dirname "$0")/.."

MINIO_MODULE="github.com/minio/minio"
MINIO_VERSION="v0.0.0-20260212201848-7aac2a2c5b7c"

command -v cargo >/dev/null || { echo "cargo is required (https://rustup.rs)" >&2; exit 1; }
if command -v rustup >/dev/null; then
  rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt
  rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy
fi

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
# The TLS tests make certificates with openssl.
if ! command -v openssl >/dev/null; then
  echo "setup: installing openssl"
  if [ "$(id -u)" = 0 ]; then apt-get install -y -q openssl; else sudo apt-get install -y -q openssl; fi
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

# A Python whose packages the system manages (PEP 668) gets them in the user's site instead.
python3 -m pip install -q --disable-pip-version-check -r e2e/requirements.txt 2>/dev/null \
  || python3 -m pip install -q --disable-pip-version-check --user --break-system-packages -r e2e/requirements.txt
PATH="$PATH:$HOME/.local/bin"
command -v aws >/dev/null || { echo "the aws CLI did not install onto PATH" >&2; exit 1; }
