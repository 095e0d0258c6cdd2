#!/usr/bin/env bash
# Larder's whole test suite: formatting, lints, unit and property tests, a short fuzz run, then the end-to-end
# tests (real MinIO on loopback, the real `larder` binary, boto3 / aws CLI / aws-sdk-rust), and the
# benchmark harness in its quick mode (e2e/bench/run.sh).
# Installs what it needs first (e2e/setup.sh): the Rust components at once, the fuzz and e2e tools
# in the background while the Rust builds run, each waited for before the step that needs it.
# Extra arguments go to pytest, e.g. `-k ranges`.
set -euo pipefail
cd "$(dirname "$0")/.."

e2e/setup.sh rust
mkdir -p target
logs="$(mktemp -d)"
e2e/setup.sh fuzz >"$logs/setup-fuzz.log" 2>&1 &
setup_fuzz=$!
e2e/setup.sh e2e >"$logs/setup-e2e.log" 2>&1 &
setup_e2e=$!
# A failed step stops the installs still running behind it.
trap 'kill "$setup_fuzz" "$setup_e2e" 2>/dev/null || true; rm -rf "$logs"' EXIT
# Wait for one background install; on failure, show its log and stop.
await() {
  if ! wait "$1"; then
    cat "$2" >&2
    echo "setup failed: $2" >&2
    exit 1
  fi
  cat "$2"
}
[ -x /usr/local/go/bin/go ] && PATH="$PATH:/usr/local/go/bin"
export PATH="$(go env GOPATH 2>/dev/null || echo "$HOME/go")/bin:$PATH:$HOME/.local/bin"

echo "== cargo fmt"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== cargo test"
cargo test --workspace --locked
echo "== fuzz (short run; LARDER_FUZZ_SECONDS sets the time per target)"
await "$setup_fuzz" "$logs/setup-fuzz.log"
proxy/fuzz/run.sh
echo "== cargo build --release (binaries under test)"
cargo build --release --locked -p larder -p larder-e2e-sdk-client -p larder-latency-proxy
echo "== e2e"
await "$setup_e2e" "$logs/setup-e2e.log"
(cd e2e && LARDER_E2E_PROFILE=release python3 -m pytest "$@")
echo "== benchmark harness, quick mode (Larder vs direct S3 vs nginx: every body is checked, the figures are reported, not judged)"
e2e/bench/run.sh --quick --out target/bench/ci
