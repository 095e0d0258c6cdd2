#!/usr/bin/env bash
# Larder vs direct S3 vs nginx proxy_cache + slice, one command:
#
#   e2e/bench/run.sh [--quick | --full] [--out DIR]
#
# --quick (the default, ~5 minutes; the test suite runs it) or --full (~97 minutes, the figures in
# docs/benchmarks.md). --only picks workloads (`replay` is the trace replay, e2e/bench/replay.py).
# Results (results.md, results.json, PNG plots) go to DIR, by default target/bench/<mode>.
# Installs what it needs: nginx (with the slice module), wrk and h2load (nghttp2-client) from Debian, matplotlib and
# libcachesim from PyPI, MinIO through e2e/setup.sh's pinned `go install` when missing.
set -euo pipefail
cd "$(dirname "$0")/../.."

mode=quick
out=""
only=""
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) mode=quick ;;
    --full) mode=full ;;
    --out) out="$2"; shift ;;
    --only) only="$2"; shift ;;
    *) echo "usage: $0 [--quick|--full] [--out DIR] [--only memory,ttfb,capped,ranges,herd,parquet,disk,zipf,matrix,tls,cold_tls,replay]" >&2; exit 2 ;;
  esac
  shift
done
out="${out:-target/bench/$mode}"

sudo_if_needed() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
missing=()
command -v nginx >/dev/null || missing+=(nginx-light)
command -v wrk >/dev/null || missing+=(wrk)
# h2load, for the memory hits over HTTP/2 (compare.py's `matrix` step).
command -v h2load >/dev/null || missing+=(nghttp2-client)
# perf, for what SigV4 verification costs a 1 MiB hit, profiled in the verifying Larder (`matrix`).
command -v perf >/dev/null || missing+=(linux-perf)
# openssl, for the self-signed certificates of the memory hits over TLS (`tls`) and of the HTTPS
# upstream (`cold_tls`).
command -v openssl >/dev/null || missing+=(openssl)
if [ ${#missing[@]} -gt 0 ]; then
  echo "bench: installing ${missing[*]} from apt"
  sudo_if_needed apt-get install -y -q --no-install-recommends "${missing[@]}" \
    || { sudo_if_needed apt-get update -q && sudo_if_needed apt-get install -y -q --no-install-recommends "${missing[@]}"; }
fi
# Debian starts a system nginx on :80 when it installs one; the benchmark runs its own.
python3 -c "import matplotlib" 2>/dev/null \
  || python3 -m pip install -q --disable-pip-version-check matplotlib==3.11.2 2>/dev/null \
  || python3 -m pip install -q --disable-pip-version-check --user --break-system-packages matplotlib==3.11.2
# libCacheSim's reference policies (LRU, S3-FIFO, SIEVE, W-TinyLFU, ARC, Belady) for the replay.
python3 -c "import libcachesim" 2>/dev/null \
  || python3 -m pip install -q --disable-pip-version-check libcachesim==0.3.5 2>/dev/null \
  || python3 -m pip install -q --disable-pip-version-check --user --break-system-packages libcachesim==0.3.5
[ -x /usr/local/go/bin/go ] && PATH="$PATH:/usr/local/go/bin"
gobin="$(go env GOPATH 2>/dev/null || echo "$HOME/go")/bin"
export PATH="$gobin:$PATH:$HOME/.local/bin"
command -v minio >/dev/null || e2e/setup.sh
python3 -c "import boto3" 2>/dev/null || e2e/setup.sh

# The whole workspace, as e2e/test-all.sh builds it: a smaller set of packages could unify its
# dependencies' features differently and compile them again.
cargo build --release --locked --workspace
if [ "$only" != replay ]; then
  LARDER_E2E_PROFILE=release python3 e2e/bench/compare.py --mode "$mode" --out "$out" --only "${only//replay/}"
fi
# Trace replay (e2e/bench/replay.py): hit ratios at equal capacity beside libCacheSim's policies.
# Quick: one recorded trace at one capacity. Full: every workload at 5 % and 20 % of its working
# set, Larder's disk admissions side by side, and the memory tier alone (about 40 minutes more).
if [ -z "$only" ] || [[ ",$only," == *",replay,"* ]]; then
  trace=trace:e2e/bench/traces/cache2k-web12.trace.xz
  replay() { LARDER_E2E_PROFILE=release python3 e2e/bench/replay.py "$@"; }
  if [ "$mode" = quick ]; then
    replay --workload "$trace" --requests 4000 --object-size 32KiB --capacity 0.2 --skip-direct \
      --out "$out/replay"
  else
    full=(--disk-admission always,second-hit --skip-direct --capacity 0.05,0.2 --block-size 512KiB)
    for tiers in hybrid memory; do
      [ "$tiers" = memory ] && full+=(--tiers memory --skip-nginx)
      replay "${full[@]}" --workload zipf-0.8,zipf-1.0,zipf-1.2,scan --objects 4000 --requests 20000 \
        --object-size 256KiB --out "$out/replay-$tiers-zipf"
      replay "${full[@]}" --workload mixed --objects 1000 --requests 10000 --object-size 64KiB \
        --out "$out/replay-$tiers-mixed"
      replay "${full[@]}" --workload "$trace" --requests 20000 --object-size 64KiB --out "$out/replay-$tiers-web12"
    done
  fi
fi
