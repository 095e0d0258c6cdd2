"""Where Larder's CPU goes on memory hits: perf samples of the `larder` process while wrk reads
one cached object, summed by function (self time) and by crate. `--disk N`: disk hits of N
objects instead.

    python3 e2e/bench/profile.py [--size 1MiB] [--clients 16] [--seconds 8] [--disk N] [--h2] [--unsigned] --out DIR
        [--call-graph dwarf --keep-data]   # then: perf report -i DIR/perf.data -G -S SYMBOL

Needs `perf` (linux-perf) and the release build with debug info (the workspace's release profile
keeps it). Writes DIR/profile.txt (perf's report) and DIR/summary.md (the shares by crate and
the top functions). Not part of the test suite: perf needs the kernel's permission to sample.
"""

import argparse
import collections
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import MiB, Bench  # noqa: E402
from hit_cpu import h2load  # noqa: E402


def size_arg(text: str) -> int:
    m = re.fullmatch(r"(\d+)(KiB|MiB)", text)
    if not m:
        raise argparse.ArgumentTypeError("a size like 64KiB or 1MiB")
    return int(m.group(1)) << (10 if m.group(2) == "KiB" else 20)


def crate_of(symbol: str) -> str:
    """The crate (or kernel, or libc) a symbol of perf's report belongs to."""
    if symbol.startswith("[k]"):
        return "kernel"
    name = symbol.removeprefix("[.]").strip()
    name = re.sub(r"^<", "", name)
    m = re.match(r"([a-z_][a-z0-9_]*)::", name)
    return m.group(1) if m else ("libc/other" if name else "?")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=size_arg, default=MiB)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seconds", type=int, default=8)
    ap.add_argument("--disk", type=int, default=0, metavar="N",
                    help="disk hits of N objects (hit_cpu.py's setup: 8 MiB memory tier, warmed disk tier)")
    ap.add_argument("--h2", action="store_true", help="HTTP/2 (h2load, one stream per connection) instead of wrk")
    ap.add_argument("--unsigned", action="store_true",
                    help="Larder with `auth = none`, read with anonymous URLs (as nginx is), not SigV4-presigned")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--keep-data", action="store_true", help="keep DIR/perf.data, for call graphs")
    ap.add_argument("--call-graph", choices=("fp", "dwarf"), default="fp",
                    help="how perf unwinds: fp (cheap; stops at libc, built without frame pointers) or dwarf")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    bench = Bench("quick", args.out)
    try:
        bench.start()
        keys = [f"profile/disk/{i}" for i in range(args.disk)] if args.disk else ["profile/hot"]
        sizes = {k: args.size for k in keys}
        bench.upload(sizes.items())
        auth = ("--auth", "none") if args.unsigned else ()
        if args.disk:
            larder, lt = bench.larder("larder", *auth, "--memory-capacity", "8MiB", "--disk-path",
                                      str(bench.work / "larder.cache"), "--disk-capacity",
                                      f"{max(512, 2 * args.disk * args.size >> 20)}MiB")
            bench.warm_prefix(larder, "profile/disk/")
        else:
            larder, lt = bench.larder("larder", *auth, "--memory-capacity", "1GiB")
            bench.warm_by_reading(lt, keys, sizes, {"hit-memory"})
        if args.unsigned:
            lt.presigner = None
        data = args.out / "perf.data"
        perf = subprocess.Popen(["perf", "record", "-F", "499", "--call-graph", args.call_graph, "-o", str(data),
                                 "-p", str(larder.proc.pid),
                                 "--", "sleep", str(args.seconds)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if args.h2:
            r = h2load(lt, keys, args.clients, 1, args.seconds + 1)
        else:
            r = bench.wrk(lt, keys, sizes, args.clients, args.seconds + 1)
        perf.wait(timeout=120)
        report = subprocess.run(["perf", "report", "-i", str(data), "--no-children", "--stdio", "--sort", "sym",
                                 "-g", "none", "--percent-limit", "0"], capture_output=True, text=True, check=True).stdout
        (args.out / "profile.txt").write_text(report)
        rows = []
        for line in report.splitlines():
            m = re.match(r"\s+([\d.]+)%\s+(.*)$", line)
            if m:
                rows.append((float(m.group(1)), m.group(2).strip()))
        by_crate = collections.Counter()
        for share, sym in rows:
            by_crate[crate_of(sym)] += share
        tier = f"disk hits ({args.disk} objects)" if args.disk else "memory hits"
        lines = [f"# Larder {tier}: {args.size // 1024} KiB objects, {args.clients} clients, {args.seconds} s", "",
                 f"{r['rps']:.0f} req/s, CPU {r.get('cpu_ms_per_1k', 0):.0f} ms per 1,000 requests "
                 f"(user + system of the larder process). Shares of all perf samples of the process.", "",
                 "| where | share of samples |", "|---|---|"]
        lines += [f"| {c} | {v:.1f} % |" for c, v in by_crate.most_common(12)]
        for title, pick in (("kernel", lambda sym: sym.startswith("[k]")),
                            ("user space", lambda sym: not sym.startswith("[k]"))):
            lines += ["", f"| {title}: function (self) | share |", "|---|---|"]
            lines += [f"| `{sym[:110]}` | {share:.2f} % |" for share, sym in [r for r in rows if pick(r[1])][:15]]
        (args.out / "summary.md").write_text("\n".join(lines) + "\n")
        print("\n".join(lines))
        if not args.keep_data:
            data.unlink(missing_ok=True)
    finally:
        bench.stop()


if __name__ == "__main__":
    main()
