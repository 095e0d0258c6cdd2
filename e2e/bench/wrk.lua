-- wrk script for e2e/bench/compare.py: GETs the paths listed in a file (one per line) in turn,
-- each connection starting at a different place, and prints a JSON summary with the latency
-- percentiles wrk's own summary leaves out (p99.9). No response() hook on purpose: with one,
-- wrk copies every body into Lua, which would make wrk the bottleneck for large objects.
local paths = {}
local counter = 0
local threads = {}

function setup(thread)
  table.insert(threads, thread)
  thread:set("offset", #threads * 7919)
end

function init(args)
  for line in io.lines(args[1]) do
    if #line > 0 then table.insert(paths, line) end
  end
  counter = offset or 0
end

function request()
  counter = counter + 1
  return wrk.format("GET", paths[(counter % #paths) + 1])
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRK-JSON {"requests":%d,"bytes":%d,"duration_us":%d,"connect_errors":%d,"read_errors":%d,' ..
    '"write_errors":%d,"status_errors":%d,"timeouts":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d,' ..
    '"p999_us":%d,"max_us":%d,"mean_us":%.1f}\n',
    summary.requests, summary.bytes, summary.duration, e.connect, e.read, e.write, e.status,
    e.timeout, latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency:percentile(99.9), latency.max, latency.mean))
end
