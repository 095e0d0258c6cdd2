#!/usr/bin/env bash
# Fuzz Larder's client-facing parsers: a short run of every target in CI, longer runs by hand:
#   proxy/fuzz/run.sh                              # every target, 20 s each, one per core at once
#   LARDER_FUZZ_SECONDS=3600 proxy/fuzz/run.sh auth  # one target for an hour
#   LARDER_FUZZ_SANITIZER=address proxy/fuzz/run.sh  # with AddressSanitizer (slower to build)
#   LARDER_FUZZ_PROFILE=dev proxy/fuzz/run.sh      # unoptimised: quicker to build, slower to run
#   proxy/fuzz/run.sh --build                      # build only (e2e/test-all.sh, ahead of the runs)
# Needs the nightly toolchain and cargo-fuzz (e2e/setup.sh installs cargo-fuzz). New inputs go to
# a temporary corpus seeded from fuzz/seeds/<target>; a crash leaves its input under
# proxy/fuzz/artifacts/<target>/ and fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${LARDER_FUZZ_SECONDS:-20}"
# No sanitizer by default: Larder's crates forbid unsafe code, so AddressSanitizer would check
# only the dependencies' unsafe code. Built cold side by side on 2 cores, cargo-fuzz's defaults
# (AddressSanitizer, one codegen unit) took 28 min, no sanitizer and 16 units 22 (docs/security.md).
flags=(--sanitizer "${LARDER_FUZZ_SANITIZER:-none}")
# The release profile (opt-level 1, Cargo.toml) for runs by hand. `dev` builds unoptimised, for
# the test suite's 20-second runs, which check that every target builds and holds on its seeds
# and a few hundred thousand inputs more (libFuzzer and the hashes are optimised even then,
# Cargo.toml). Built cold alone on 2 cores: release 9 min 34 s (1,019 s of CPU), dev 5 min 24 s
# (505 s); its runs are 1.6 to 3 times slower (docs/security.md).
case "${LARDER_FUZZ_PROFILE:-release}" in
  release) flags+=(--codegen-units 16) ;;
  dev) flags+=(--dev) ;;
  *) echo "LARDER_FUZZ_PROFILE: release or dev" >&2; exit 2 ;;
esac
if [ "${1:-}" = --build ]; then
  exec cargo +nightly fuzz build "${flags[@]}"
fi
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(request range auth chunked copy_source form)
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# Built once, before any run, so that the runs below do not race to build.
if ! cargo +nightly fuzz build "${flags[@]}" >"$work/build.log" 2>&1; then
  tail -n 60 "$work/build.log"
  exit 1
fi
run() {
  local t="$1"
  mkdir -p "$work/$t"
  if ! cargo +nightly fuzz run "${flags[@]}" "$t" "$work/$t" "fuzz/seeds/$t" -- -max_total_time="$seconds" >"$work/$t.log" 2>&1; then
    tail -n 60 "$work/$t.log"
    echo "fuzz target $t failed; the input is under proxy/fuzz/artifacts/$t/" >&2
    return 1
  fi
  echo "== fuzz $t (${seconds}s): $(grep -E '^Done ' "$work/$t.log")"
}
# libFuzzer runs one process per target on one core: as many targets at once as there are cores.
parallel="${LARDER_FUZZ_JOBS:-$(nproc)}"
failed=0
running=0
for t in "${targets[@]}"; do
  run "$t" &
  running=$((running + 1))
  if [ "$running" -ge "$parallel" ]; then
    wait -n || failed=1
    running=$((running - 1))
  fi
done
while [ "$running" -gt 0 ]; do
  wait -n || failed=1
  running=$((running - 1))
done
exit "$failed"
