#!/usr/bin/env bash
# Larder's whole test suite: formatting, lints, unit and property tests, a short fuzz run, then the end-to-end
# tests (real MinIO on loopback, the real `larder` binary, boto3 / aws CLI / aws-sdk-rust), and the
# benchmark harness in its quick mode (e2e/bench/run.sh).
# Installs what it needs first (e2e/setup.sh): the Rust components at once, the fuzz and e2e tools
# in the background while the Rust builds run, each waited for before the step that needs it; the
# fuzz targets build beside the release binaries.
# Extra arguments go to pytest, e.g. `-k ranges`.
set -euo pipefail
cd "$(dirname "$0")/.."

started=$(date +%s)
# Each step's heading says how far into the run it starts.
step() { echo "== [$(( $(date +%s) - started ))s] $*"; }
e2e/setup.sh rust
mkdir -p target
logs="$(mktemp -d)"
e2e/setup.sh fuzz >"$logs/setup-fuzz.log" 2>&1 &
setup_fuzz=$!
e2e/setup.sh e2e >"$logs/setup-e2e.log" 2>&1 &
setup_e2e=$!
# A failed step stops the installs still running behind it.
trap 'kill "$setup_fuzz" "$setup_e2e" ${fuzz_build:-} 2>/dev/null || true; rm -rf "$logs"' EXIT
# Wait for one background job (an install, the fuzz build); on failure, show its log and stop.
await() {
  if ! wait "$1"; then
    tail -n 80 "$2" >&2
    echo "failed: $(basename "$2" .log)" >&2
    exit 1
  fi
  cat "$2"
}
[ -x /usr/local/go/bin/go ] && PATH="$PATH:/usr/local/go/bin"
export PATH="$(go env GOPATH 2>/dev/null || echo "$HOME/go")/bin:$PATH:$HOME/.local/bin"

step "cargo fmt"
cargo fmt --all -- --check
step "module cycles (dependencies between each crate's top-level modules run one way)"
python3 .ci/module_cycles.py proxy/src cache-core/src
step "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
# The demo's embedded origin (s3s) belongs to larder-demo; the server, and so the container
# image, must not carry it.
if cargo tree -p larder -e normal --prefix none --locked | grep -q '^s3s'; then
  echo "s3s is in the server's build (larder); it belongs to larder-demo only" >&2
  exit 1
fi
step "cargo test"
cargo test --workspace --locked
step "cargo build --release (binaries under test), and the fuzz targets beside it"
# Two cold builds side by side: each spends long stretches on one crate or one link, leaving a
# core idle that the other can use.
await "$setup_fuzz" "$logs/setup-fuzz.log"
# The short fuzz runs below build unoptimised (proxy/fuzz/run.sh says why).
export LARDER_FUZZ_PROFILE=dev
proxy/fuzz/run.sh --build >"$logs/fuzz-build.log" 2>&1 &
fuzz_build=$!
# One build of the whole workspace: the server (the container image's binary, which the
# Dockerfile builds with `-p larder`), the demo and the e2e tools. Every release build here and
# in e2e/bench/run.sh names the same packages, so the features their dependencies are built with
# agree and nothing is compiled twice.
cargo build --release --locked --workspace
await "$fuzz_build" "$logs/fuzz-build.log" >/dev/null
step "fuzz (short run; LARDER_FUZZ_SECONDS sets the time per target)"
proxy/fuzz/run.sh
step "e2e"
await "$setup_e2e" "$logs/setup-e2e.log"
(cd e2e && LARDER_E2E_PROFILE=release python3 -m pytest "$@")
step "benchmark harness, quick mode (Larder vs direct S3 vs nginx: every body is checked, the figures are reported, not judged)"
e2e/bench/run.sh --quick --out target/bench/ci
step "done"
