#!/usr/bin/env python3
"""Writes Larder's Grafana dashboards (overview, cost, cache internals) as JSON next to this file.

The panels are declared here once, compactly; the JSON files are what Grafana and the Helm chart
load. Edit this file, run it, and commit both. The e2e suite checks that the JSON is what this
script writes and that every metric a panel queries exists on a live Larder.
"""

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
RI = "$__rate_interval"

# What counts as a hit, a cacheable read, and an upstream failure, as the status page says too.
HITS = 'cache=~"hit-memory|hit-disk"'
CACHEABLE = 'cache=~"hit-memory|hit-disk|partial|coalesced|miss"'
NET_RATE = (f"sum(rate(larder_cost_direct_dollars_total[{RI}])) - "
            f"sum(rate(larder_cost_upstream_dollars_total[{RI}]))")


def quantiles(metric, by=""):
    group = f"le{', ' + by if by else ''}"
    return [(f"histogram_quantile({q}, sum by ({group}) (rate({metric}_bucket[{RI}])))",
             f"p{int(q * 100)}{' {{' + by + '}}' if by else ''}") for q in (0.5, 0.99)]


def panel(title, targets, unit="short", kind="timeseries", description="", w=12, h=8, stack=False):
    return {"title": title, "targets": targets, "unit": unit, "kind": kind,
            "description": description, "w": w, "h": h, "stack": stack}


def stat(title, expr, unit, description="", w=6):
    return panel(title, [(expr, title)], unit, "stat", description, w=w, h=5)


OVERVIEW = [
    stat("Request hit ratio",
         f"sum(rate(larder_requests_total{{{HITS}}}[{RI}])) / sum(rate(larder_requests_total{{{CACHEABLE}}}[{RI}]))",
         "percentunit", "Cacheable reads (GetObject, HeadObject) answered wholly from memory or disk."),
    stat("Byte hit ratio",
         f'sum(rate(larder_served_bytes_total{{tier=~"memory|disk"}}[{RI}])) / sum(rate(larder_served_bytes_total[{RI}]))',
         "percentunit", "Object bytes sent to clients that came from a cache tier."),
    stat("Saving per day", f"({NET_RATE}) * 86400", "currencyUSD",
         "What the clients' requests would have cost sent straight to S3, minus what Larder's upstream traffic cost, at the current rate."),
    stat("Upstream failure ratio",
         f'sum(rate(larder_upstream_requests_total{{status!~"2..|304|404|412|416"}}[{RI}])) / sum(rate(larder_upstream_requests_total[{RI}]))',
         "percentunit", "Upstream requests answered 5xx/403 or failed without an answer (timeout, transport, truncated)."),
    panel("Requests by cache result", [(f"sum by (cache) (rate(larder_requests_total[{RI}]))", "{{cache}}")],
          "reqps", stack=True),
    panel("Requests by operation and status",
          [(f"sum by (operation, status) (rate(larder_requests_total[{RI}]))", "{{operation}} {{status}}")], "reqps"),
    panel("Throughput by source tier", [(f"sum by (tier) (rate(larder_served_bytes_total[{RI}]))", "{{tier}}")],
          "Bps", stack=True),
    panel("Time to first byte", quantiles("larder_request_ttfb_seconds"), "s"),
    panel("Whole response time", quantiles("larder_response_duration_seconds"), "s"),
    panel("Upstream requests by status",
          [(f"sum by (operation, status) (rate(larder_upstream_requests_total[{RI}]))", "{{operation}} {{status}}"),
           (f"rate(larder_upstream_retries_total[{RI}])", "retries")],
          "reqps"),
    panel("Upstream latency (to headers)", quantiles("larder_upstream_duration_seconds"), "s"),
    panel("Upstream faults absorbed",
          [(f"rate(larder_upstream_retries_total[{RI}])", "retried (client library, throttle)"),
           (f"rate(larder_upstream_resumes_total[{RI}])", "bodies resumed mid-stream"),
           (f'rate(larder_upstream_hedges_total{{outcome="sent"}}[{RI}])', "hedges sent"),
           (f'rate(larder_upstream_hedges_total{{outcome="won"}}[{RI}])', "hedges won"),
           (f'sum(rate(larder_requests_total{{cache=~"stale.*"}}[{RI}]))', "served stale"),
           (f'rate(larder_upstream_throttle_total{{event="delayed"}}[{RI}])', "requests paced (prefix throttled)"),
           (f'rate(larder_upstream_throttle_total{{event=~"limited|cut"}}[{RI}])', "prefix throttles (SlowDown)")],
          "ops",
          description="Faults the clients did not see. Stale answers mean the upstream is failing; paced requests "
                      "mean S3 answered SlowDown for a prefix and Larder slowed that prefix down."),
    panel("Keys held back by their limits",
          [(f"sum by (access_key) (rate(larder_client_throttled_total[{RI}]))", "{{access_key}} refused (SlowDown)"),
           (f"sum by (access_key) (rate(larder_client_paced_seconds_total[{RI}]))", "{{access_key}} paced (s/s)")],
          "short",
          description="Keys with requests_per_second or bytes_per_second in auth_policies: requests a second refused "
                      "with SlowDown, and seconds a second their responses waited for their byte rate. Empty when no "
                      "key has a limit."),
    panel("Tier usage", [("larder_memory_used_bytes / larder_memory_capacity_bytes", "memory"),
                         ("larder_disk_live_bytes / larder_disk_capacity_bytes", "disk")], "percentunit"),
]

COST = [
    stat("Net saving over the range",
         "sum(increase(larder_cost_direct_dollars_total[$__range])) - sum(increase(larder_cost_upstream_dollars_total[$__range]))",
         "currencyUSD", "Direct cost of the clients' requests minus what Larder spent upstream, over the dashboard's time range.", w=8),
    stat("Saving per month, at the current rate", f"({NET_RATE}) * 86400 * 30", "currencyUSD", w=8),
    stat("Upstream requests avoided",
         f'1 - sum(rate(larder_upstream_requests_total{{operation=~"GetObject|HeadObject"}}[{RI}])) / sum(rate(larder_requests_total{{operation=~"GetObject|HeadObject"}}[{RI}]))',
         "percentunit", "Share of client reads that did not cause an upstream request.", w=8),
    panel("Dollars per day: direct vs. upstream",
          [(f"sum by (kind) (rate(larder_cost_direct_dollars_total[{RI}])) * 86400", "direct {{kind}}"),
           (f"sum by (kind) (rate(larder_cost_upstream_dollars_total[{RI}])) * 86400", "upstream {{kind}}")],
          "currencyUSD", "Requests and transfer, as S3 would bill them; the gap is the saving."),
    panel("Net saving per day by bucket",
          [(f"(sum by (bucket) (rate(larder_cost_direct_dollars_total[{RI}])) - sum by (bucket) "
            f"(rate(larder_cost_upstream_dollars_total[{RI}])) or sum by (bucket) "
            f"(rate(larder_cost_direct_dollars_total[{RI}]))) * 86400", "{{bucket}}")],
          "currencyUSD", "Each bucket's direct cost minus everything Larder spent upstream on it (misses, read-ahead, "
                         "revalidation); buckets are labelled only when listed in metrics_buckets."),
    panel("Saved per day by client key",
          [(f"sum by (access_key) (rate(larder_key_cost_saved_dollars_total[{RI}])) * 86400", "{{access_key}} saved"),
           (f"sum by (access_key) (rate(larder_key_cost_direct_dollars_total[{RI}])) * 86400", "{{access_key}} without the cache")],
          "currencyUSD", "What each key's requests would have cost straight from S3, and how much of it the cache answered "
                         "(hits, joined fetches, cached listings). Upstream spending is shared and counted by bucket, not by key."),
    panel("Share of each key's requests answered from the cache",
          [(f"sum by (access_key) (rate(larder_key_requests_cached_total[{RI}])) / sum by (access_key) "
            f"(rate(larder_key_requests_total[{RI}]))", "{{access_key}}")],
          "percentunit"),
    panel("Requests: asked of Larder vs. sent upstream",
          [(f"sum(rate(larder_requests_total[{RI}]))", "asked of Larder"),
           (f"sum(rate(larder_upstream_requests_total[{RI}]))", "sent upstream")], "reqps"),
    panel("Bytes: served vs. fetched upstream",
          [(f"sum(rate(larder_served_bytes_total[{RI}]))", "served to clients"),
           (f"sum(rate(larder_upstream_received_bytes_total[{RI}]))", "fetched upstream")], "Bps"),
]

INTERNALS = [
    panel("Memory tier", [("larder_memory_used_bytes", "used"), ("larder_memory_capacity_bytes", "capacity"),
                          ("larder_memory_recent_bytes", "of used: blocks let go, kept a little longer")], "bytes"),
    panel("Memory entries and evictions", [("larder_memory_entries", "entries"),
                                           (f"rate(larder_memory_evictions_total[{RI}])", "evictions/s"),
                                           (f"rate(larder_memory_recent_hits_total[{RI}])", "reads of blocks let go/s")],
          description="Evictions include blocks TinyLFU admission turned away; the reads of blocks let go are reads "
                      "the tier's recent share served (each would otherwise have gone to disk or upstream)."),
    panel("Buffers beyond the memory tier",
          [("larder_response_buffer_bytes", "held by responses"), ("larder_response_buffer_limit_bytes", "response_buffer"),
           ("larder_buffer_pool_bytes", "idle, kept for reuse"), ("larder_buffer_pool_limit_bytes", "reuse pool limit")],
          "bytes", description="Blocks responses hold beyond the memory tier, and idle large buffers kept for the next disk "
                               "read or fill (at most a quarter of response_buffer)."),
    panel("Large buffers allocated fresh", [(f"rate(larder_buffer_pool_fresh_total[{RI}])", "fresh/s"),
                                            (f"rate(larder_buffer_pool_given_back_total[{RI}])", "given back/s")], "ops",
          description="Disk reads and fills the reuse pool had no buffer for: each zeroes and faults in new memory. "
                      "High under steady load: more large reads at once than a quarter of response_buffer covers. "
                      "Given back: buffers whose pages were sent by reference, refaulted on their next use."),
    panel("Memory-hit bytes sent by reference",
          [(f'sum(rate(larder_buffer_pool_lent_bytes_total[{RI}])) / sum(rate(larder_served_bytes_total{{tier="memory"}}[{RI}]))',
            "share sent without a copy")], "percentunit",
          description="Bytes of memory hits whose pages went to the socket by reference (send_by_reference) rather than "
                      "copied into it. Clients on other hosts get hot blocks' bodies by reference; under auto, clients "
                      "on this host get those of blocks up to 256 KiB, and up to 1 MiB while eight connections on this "
                      "host send large bodies. TLS and HTTP/2 always copy."),
    panel("Lookup hit ratio by tier",
          [(f'sum by (tier) (rate(larder_cache_lookups_total{{result="hit"}}[{RI}])) / sum by (tier) (rate(larder_cache_lookups_total[{RI}]))',
            "{{tier}}")], "percentunit"),
    panel("Single-flight", [(f"rate(larder_singleflight_coalesced_total[{RI}])", "reads joined a fetch in flight")],
          "ops"),
    panel("Disk tier", [("larder_disk_live_bytes", "live"), ("larder_disk_capacity_bytes", "capacity"),
                        ("larder_disk_index_bytes", "index (RAM)")], "bytes"),
    panel("Disk entries and regions", [("larder_disk_entries", "entries"), ("larder_disk_inflight_entries", "in flight"),
                                       ("larder_disk_free_regions", "free regions")]),
    panel("Disk I/O", [(f"rate(larder_disk_hit_bytes_total[{RI}])", "read"),
                       (f"rate(larder_disk_written_bytes_total[{RI}])", "written")], "Bps"),
    panel("Disk reads", [(f"rate(larder_disk_hits_total[{RI}])", "hits"), (f"rate(larder_disk_misses_total[{RI}])", "misses"),
                         (f"rate(larder_disk_writes_total[{RI}])", "writes (admissions)")], "ops"),
    panel("Disk faults (served as misses)",
          [(f"rate(larder_disk_corrupt_reads_total[{RI}])", "checksum failures"),
           (f"rate(larder_disk_io_errors_total[{RI}])", "I/O errors"),
           (f"rate(larder_disk_raced_reads_total[{RI}])", "raced reclaim"),
           (f"rate(larder_disk_hash_collisions_total[{RI}])", "hash collisions")], "ops",
          description="Any checksum failure or I/O error is worth an alert: the byte was not served, but the device is suspect."),
    panel("Reclaim", [(f"rate(larder_disk_reclaimed_regions_total[{RI}])", "regions reclaimed"),
                      (f"rate(larder_disk_evicted_entries_total[{RI}])", "entries evicted"),
                      (f"rate(larder_disk_reinserted_entries_total[{RI}])", "entries reinserted")], "ops"),
    panel("Cache writes dropped",
          [(f"sum by (reason) (rate(larder_disk_writes_dropped_total[{RI}]))", "disk: {{reason}}"),
           (f"sum by (reason) (rate(larder_cache_writes_dropped_total[{RI}]))", "cache: {{reason}}")], "ops",
          description="Blocks fetched but not written; rate limits and full buffers protect reads at the cost of later misses."),
    panel("Read-ahead", [(f"sum by (outcome) (rate(larder_prefetch_blocks_total[{RI}]))", "blocks {{outcome}}")], "ops"),
    panel("Read-ahead bytes: used vs. wasted",
          [(f"sum by (outcome) (rate(larder_prefetch_bytes_total[{RI}]))", "{{outcome}}")], "Bps",
          description="Wasted read-ahead is upstream traffic nobody read: it counts against the saving."),
    panel("Warm-up", [(f"rate(larder_warm_bytes_total[{RI}])", "bytes fetched/s"),
                      (f"sum by (outcome) (increase(larder_warm_jobs_total[{RI}]))", "jobs {{outcome}}")]),
    panel("Disk recovery at start", [("larder_disk_recovered_entries_total", "entries recovered"),
                                     ("larder_disk_recovery_milliseconds", "milliseconds")]),
    panel("S3 events", [("min(larder_events_stream_healthy)", "stream healthy (1) or silent (0)"),
                        (f"sum by (outcome) (rate(larder_events_total[{RI}]))", "events {{outcome}}")],
          description="Only where events are expected (events_token_file, events_sqs_queue_url). At 0 no event "
                      "came within events_max_silence, and metadata is trusted for events_fallback_ttl only "
                      "(the LarderEventStreamSilent alert)."),
]

# The fleet (docs/scale-out.md): empty for a replica that is not part of one.
FLEET = [
    panel("Fleet: members and owners", [("larder_fleet_members", "members seen"),
                                         ("larder_fleet_owners", "may own blocks (zone or fleet)")],
          description="Replicas each replica sees (answering its probes); a dip is a replica down or restarting."),
    panel("Fleet: membership changes",
          [(f"increase(larder_fleet_membership_changes_total[{RI}])", "changes"),
           ("larder_fleet_keys_moved_ratio", "keys moved at the last change")],
          description="A join or leave should move about 1/N of the keys."),
    panel("Peer requests",
          [(f"sum by (direction, kind, outcome) (rate(larder_peer_requests_total[{RI}]))",
            "{{direction}} {{kind}} {{outcome}}")], "ops",
          description="Blocks asked of their owners (made) and served to other replicas (served)."),
    panel("Peer fallbacks to S3", [(f"sum by (reason) (rate(larder_peer_fallbacks_total[{RI}]))", "{{reason}}")],
          "ops", description="Peer requests given up for S3: each one is an S3 request the fleet meant to save."),
    panel("Peer latency (to first byte)", quantiles("larder_peer_duration_seconds", "kind"), "s"),
    panel("Bytes between replicas", [(f"sum by (direction) (rate(larder_peer_bytes_total[{RI}]))", "{{direction}}")],
          "Bps"),
]


def dashboard(uid, title, description, panels):
    out, x, y, row_h = [], 0, 0, 0
    for i, p in enumerate(panels, start=1):
        if x + p["w"] > 24:
            x, y, row_h = 0, y + row_h, 0
        targets = [{"refId": chr(ord("A") + j), "expr": expr, "legendFormat": legend,
                    "datasource": {"type": "prometheus", "uid": "${datasource}"}}
                   for j, (expr, legend) in enumerate(p["targets"])]
        entry = {
            "id": i, "type": p["kind"], "title": p["title"], "description": p["description"],
            "gridPos": {"x": x, "y": y, "w": p["w"], "h": p["h"]},
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "targets": targets,
            "fieldConfig": {"defaults": {"unit": p["unit"]}, "overrides": []},
            "options": {},
        }
        if p["kind"] == "stat":
            entry["options"] = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                                "colorMode": "value", "graphMode": "area"}
        elif p["stack"]:
            entry["fieldConfig"]["defaults"]["custom"] = {"stacking": {"mode": "normal"}, "fillOpacity": 20}
        out.append(entry)
        x += p["w"]
        row_h = max(row_h, p["h"])
    return {
        "uid": uid, "title": title, "description": description, "tags": ["larder"],
        "schemaVersion": 39, "version": 1, "editable": True, "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {"list": [{"name": "datasource", "label": "Prometheus", "type": "datasource",
                                 "query": "prometheus", "current": {}, "hide": 0}]},
        "panels": out,
    }


DASHBOARDS = {
    "larder-overview.json": dashboard("larder-overview", "Larder / Overview",
                                      "Hit ratios, saving, throughput, latency and upstream health.", OVERVIEW),
    "larder-cost.json": dashboard("larder-cost", "Larder / Cost and savings",
                                  "What S3 would have billed without Larder, what Larder spent, and the difference.", COST),
    "larder-internals.json": dashboard("larder-internals", "Larder / Cache internals",
                                       "Memory and disk tiers, single-flight, disk I/O, faults, reclaim and drops; the fleet.",
                                       INTERNALS + FLEET),
}


def render(dashboard_json) -> str:
    return json.dumps(dashboard_json, indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    for name, d in DASHBOARDS.items():
        (HERE / name).write_text(render(d))
        print(f"wrote {HERE / name}")
