-- wrk script for tests/proxy-bench.sh: POSTs PB_BODY (JSON) and, when done,
-- prints one line "PBRESULT {json}" with the counts and latency in µs.
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = os.getenv("PB_BODY") or error("PB_BODY is not set")

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'PBRESULT {"requests":%d,"duration_us":%d,"connect":%d,"read":%d,"write":%d,' ..
    '"status":%d,"timeout":%d,"p50_us":%.1f,"p99_us":%.1f,"mean_us":%.1f,"max_us":%.1f}\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(99), latency.mean, latency.max))
end
