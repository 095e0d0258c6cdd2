"""Tables (Markdown) and plots (PNG) from compare.py's results.json.

    python3 e2e/bench/report.py DIR    # rewrites DIR/results.md and DIR/*.png from DIR/results.json
"""

import json
import sys
from pathlib import Path

MiB = 1 << 20
TARGETS = ["direct", "nginx", "Larder"]
COLORS = {"direct": "#888888", "nginx": "#2b8a3e", "Larder": "#c2410c", "Larder+events": "#7c3aed"}


def size_name(n: int) -> str:
    return f"{n // MiB} MiB" if n >= MiB else f"{n // 1024} KiB"


def ratio(a, b):
    return f"{a / b:.2f}x" if b else "–"


def by(rows, **kw):
    return [r for r in rows if all(r.get(k) == v for k, v in kw.items())]


def by_size(rows):
    """Per object size: the direct row, and each target's row present with how it was answered."""
    for size in sorted({r["size"] for r in rows}):
        present = [(t, r, ", ".join(f"{k} {v}" for k, v in r["cache"].items()))
                   for t in TARGETS if (r := one(rows, size=size, target=t))]
        yield size, one(rows, size=size, target="direct"), present


def one(rows, **kw):
    found = by(rows, **kw)
    return found[0] if found else None


def served(r: dict, size: int) -> tuple[float, float | None]:
    """A hit cell's requests per second and CPU ms per 1,000 requests, counted in whole bodies
    delivered (body bytes / object size) for objects of 1 MiB and up, in responses completed for
    smaller ones. A cell is a few seconds long: with many connections reading large objects it
    ends with most of them part-way (256 connections reading 64 MiB bodies at 2.5 GB/s, each at
    the same pace, finish none in 5 s), so completed responses leave out bytes sent while the
    CPU that sent them stays in, and the server sharing its bandwidth most evenly looks slowest.
    Smaller objects' cells complete thousands of responses per connection, and their byte counts
    hold headers too (about 7 % of a 4 KiB response), so there the completed count is the right one."""
    rps, cpu = r["rps"], r.get("cpu_ms_per_1k")
    if size < MiB or not r.get("mib_s") or not rps:
        return rps, cpu
    whole = r["mib_s"] * MiB / size
    return whole, None if cpu is None else cpu * rps / whole


def hits_table(rows) -> list[str]:
    out = ["| object | clients | target | req/s | MiB/s | p50 ms | p99 ms | p99.9 ms | CPU ms per 1k requests |",
           "|---|---|---|---|---|---|---|---|---|"]
    for size in sorted({r["size"] for r in rows}):
        for clients in sorted({r["clients"] for r in rows}):
            rs = {t: one(rows, size=size, clients=clients, target=t) for t in TARGETS}
            judged = {t: served(r, size) for t, r in rs.items() if r}
            for t in TARGETS:
                r = rs[t]
                if r:
                    rps, cpu = judged[t]
                    cpu = "" if cpu is None else f"{cpu:.0f}"
                    out.append(f"| {size_name(size)} | {clients} | {t} | {rps:.0f} | {r['mib_s']:.0f} | "
                               f"{r['p50_us']:.2f} | {r['p99_us']:.2f} | {r['p999_us']:.2f} | {cpu} |")
            lt = rs["Larder"]
            for base in ("direct", "nginx"):
                b = rs[base]
                if lt and b:
                    (lt_rps, lt_cpu), (b_rps, b_cpu) = judged["Larder"], judged[base]
                    cpu = ratio(lt_cpu, b_cpu) if lt_cpu is not None and b_cpu is not None else ""
                    out.append(f"| {size_name(size)} | {clients} | **Larder / {base}** | **{ratio(lt_rps, b_rps)}** | | "
                               f"{ratio(lt['p50_us'], b['p50_us'])} | **{ratio(lt['p99_us'], b['p99_us'])}** | "
                               f"{ratio(lt['p999_us'], b['p999_us'])} | **{cpu}** |")
    tiers: dict = {}
    for r in by(rows, target="Larder"):
        for k, v in r.get("cache", {}).items():
            tiers[k] = tiers.get(k, 0) + v
    out.append("")
    out.append("From 1 MiB up, req/s and CPU per request count whole bodies delivered (body bytes / object size), "
               "not responses completed: many connections reading large objects end a cell part-way through them.")
    out.append("")
    out.append("Larder's answers during these runs, by `X-Cache` (from its own request counter): " +
               ", ".join(f"{k} {v:,}" for k, v in sorted(tiers.items())) + ".")
    return out


MATRIX = [("nginx", "none"), ("Larder", "sigv4"), ("Larder", "none")]


def rounds_note(rows) -> str:
    """What a cell's figures are, when each was run more than once."""
    n = max((len(r.get("rounds", [])) for r in rows), default=0)
    if n < 2:
        return ""
    return (f" Each cell ran {n} times, the targets in turn in each round; every figure is its median "
            "over the rounds (results.json holds each round's requests per second and CPU).")


MATRIX_NOTE = (
    "HTTP/2 through h2load, one stream per connection, cleartext with prior knowledge; h2load gives no "
    "percentiles. nginx's HTTP/2 port is a second nginx with `sendfile off` (nginx 1.22 delays each HTTP/2 "
    "response 40 ms with it on); its HTTP/1.1 cells are the main nginx's, with `sendfile on`. From 1 MiB up, "
    "requests per second and CPU per request count whole bodies delivered (body bytes / object size), not "
    "responses completed: many connections reading large objects end a cell part-way through their bodies.")

TLS_NOTE = (
    "HTTPS through wrk (HTTP/1.1), every server with one self-signed ECDSA P-256 certificate made for the run; "
    "nginx on its defaults (under TLS it reads its cache files and encrypts, no `sendfile`, no kernel TLS), "
    "Larder encrypting with rustls. From 1 MiB up, requests per second and CPU per request count whole bodies "
    "delivered (body bytes / object size), not responses completed.")


def matrix_table(rows, note: str = MATRIX_NOTE) -> list[str]:
    """One line per size × connections × protocol: nginx, Larder verifying SigV4 and Larder with
    `auth = none` side by side, each Larder's figures also as a ratio to nginx's; `note` below."""
    out = ["| object | connections | protocol | req/s: nginx | Larder SigV4 (× nginx) | Larder unsigned (× nginx) "
           "| CPU ms per 1k requests: nginx | Larder SigV4 (× nginx) | Larder unsigned (× nginx) "
           "| p99 ms: nginx / SigV4 / unsigned | p99.9 ms: nginx / SigV4 / unsigned |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for size in sorted({r["size"] for r in rows}):
        for clients in sorted({r["clients"] for r in rows}):
            for protocol in dict.fromkeys(r["protocol"] for r in rows):
                nx, sig, uns = (one(rows, size=size, clients=clients, protocol=protocol, target=t, signing=g)
                                for t, g in MATRIX)
                if not (nx and sig and uns):
                    continue
                (nx_rps, nx_cpu), *larders = (served(r, size) for r in (nx, sig, uns))
                cells = [size_name(size), str(clients), protocol, f"{nx_rps:,.0f}"]
                cells += [f"{rps:,.0f} ({ratio(rps, nx_rps)})" for rps, _ in larders]
                cells.append(f"{nx_cpu:.1f}")
                cells += [f"{cpu:.1f} ({ratio(cpu, nx_cpu)})" for _, cpu in larders]
                for k in ("p99_us", "p999_us"):
                    cells.append(" / ".join(f"{r[k]:.2f}" for r in (nx, sig, uns)) if k in nx else "–")
                out.append("| " + " | ".join(cells) + " |")
    out += ["", note]
    return out


def hit_goal_counts(rows) -> tuple[str, str, str] | None:
    """Issue 21's three memory-hit bars counted over the cells of `rows` (each Larder, signed and
    not, against nginx in the same cell): CPU per request at or below nginx's, throughput at least
    1.2× nginx's, and p99 and p99.9 at or below nginx's (cells with percentiles), each as
    "N of M"; None without cells."""
    cells = []
    for size in sorted({r["size"] for r in rows}):
        for clients in sorted({r["clients"] for r in rows}):
            for protocol in dict.fromkeys(r["protocol"] for r in rows):
                nx = one(rows, size=size, clients=clients, protocol=protocol, target="nginx")
                for signing in ("sigv4", "none"):
                    lt = one(rows, size=size, clients=clients, protocol=protocol, target="Larder", signing=signing)
                    if nx and lt:
                        cells.append((size, protocol, signing, lt, nx))
    if not cells:
        return None
    judged = [(served(lt, size), served(nx, size)) for size, *_, lt, nx in cells]
    cpu = sum(lt_cpu <= nx_cpu for (_, lt_cpu), (_, nx_cpu) in judged)
    fast = sum(lt_rps >= 1.2 * nx_rps for (lt_rps, _), (nx_rps, _) in judged)
    tails = [(lt, nx) for *_, lt, nx in cells if "p99_us" in lt and "p99_us" in nx]
    tail = sum(lt["p99_us"] <= nx["p99_us"] and lt["p999_us"] <= nx["p999_us"] for lt, nx in tails)
    return f"{cpu} of {len(cells)}", f"{fast} of {len(cells)}", f"{tail} of {len(tails)}"


def whole_cold_table(rows, heading: str, intro: str) -> list[str]:
    """A section of whole cold reads per object size and target: the first byte where the rows
    have it, the whole read, and the throughput against direct's."""
    first = all("ttfb_p50" in r for r in rows)
    out = [f"## {heading}", "", intro, "",
           "| object | target | requests |" + (" first byte p50 ms |" if first else "")
           + " whole object p50 ms | MB/s | × direct | answered as |",
           "|---|---|---|" + ("---|" if first else "") + "---|---|---|---|"]
    for size, d, present in by_size(rows):
        for t, r, cache in present:
            times = f"{r['mb_per_s'] / d['mb_per_s']:.2f}×" if d else ""
            ttfb = f" {r['ttfb_p50']:.2f} |" if first else ""
            out.append(f"| {size_name(size)} | {t} | {r['requests']} |{ttfb} {r['total_p50']:.0f} | "
                       f"{r['mb_per_s']:.0f} | {times} | {cache} |")
    return out + [""]


def cold_tls_goals(rows) -> list[str]:
    """Issue 19's two bars for whole cold objects (first byte within 1 ms of direct, at least
    direct's throughput), measured from an upstream that speaks HTTPS: beside the goals, whose
    upstreams speak plain HTTP, not part of them."""
    pairs = [(s, one(rows, size=s, target="Larder"), one(rows, size=s, target="direct"))
             for s in sorted({r["size"] for r in rows})]
    cells = [f"{size_name(s)} first byte {lt['ttfb_p50'] - d['ttfb_p50']:+.2f} ms, throughput "
             f"{d['total_p50'] / lt['total_p50']:.2f}×" for s, lt, d in pairs if lt and d]
    if not cells:
        return []
    return ["- Cold whole objects from an upstream that speaks HTTPS, as S3 does (beside issue 19's goals, whose "
            "upstreams speak plain HTTP; direct reads decrypt in Python's `ssl`), Larder against direct: "
            + "; ".join(cells) + "."]


def tls_goals(rows) -> list[str]:
    """The memory-hit bars over HTTPS: not cells of issue 21's matrix (cleartext), beside it."""
    counts = hit_goal_counts(rows)
    if counts is None:
        return []
    cpu, fast, tail = counts
    return [f"- Memory hits over TLS (HTTPS, HTTP/1.1; beside issue 21's cleartext matrix, not part of it), "
            f"the same bars: CPU met in {cpu} cells, throughput in {fast}, the tail in {tail}."]


def matrix_goals(rows) -> list[str]:
    """Issue 21's memory-hit goals over every cell of the matrix, and what SigV4 costs a 1 MiB hit."""
    counts = hit_goal_counts(rows)
    if counts is None:
        return []
    cpu, fast, tail = counts
    out = [f"- **Memory hits over sizes × connections × protocol × signing: CPU per request at or below nginx's, "
           f"throughput at least 1.2× nginx's, p99 and p99.9 at or below nginx's**: CPU met in {cpu} "
           f"cells, throughput in {fast}, the tail in {tail} (HTTP/1.1 cells; h2load "
           "gives no percentiles)."]
    shares, profiled = [], []
    for size in (s for s in sorted({r["size"] for r in rows}) if s == MiB):
        for clients in sorted({r["clients"] for r in rows}):
            for protocol in dict.fromkeys(r["protocol"] for r in rows):
                sig = one(rows, size=size, clients=clients, protocol=protocol, target="Larder", signing="sigv4")
                uns = one(rows, size=size, clients=clients, protocol=protocol, target="Larder", signing="none")
                if sig and "sigv4_share" in sig:
                    profiled.append((f"{protocol} ×{clients}", sig["sigv4_share"]))
                if sig and uns:
                    share = 1 - served(uns, size)[1] / served(sig, size)[1]
                    shares.append(f"{protocol} ×{clients} {share * 100:+.0f} %")
    if profiled:
        met = sum(share <= 0.10 for _, share in profiled)
        out.append(f"- **SigV4 verification at most 10 % of a 1 MiB hit's CPU**: met in {met} of {len(profiled)} "
                   "cells, profiled in the verifying Larder (perf's inclusive share of its samples in the "
                   "authenticator and the query's parse, over one more run of each cell): "
                   f"{', '.join(f'{cell} {share:.1%}' for cell, share in profiled)}.")
    if shares:
        label = ("The same as the difference of two processes" if profiled
                 else "**SigV4 verification at most 10 % of a 1 MiB hit's CPU** (perf not run)")
        out.append(f"- {label} (1 − unsigned / SigV4 CPU per request, two Larders measured one after the other; "
                   f"within this machine's spread a cell can come out negative): {', '.join(shares)}.")
    return out


def hit_pairs(rows) -> list[tuple[tuple, tuple]]:
    """Larder's and nginx's `served` figures for each size × clients cell of `rows` both ran."""
    return [(served(lt, s), served(nx, s))
            for s in sorted({r["size"] for r in rows}) for c in sorted({r["clients"] for r in rows})
            if (lt := one(rows, size=s, clients=c, target="Larder")) and (nx := one(rows, size=s, clients=c, target="nginx"))]


def whole_cold_goals(latency_only, capped) -> list[str]:
    """Issue 19's goal for whole cold objects of 8 MiB to 1 GiB, per size: at least direct's
    throughput where the upstream only adds latency, at least 3× direct's single stream where it
    caps each connection as S3 does (both by the whole read's p50)."""
    out = []
    for rows, name, floor in ((latency_only, "latency-only upstream, at least direct's", 1.0),
                              (capped, "upstream capped at 90 MB/s per connection, at least 3× direct's", 3.0)):
        times = []
        for size in sorted(s for s in {r["size"] for r in rows} if 8 * MiB <= s <= 1024 * MiB):
            lt, d = one(rows, size=size, target="Larder"), one(rows, size=size, target="direct")
            if lt and d:
                times.append((size, d["total_p50"] / lt["total_p50"]))
        if times:
            met = sum(x >= floor for _, x in times)
            each = ", ".join(f"{size_name(s)} {x:.2f}×" for s, x in times)
            out.append(f"- **Whole cold objects, 8 MiB to 1 GiB, {name} throughput** (whole read p50): met for "
                       f"{met} of {len(times)} sizes (Larder / direct: {each}).")
    return out


def goals(res) -> list[str]:
    w = res["workloads"]
    out = []
    mem = w.get("memory_hits", [])
    cases = [(one(mem, size=s, clients=c, target="Larder"), one(mem, size=s, clients=c, target="nginx"))
             for s in sorted({r["size"] for r in mem}) for c in sorted({r["clients"] for r in mem})]
    cases = [(lt, nx) for lt, nx in cases if lt and nx]
    faster = [served(lt, lt["size"])[0] >= served(nx, nx["size"])[0] for lt, nx in cases]
    lower = [lt["p99_us"] < nx["p99_us"] for lt, nx in cases]
    faster, lower, both = sum(faster), sum(lower), sum(f and l for f, l in zip(faster, lower))
    if cases:
        out.append(f"- **Memory hits at least as fast as nginx's cache hits, with lower p99**: met in {both} of "
                   f"{len(cases)} cases (size × clients); throughput ≥ nginx in {faster}, p99 lower in {lower}.")
    rows = w.get("memory_hits", [])
    pairs = [(lt[1], nx[1]) for lt, nx in hit_pairs(rows) if lt[1] is not None and nx[1] is not None]
    if pairs:
        at_most = sum(lt <= nx for lt, nx in pairs)
        spread = ", ".join(ratio(lt, nx) for lt, nx in pairs)
        out.append(f"- **Memory hits: CPU per request at or below nginx's**: met in "
                   f"{at_most} of {len(pairs)} cases (Larder / nginx: {spread}).")
    # Issue 21's goal for disk hits is throughput (nginx's hits are page-cache reads, Larder's
    # are checked against their CRCs); the CPU each costs is given beside it.
    pairs = hit_pairs(w.get("disk_hits", []))
    if pairs:
        met = sum(lt[0] >= nx[0] for lt, nx in pairs)
        rps = ", ".join(ratio(lt[0], nx[0]) for lt, nx in pairs)
        cpu = ", ".join(ratio(lt[1], nx[1]) for lt, nx in pairs if lt[1] is not None and nx[1] is not None)
        out.append(f"- **Disk hits, 64 KiB and up: throughput at least nginx's, every byte checked**: met in "
                   f"{met} of {len(pairs)} cases (size × clients; Larder / nginx: {rps}). CPU per request, "
                   f"Larder / nginx: {cpu}.")
    herd = one(w.get("herd", []), target="Larder")
    if herd:
        # One GET may bring several blocks (a cold read's first GET runs on past its first block,
        # docs/benchmarks.md), so the goal is no block fetched twice: at most one GET per block,
        # and the objects' bytes once (1 % over for what the latency proxy counts besides).
        once = herd["upstream_mib"] * MiB <= herd["objects"] * herd["size"] * 1.01
        ok = herd["upstream_gets"] <= herd["blocks"] and once
        out.append(f"- **Thundering herd, each block fetched once (at most one upstream GET per block, its "
                   f"bytes once)**: {'met' if ok else 'NOT met'}: {herd['upstream_gets']} GETs for "
                   f"{herd['blocks']} blocks ({herd['clients']} clients), {herd['upstream_mib']:.1f} MiB from the "
                   f"upstream for {herd['objects'] * herd['size'] / MiB:.0f} MiB of objects, plus "
                   f"{herd['upstream_heads']} HEADs.")
    ttfb = w.get("cold_ttfb", [])
    for size in sorted({r["size"] for r in ttfb}):
        lt, d = one(ttfb, size=size, target="Larder"), one(ttfb, size=size, target="direct")
        if lt and d:
            over = lt["ttfb_p50"] - d["ttfb_p50"]
            out.append(f"- **Cold-miss time-to-first-byte overhead under 1 ms at p50** ({size_name(size)}): "
                       f"{'met' if over < 1 else 'NOT met'}: {over:+.2f} ms (Larder {lt['ttfb_p50']:.2f} ms, "
                       f"direct {d['ttfb_p50']:.2f} ms).")
    out += whole_cold_goals(ttfb, w.get("cold_capped", []))
    ranges = w.get("cold_ranges", [])
    for model in dict.fromkeys(r["model"] for r in ranges):
        pairs = [(one(ranges, model=model, length=n, target="Larder"), one(ranges, model=model, length=n, target="direct"))
                 for n in sorted({r["length"] for r in ranges})]
        pairs = [(lt, d) for lt, d in pairs if lt and d]
        first = sum(lt["ttfb_p50"] - d["ttfb_p50"] <= 1 for lt, d in pairs)
        last = sum(lt["total_p50"] <= 1.1 * d["total_p50"] for lt, d in pairs)
        fetched = sum(lt["upstream_bytes"] <= 1.5 * lt["asked_bytes"] for lt, _ in pairs)
        out.append(f"- **Cold ranges ({model}): first byte within 1 ms of direct, last byte within 10 %, at most "
                   f"1.5× the bytes asked from the upstream** (p50, per range length): first byte met for {first} of "
                   f"{len(pairs)} lengths, last byte for {last}, bytes for {fetched}.")
    out += matrix_goals(w.get("hit_matrix", []))
    out += tls_goals(w.get("tls_hits", []))
    out += cold_tls_goals(w.get("cold_tls", []))
    z = {r["target"]: r for r in w.get("zipf", [])}
    if "Larder" in z and "nginx" in z:
        ok = z["Larder"]["hit_ratio"] >= z["nginx"]["hit_ratio"]
        held = ""
        if "held_bytes" in z["nginx"] and "held_bytes" in z["Larder"]:
            cap = res["zipf_setup"]["nginx_max_size"]
            held = (f" At the end nginx held {z['nginx']['held_bytes'] / MiB:.0f} MiB "
                    f"({z['nginx']['held_bytes'] / cap:.2f}× its `max_size` of {cap // MiB} MiB), Larder "
                    f"{z['Larder']['held_bytes'] / MiB:.0f} MiB (memory and disk).")
        lru = res["zipf_setup"].get("lru_hit_ratio")
        if lru is not None:
            held += (f" nginx's cache manager enforces `max_size` only when it wakes, at most every 10 s; its "
                     f"policy at that capacity, a least-recently-used cache of `max_size` on the same sequence, "
                     f"hits {lru:.3f}: Larder {'at or above' if z['Larder']['hit_ratio'] >= lru else 'below'} it.")
        out.append(f"- **Zipf hit ratio at least nginx's at the same capacity**: {'met' if ok else 'NOT met'}: "
                   f"Larder {z['Larder']['hit_ratio']:.3f}, nginx {z['nginx']['hit_ratio']:.3f}.{held}")
    return out


def markdown(res) -> str:
    m, w = res["machine"], res["workloads"]
    lat = res["latency"]
    out = [f"# Larder vs direct S3 vs nginx proxy_cache: {res['mode']} run", "",
           f"**Machine**: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, Linux {m['kernel']}; "
           f"{m['nginx']}; {m['wrk']}; {m['minio']}; Larder at commit {m['commit']}; {m['date']}. "
           f"Everything (MinIO, the latency proxy, Larder, nginx, the load generators) shares these cores.",
           "",
           f"**Upstream latency** added to every request reaching MinIO: {lat['delay_ms']:.0f} ms + "
           f"uniform 0–{lat['jitter_ms']:.0f} ms, and {lat['tail_fraction'] * 100:.0f} % of requests "
           f"{lat['tail_ms']:.0f} ms more (the cold-miss test uses a fixed 30 ms instead).",
           f"Run time: {res.get('seconds', 0) / 60:.1f} min.", "", "## Goals", "", *goals(res), ""]
    if "memory_hits" in w:
        out += ["## Memory hits", "", *hits_table(w["memory_hits"]), ""]
    if "hit_matrix" in w:
        out += ["## Memory hits: protocol × signing", "",
                "The same cached objects through nginx, Larder verifying SigV4 (clients presign) and a second "
                "Larder with `auth = none` (anonymous URLs, as nginx's clients send), over HTTP/1.1 (wrk) and "
                "HTTP/2 (h2load); the Larders trust metadata for an hour, as the memory-hit cells do."
                + rounds_note(w["hit_matrix"]), "", *matrix_table(w["hit_matrix"]), ""]
    if "tls_hits" in w:
        out += ["## Memory hits over TLS", "",
                "nginx, Larder verifying SigV4 (clients presign) and Larder with `auth = none`, each a process of "
                "its own serving HTTPS, read as in the cleartext matrix: objects cached in memory (nginx: its "
                "files, in the page cache)." + rounds_note(w["tls_hits"]), "",
                *matrix_table(w["tls_hits"], TLS_NOTE), ""]
    if "disk_hits" in w:
        setup = res.get("disk_hits_setup", {})
        objs = ", ".join(f"{n} × {size_name(int(s))}" for s, n in setup.get("objects", {}).items())
        out += ["## Disk hits", "",
                f"Larder with an 8 MiB memory tier over a disk tier warmed with `POST /warm` ({objs}, "
                f"{setup.get('warm_seconds', 0):.1f} s): reads come from the disk tier, through the page "
                "cache where it holds them (`disk_page_cache`, the default), every byte CRC-checked. nginx's cache "
                "is files read through the page cache, which held them, and sent with `sendfile` (no copy, no "
                "check)." + rounds_note(w["disk_hits"]), "", *hits_table(w["disk_hits"]), ""]
    if "cold_ttfb" in w:
        out += ["## Cold misses: time to first byte", "",
                "One request at a time on a kept-alive connection per target, each for an object that target has "
                "not seen, the targets taking turns read by read; time to the first body byte, and to the last.", "",
                "| object | target | requests | TTFB p50 ms | p90 ms | p99 ms | whole object p50 ms | answered as |",
                "|---|---|---|---|---|---|---|---|"]
        rows = w["cold_ttfb"]
        for size, d, present in by_size(rows):
            for t, r, cache in present:
                out.append(f"| {size_name(size)} | {t} | {r['requests']} | {r['ttfb_p50']:.2f} | {r['ttfb_p90']:.2f} | "
                           f"{r['ttfb_p99']:.2f} | {r['total_p50']:.2f} | {cache} |")
            for t in ("nginx", "Larder"):
                r = one(rows, size=size, target=t)
                if r and d:
                    out.append(f"| {size_name(size)} | **{t} − direct** | | **{r['ttfb_p50'] - d['ttfb_p50']:+.2f}** | "
                               f"{r['ttfb_p90'] - d['ttfb_p90']:+.2f} | {r['ttfb_p99'] - d['ttfb_p99']:+.2f} | "
                               f"{r['total_p50'] - d['total_p50']:+.2f} | |")
        out.append("")
    if "cold_capped" in w:
        out += whole_cold_table(
            w["cold_capped"], "Cold whole objects from an upstream that caps each connection",
            "The latency proxy delivers at most 90 MB/s per connection (roughly what one S3 connection "
            "does) after a fixed 30 ms; one request at a time, each for an object that target has not seen.")
    if "cold_tls" in w:
        out += whole_cold_table(
            w["cold_tls"], "Cold whole objects from an HTTPS upstream",
            "A second latency proxy over the same MinIO speaks HTTPS (a self-signed certificate made for the run, "
            "which Larder trusts through `upstream_ca_file`), 30 ms before every answer. Direct reads decrypt what "
            "they read (Python's `ssl`, as boto3 and the aws CLI do); Larder decrypts and serves its client in the "
            "clear. Targets take turns read by read, on connections opened beforehand.")
    if "cold_ranges" in w:
        out += ["## Cold ranges", "",
                "Ranges of each length at random offsets of 24 MiB objects, each range of an object that target has "
                "not read, one at a time on a kept-alive connection; upstream bytes counted at the latency proxy "
                "(one 1 KiB GET opening the connection included).", "",
                "| upstream | range | target | requests | first byte p50 ms | last byte p50 ms | upstream GETs | "
                "upstream bytes / asked | answered as |", "|---|---|---|---|---|---|---|---|---|"]
        rows = w["cold_ranges"]
        for model in dict.fromkeys(r["model"] for r in rows):
            for n in sorted({r["length"] for r in rows if r["model"] == model}):
                for t in TARGETS:
                    r = one(rows, model=model, length=n, target=t)
                    if r:
                        cache = ", ".join(f"{k} {v}" for k, v in r["cache"].items())
                        out.append(f"| {model} | {size_name(n)} | {t} | {r['requests']} | {r['ttfb_p50']:.2f} | "
                                   f"{r['total_p50']:.2f} | {r['upstream_gets']} | "
                                   f"{r['upstream_bytes'] / r['asked_bytes']:.2f} | {cache} |")
                lt, d = one(rows, model=model, length=n, target="Larder"), one(rows, model=model, length=n, target="direct")
                if lt and d:
                    out.append(f"| {model} | {size_name(n)} | **Larder − direct** | | "
                               f"**{lt['ttfb_p50'] - d['ttfb_p50']:+.2f}** | **{lt['total_p50'] - d['total_p50']:+.2f} "
                               f"({(lt['total_p50'] / d['total_p50'] - 1) * 100:+.0f} %)** | | | |")
        out.append("")
    if "herd" in w:
        rows = w["herd"]
        r0 = rows[0]
        out += ["## Thundering herd", "",
                f"{r0['clients']} clients, released together, each read the same {r0['objects']} cold "
                f"{size_name(r0['size'])} objects ({r0['objects'] * -(-r0['size'] // (8 * MiB))} Larder blocks) whole, "
                "every body checked; upstream requests counted at the latency proxy.", "",
                "| target | upstream GETs | upstream HEADs | upstream MiB | served MiB | p50 ms | p99 ms |",
                "|---|---|---|---|---|---|---|"]
        for r in rows:
            out.append(f"| {r['target']} | {r['upstream_gets']} | {r['upstream_heads']} | {r['upstream_mib']:.1f} | "
                       f"{r['served_mib']:.0f} | {r['p50']:.0f} | {r['p99']:.0f} |")
        lt, d, nx = (one(rows, target=t) for t in ("Larder", "direct", "nginx"))
        if lt and d and nx:
            for base, b in (("direct", d), ("nginx", nx)):
                out.append(f"| **Larder / {base}** | {ratio(lt['upstream_gets'], b['upstream_gets'])} | | "
                           f"{ratio(lt['upstream_mib'], b['upstream_mib'])} | | {ratio(lt['p50'], b['p50'])} | "
                           f"{ratio(lt['p99'], b['p99'])} |")
        out.append("")
    if "zipf" in w:
        z = res["zipf_setup"]
        rows = w["zipf"]
        out += ["## Zipf reads over a working set larger than the cache", "",
                f"{z['requests']:,} GETs of whole {size_name(z['object_size'])} objects, {z['threads']} clients, "
                f"keys drawn from a Zipf distribution (exponent {z['exponent']}) over {z['objects']:,} objects "
                f"({z['objects'] * z['object_size'] // MiB:,} MiB): 10× Larder's memory tier "
                f"({z['larder_memory'] // MiB} MiB) and 2× its disk tier ({z['larder_disk'] // MiB} MiB). nginx gets "
                f"the same total capacity (`max_size` {z['nginx_max_size'] // MiB} MiB). The same sequence goes to "
                "both. Direct would send every request to S3. Dollars are S3 Standard GET-class prices "
                "($0.0004 per 1,000; HEAD is GET-class), requests only. Every figure is counted at the upstream "
                "(the latency proxy), not taken from the proxies' own hit labels: each object fits one block "
                "and one slice, so each upstream GET is one request the cache did not answer.", "",
                "`Larder+events` is the same Larder with MinIO's bucket notifications flowing to it and "
                "`metadata_ttl = 1h` (its heartbeat object is the upstream PUTs, priced as PUTs); `Larder` "
                "revalidates metadata with a HEAD every `metadata_ttl` (60 s), or, for an object read often, "
                "every 54 s behind a reader that finds it in its last tenth (`metadata_refresh_ahead`).", "",
                "| target | request hit ratio | byte hit ratio | upstream GETs | upstream HEADs | upstream PUTs | "
                "upstream requests avoided | $ per 1M requests | saved per 1M requests | p50 ms | p99 ms |",
                "|---|---|---|---|---|---|---|---|---|---|---|",
                f"| direct | 0 | 0 | {z['requests']:,} | 0 | 0 | 0 | {1e6 * 0.0004 / 1000:.3f} | 0 | | |"]
        for r in rows:
            out.append(f"| {r['target']} | {r['hit_ratio']:.3f} | {r['byte_hit_ratio']:.3f} | {r['upstream_gets']:,} | "
                       f"{r['upstream_heads']:,} | {r.get('upstream_puts', 0):,} | {r['avoided']:.3f} | "
                       f"{r['dollars_per_million']:.3f} | {r['saved_per_million']:.3f} | {r['p50']:.1f} | {r['p99']:.1f} |")
        lt, nx = one(rows, target="Larder"), one(rows, target="nginx")
        if lt and nx:
            out.append(f"| **Larder / nginx** | {ratio(lt['hit_ratio'], nx['hit_ratio'])} | "
                       f"{ratio(lt['byte_hit_ratio'], nx['byte_hit_ratio'])} | {ratio(lt['upstream_gets'], nx['upstream_gets'])} | | | "
                       f"{ratio(lt['avoided'], nx['avoided'])} | {ratio(lt['dollars_per_million'], nx['dollars_per_million'])} | | "
                       f"{ratio(lt['p50'], nx['p50'])} | {ratio(lt['p99'], nx['p99'])} |")
        d = (lt or {}).get("larder_disk", {})
        if d:
            admission = 'larder_disk_writes_dropped_total{reason="admission"}'
            dropped = sum(v for k, v in d.items() if k.startswith("larder_disk_writes_dropped_total") and k != admission)
            out += ["", f"Larder's tiers at the end: memory {d.get('larder_memory_entries', 0):.0f} blocks; disk "
                    f"{d.get('larder_disk_capacity_bytes', 0) / MiB:.0f} MiB usable of the "
                    f"{z['larder_disk'] // MiB} MiB configured (the rest is its superblock and region alignment), of "
                    f"which {d.get('larder_disk_free_regions', 0):.0f} regions kept free for writing, "
                    f"{d.get('larder_disk_live_bytes', 0) / MiB:.0f} MiB live in {d.get('larder_disk_entries', 0):.0f} "
                    f"entries; {d.get('larder_disk_evicted_entries_total', 0):.0f} entries evicted (region FIFO), "
                    f"{d.get('larder_disk_reinserted_entries_total', 0):.0f} re-inserted because they had been hit, "
                    f"{d.get(admission, 0):.0f} blocks memory let go turned away by the disk's admission "
                    f"(`disk_admission = second-hit`: not read while in memory), {dropped:.0f} writes dropped for "
                    "other reasons. A block reaches the disk when memory lets it go (`disk_write_policy = on-evict`)."]
        out += ["", "How each answered: " + "; ".join(
            f"{r['target']}: " + ", ".join(f"{k} {v:,}" for k, v in sorted(r["cache"].items())) for r in rows) + ".", ""]
    if "parquet" in w:
        rows = w["parquet"]
        out += ["## Parquet-like ranged reads", "",
                "Per file: the last 64 KiB (`Range: bytes=-65536`, as readers fetch the footer), then three column "
                "chunks of 256 KiB–4 MiB at random offsets; 8 clients, one file each at a time. Three passes over "
                "the same files: cold, the same query again, then other columns. Larder's read-ahead: the blocks it "
                "fetched behind its readers in the pass (predicted from their reads, or completed from parts), and "
                "the MiB of such blocks, fetched in that pass or an earlier one, first read in the pass (each block "
                "counted once, whole, as `larder_prefetch_bytes_total{outcome=\"used\"}` counts it).", "",
                "| target | pass | reads | served MiB | upstream GETs | upstream HEADs | upstream MiB | footer p50 ms | "
                "column chunk p50 ms | p99 ms | read-ahead blocks | read-ahead MiB first read |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            ahead = (f"{r['readahead_blocks']} | {r['readahead_used_mib']:.1f}" if "readahead_blocks" in r
                     else " | ")
            out.append(f"| {r['target']} | {r['pass']} | {r['reads']} | {r['served_mib']:.1f} | {r['upstream_gets']} | "
                       f"{r['upstream_heads']} | {r['upstream_mib']:.1f} | {r['footer_p50']:.1f} | "
                       f"{r['column_p50']:.1f} | {r['p99']:.1f} | {ahead} |")
        out.append("")
    out += ["## Plots", "", "![hits](hits.png)", "", "![cold misses, herd, Zipf, Parquet](upstream.png)", ""]
    if "cold_ranges" in w:
        out += ["![cold ranges](ranges.png)", ""]
    return "\n".join(out)


def plots(res, out: Path):
    import matplotlib  # noqa: PLC0415
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    w = res["workloads"]
    tiers = [k for k in ("memory_hits", "disk_hits") if k in w]
    if tiers:
        sizes = sorted({r["size"] for r in w[tiers[0]]})
        fig, axes = plt.subplots(2 * len(tiers), len(sizes), figsize=(4.2 * len(sizes), 3.2 * 2 * len(tiers)),
                                 squeeze=False)
        for ti, tier in enumerate(tiers):
            for si, size in enumerate(sizes):
                for mi, (metric, label) in enumerate((("mib_s", "MiB/s"), ("p99_us", "p99 ms"))):
                    ax = axes[2 * ti + mi][si]
                    for t in TARGETS:
                        rs = sorted(by(w[tier], size=size, target=t), key=lambda r: r["clients"])
                        if rs:
                            ax.plot([r["clients"] for r in rs], [r[metric] for r in rs], "o-", label=t,
                                    color=COLORS[t])
                    ax.set_xscale("log", base=2)
                    if metric == "p99_us":
                        ax.set_yscale("log")
                    ax.set_title(f"{tier.replace('_', ' ')}, {size_name(size)}: {label}", fontsize=9)
                    ax.set_xlabel("clients", fontsize=8)
                    ax.grid(alpha=0.3)
                    ax.legend(fontsize=7)
        fig.suptitle(f"Cache hits: Larder vs nginx vs direct ({res['mode']} run, {res['machine']['date']})",
                     fontsize=10)
        fig.tight_layout()
        fig.savefig(out / "hits.png", dpi=90)
        plt.close(fig)

    fig, axes = plt.subplots(1, 4, figsize=(18, 3.8))
    rows = w.get("cold_ttfb", [])
    sizes = sorted({r["size"] for r in rows})
    for i, t in enumerate(TARGETS):
        vals = [(one(rows, size=s, target=t) or {}).get("ttfb_p50", 0) for s in sizes]
        axes[0].bar([x + i * 0.27 for x in range(len(sizes))], vals, 0.27, label=t, color=COLORS[t])
    axes[0].set_xticks([x + 0.27 for x in range(len(sizes))], [size_name(s) for s in sizes])
    axes[0].set_title("cold miss: time to first byte, p50 ms", fontsize=9)
    axes[0].legend(fontsize=7)
    herd = w.get("herd", [])
    axes[1].bar([r["target"] for r in herd], [r["upstream_gets"] for r in herd],
                color=[COLORS[r["target"]] for r in herd])
    axes[1].set_yscale("log")
    axes[1].set_title("thundering herd: upstream GETs (log)", fontsize=9)
    z = w.get("zipf", [])
    axes[2].bar([r["target"] for r in z], [r["hit_ratio"] for r in z], color=[COLORS[r["target"]] for r in z])
    axes[2].set_ylim(0, 1)
    axes[2].set_title("Zipf: request hit ratio", fontsize=9)
    pq = w.get("parquet", [])
    passes = list(dict.fromkeys(r["pass"] for r in pq))
    for i, t in enumerate(TARGETS):
        vals = [(one(pq, target=t, **{"pass": p}) or {}).get("upstream_mib", 0) for p in passes]
        axes[3].bar([x + i * 0.27 for x in range(len(passes))], vals, 0.27, label=t, color=COLORS[t])
    axes[3].set_xticks([x + 0.27 for x in range(len(passes))], [p.split(":")[0] for p in passes], fontsize=7)
    axes[3].set_title("Parquet-like reads: upstream MiB per pass", fontsize=9)
    axes[3].legend(fontsize=7)
    for ax in axes:
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(out / "upstream.png", dpi=90)
    plt.close(fig)


def ranges_plot(res, out: Path):
    import matplotlib  # noqa: PLC0415
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    rows = res["workloads"].get("cold_ranges", [])
    models = list(dict.fromkeys(r["model"] for r in rows))
    if not models:
        return
    fig, axes = plt.subplots(1, len(models), figsize=(6.5 * len(models), 3.8), squeeze=False)
    for ax, model in zip(axes[0], models):
        lengths = sorted({r["length"] for r in rows if r["model"] == model})
        for t in TARGETS:
            vals = [(one(rows, model=model, length=n, target=t) or {}).get("total_p50") for n in lengths]
            if any(v is not None for v in vals):
                ax.plot([size_name(n) for n in lengths], vals, "o-", label=t, color=COLORS[t])
        ax.set_yscale("log")
        ax.set_title(f"cold ranges, {model}: last byte p50 ms", fontsize=9)
        ax.set_xlabel("range length", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "ranges.png", dpi=90)
    plt.close(fig)


def write(res, out: Path):
    (out / "results.md").write_text(markdown(res))
    plots(res, out)
    ranges_plot(res, out)


if __name__ == "__main__":
    d = Path(sys.argv[1])
    write(json.loads((d / "results.json").read_text()), d)
