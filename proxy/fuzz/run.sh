#!/usr/bin/env bash
# Fuzz Larder's client-facing parsers: a short run of every target in CI, longer runs by hand:
#   proxy/fuzz/run.sh                              # every target, 20 s each
#   LARDER_FUZZ_SECONDS=3600 proxy/fuzz/run.sh auth  # one target for an hour
# Needs the nightly toolchain and cargo-fuzz (e2e/setup.sh installs cargo-fuzz). New inputs go to
# a temporary corpus seeded from fuzz/seeds/<target>; a crash leaves its input under
# proxy/fuzz/artifacts/<target>/ and fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${LARDER_FUZZ_SECONDS:-20}"
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(request range auth chunked copy_source form)
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for t in "${targets[@]}"; do
  mkdir -p "$work/$t"
  echo "== fuzz $t (${seconds}s)"
  if ! cargo +nightly fuzz run "$t" "$work/$t" "fuzz/seeds/$t" -- -max_total_time="$seconds" >"$work/$t.log" 2>&1; then
    tail -n 60 "$work/$t.log"
    echo "fuzz target $t failed; the input is under proxy/fuzz/artifacts/$t/" >&2
    exit 1
  fi
  grep -E '^Done ' "$work/$t.log"
done
