-- wrk script of the benchmark harness (Benchmarks/bench).
--
-- Through a forward proxy, wrk must send absolute-form request lines
-- ("GET http://127.0.0.1:PORT/1k HTTP/1.1") while connecting to the proxy.
-- The harness passes the request target in BENCH_PATH (an absolute URL through a
-- proxy, an origin-form path like "/1k" for the direct run) and the origin's
-- authority in BENCH_HOST, which becomes the Host header in both cases.
-- BENCH_DELAY_MS, when set, makes every connection wait that long between its
-- requests: a fixed request rate (the soak). BENCH_HEADERS, when set, holds more
-- header fields for every request, one "Name: value" per line (a scenario's `headers`).
--
-- done() prints one machine-readable line that the harness parses, so it does not
-- have to scrape wrk's human-readable output:
--   BENCH_RESULT requests=N duration_us=N bytes=N p50_us=N p99_us=N
--                err_connect=N err_read=N err_write=N err_status=N err_timeout=N

local path = os.getenv("BENCH_PATH")
local host = os.getenv("BENCH_HOST")
local delay_ms = tonumber(os.getenv("BENCH_DELAY_MS") or "")
-- BENCH_METHOD and BENCH_BODY_BYTES, when set: every request is that method with a body of
-- that many bytes (an upload).
local method = os.getenv("BENCH_METHOD")
local body_bytes = tonumber(os.getenv("BENCH_BODY_BYTES") or "")
if method and method ~= "" then
   wrk.method = method
end
if body_bytes then
   wrk.body = string.rep("x", body_bytes)
end

if path and path ~= "" then
   wrk.path = path
end
if host and host ~= "" then
   wrk.headers["Host"] = host
end
for line in (os.getenv("BENCH_HEADERS") or ""):gmatch("[^\n]+") do
   local name, value = line:match("^([^:]+):%s*(.*)$")
   if name then
      wrk.headers[name] = value
   end
end
if delay_ms then
   function delay()
      return delay_ms
   end
end

function done(summary, latency, requests)
   local e = summary.errors
   io.write(string.format(
      "BENCH_RESULT requests=%d duration_us=%d bytes=%d p50_us=%d p99_us=%d " ..
      "err_connect=%d err_read=%d err_write=%d err_status=%d err_timeout=%d\n",
      summary.requests, summary.duration, summary.bytes,
      latency:percentile(50.0), latency:percentile(99.0),
      e.connect, e.read, e.write, e.status, e.timeout))
end
