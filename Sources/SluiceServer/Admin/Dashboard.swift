import CLibEvent
import Foundation
import SluiceCore

#if canImport(Glibc)
    import Glibc
#endif

/// The admin listener's live dashboard: `GET /` is one self-contained page (no external
/// assets) that reads `GET /dashboard/events`, a Server-Sent Events stream with one
/// `DashboardPayload` per second, through `fetch` (so it can send the bearer token, which
/// `EventSource` cannot; the page takes the token from its URL's `#token=` fragment, which
/// never leaves the browser, or asks for it). `GET /dashboard/data` answers one payload.
///
/// Once a second, page open or not, the current payload is also kept in `history` (the last
/// 15 minutes, `DashboardHistory`), which `GET /dashboard/history` answers.
///
/// Threading: owned by the `AdminServer`; every call runs on the admin thread. Lifetime
/// across the C boundary: a stream's `evhttp_request` is used only until libevent reports
/// its connection closed (`closed(_:)` removes it), or until `stop()` ends it.
final class Dashboard {
    private let base: OpaquePointer
    private var streams: [(request: OpaquePointer, connection: OpaquePointer)] = []
    private var timer: OpaquePointer!
    /// Builds the current payload (the admin server asks the workers for their counts);
    /// `true`: for a page (every field), `false`: for the history alone (what it keeps).
    private let payload: (_ forPage: Bool) -> DashboardPayload
    /// One sample a second, the last 15 minutes.
    private(set) var history = DashboardHistory()

    init(base: OpaquePointer, payload: @escaping (_ forPage: Bool) -> DashboardPayload) {
        self.base = base
        self.payload = payload
        timer = event_new(
            base, -1, Int16(EV_PERSIST),
            { _, _, arg in
                Unmanaged<Dashboard>.fromOpaque(arg!).takeUnretainedValue().tick()
            }, Unmanaged.passUnretained(self).toOpaque())
        // The first sample at the first tick: the workers do not run yet (they would not
        // answer a sample taken now).
        var second = timeval(tv_sec: 1, tv_usec: 0)
        event_add(timer, &second)
    }

    deinit { event_free(timer) }

    /// Starts an event stream on `request` (already authorized): the first event now, then
    /// one a second.
    func startStream(_ request: OpaquePointer) {
        guard let connection = evhttp_request_get_connection(request) else { return }
        if let headers = evhttp_request_get_output_headers(request) {
            evhttp_add_header(headers, "Content-Type", "text/event-stream")
            evhttp_add_header(headers, "Cache-Control", "no-store")
        }
        evhttp_send_reply_start(request, 200, "OK")
        evhttp_connection_set_closecb(
            connection,
            { connection, arg in
                guard let connection else { return }
                Unmanaged<Dashboard>.fromOpaque(arg!).takeUnretainedValue().closed(connection)
            }, Unmanaged.passUnretained(self).toOpaque())
        streams.append((request, connection))
        send(Self.event(payload(true)), to: [request])
    }

    private func closed(_ connection: OpaquePointer) {
        streams.removeAll { $0.connection == connection }
    }

    /// Once a second: the history's sample, and the open streams' event.
    private func tick() {
        let current = payload(!streams.isEmpty)
        record(current)
        guard !streams.isEmpty else { return }
        send(Self.event(current), to: streams.map(\.request))
    }

    private func record(_ p: DashboardPayload) {
        history.append(
            DashboardHistory.Sample(
                timeMilliseconds: p.timeMilliseconds, requests: p.requests, errors: p.errors, retries: p.retries,
                bytesOut: p.totalBytesOut, inFlight: Int64(p.inFlight),
                connections: Int64(p.connections), p50: p.p50, p99: p.p99))
    }

    private func send(_ event: [UInt8], to requests: [OpaquePointer]) {
        for request in requests {
            let chunk = evbuffer_new()
            event.withUnsafeBytes { _ = evbuffer_add(chunk, $0.baseAddress, $0.count) }
            evhttp_send_reply_chunk(request, chunk)
            evbuffer_free(chunk)
        }
    }

    /// Ends every stream (the admin loop is stopping).
    func stop() {
        event_del(timer)
        for stream in streams { evhttp_send_reply_end(stream.request) }
        streams.removeAll()
    }

    /// Where the page loads its charting library from: the admin listener itself, which serves
    /// Debian's Chart.js (`libjs-chart.js`), so the page needs no network.
    static let chartLibraryPath = "/dashboard/chart.js"
    /// The files tried, in order (Debian's package; a copy next to a static install).
    static let chartLibraryFiles = [
        "/usr/share/javascript/chart.js/chart.min.js", "/usr/local/share/sluice/chart.min.js",
    ]
    private var chartLibraryBody: [UInt8]?

    /// `GET /dashboard/chart.js`: Chart.js, read once; 404 with what to install when it is
    /// missing (the page then shows its numbers without charts, and says why).
    func chartLibrary() -> AdminResponse {
        if chartLibraryBody == nil {
            for path in Self.chartLibraryFiles {
                if let data = FileManager.default.contents(atPath: path), !data.isEmpty {
                    chartLibraryBody = Array(data)
                    break
                }
            }
        }
        guard let body = chartLibraryBody else {
            return .error(
                404, "the dashboard's charts need Chart.js: apt install libjs-chart.js (\(Self.chartLibraryFiles[0]))")
        }
        return AdminResponse(
            status: 200, contentType: "text/javascript; charset=utf-8", headers: [("Cache-Control", "max-age=86400")],
            body: body)
    }

    static func event(_ payload: DashboardPayload) -> [UInt8] {
        Array("data: ".utf8) + AdminResponse.encoded(200, payload).body.dropLast() + Array("\n\n".utf8)
    }
}

/// `GET /dashboard/history` (`docs/admin-api.yaml`, `DashboardHistory`): the samples kept,
/// oldest first, as one array per field (compact, and what a chart takes).
struct DashboardHistoryView: Encodable {
    let intervalMilliseconds = 1000
    let capacity = DashboardHistory.capacity
    let memoryBytes = DashboardHistory.memoryBytes
    let timeMilliseconds: [Int64]
    let requests: [Int64]
    let errors: [Int64]
    let retries: [Int64]
    let bytesOut: [Int64]
    let inFlight: [Int64]
    let connections: [Int64]
    let p50: [Double?]
    let p99: [Double?]

    enum CodingKeys: String, CodingKey {
        case capacity, requests, errors, retries, connections
        case intervalMilliseconds = "interval_ms"
        case memoryBytes = "memory_bytes"
        case timeMilliseconds = "time_ms"
        case bytesOut = "bytes_out"
        case inFlight = "in_flight"
        case p50 = "p50_ms"
        case p99 = "p99_ms"
    }

    init(_ history: DashboardHistory) {
        let samples = history.samples
        timeMilliseconds = samples.map(\.timeMilliseconds)
        requests = samples.map(\.requests)
        errors = samples.map(\.errors)
        retries = samples.map(\.retries)
        bytesOut = samples.map(\.bytesOut)
        inFlight = samples.map(\.inFlight)
        connections = samples.map(\.connections)
        p50 = samples.map(\.p50)
        p99 = samples.map(\.p99)
    }
}

/// One dashboard update (`docs/admin-api.yaml`, `DashboardPayload`). Counters are totals
/// since start; the page turns two of them into rates.
struct DashboardPayload: Encodable {
    struct Host: Encodable {
        let host: String
        let requests: Int64
        let errors: Int64
        let retries: Int64
        let bytesOut: Int64
        let meanMilliseconds: Double?
        enum CodingKeys: String, CodingKey {
            case host, requests, errors, retries
            case bytesOut = "bytes_out"
            case meanMilliseconds = "mean_ms"
        }
    }

    let timeMilliseconds: Int64
    let configurationGeneration: Int
    let requests: Int64
    let errors: Int64
    let retries: Int64
    let inFlight: Int
    let connections: Int
    let p50: Double?
    let p90: Double?
    let p99: Double?
    /// False when the `metrics` monitor is not configured (only the gauges move then).
    let recording: Bool
    let hosts: [Host]
    /// Every host's bytes out together (`hosts` has the busiest 50).
    let totalBytesOut: Int64
    /// Every policy with `rate_limit`: its line and the origins' holds (`GET /limits` has more).
    var limits: [Limit] = []
    /// The fleet (`fleet:`), when one is configured.
    var fleet: Fleet?

    struct Fleet: Encodable {
        let instancesAlive: Int
        let fallbacks: Int
        enum CodingKeys: String, CodingKey {
            case fallbacks
            case instancesAlive = "instances_alive"
        }
    }

    struct Limit: Encodable {
        let policy: String
        let waiting: Int
        let inFlight: Int
        let waited: Int
        let rejected: Int
        /// The holds still running: key, seconds left, where the origin said so.
        let holds: [String]
        enum CodingKeys: String, CodingKey {
            case policy, waiting, waited, rejected, holds
            case inFlight = "in_flight"
        }

        init(_ state: RateLimitTable.PolicyState) {
            policy = state.policy
            waiting = state.waiting
            inFlight = state.inFlight
            waited = state.counts.waited
            rejected = state.counts.rejected
            holds = state.holds.map { "\($0.key): \(($0.remaining + 999_999) / 1_000_000) s (\($0.reason))" }
        }
    }

    enum CodingKeys: String, CodingKey {
        case requests, errors, retries, connections, recording, hosts, limits, fleet
        case totalBytesOut = "bytes_out"
        case timeMilliseconds = "time_ms"
        case configurationGeneration = "configuration_generation"
        case inFlight = "in_flight"
        case p50 = "p50_ms"
        case p90 = "p90_ms"
        case p99 = "p99_ms"
    }

    /// The busiest 50 hosts are sent.
    static let maxRows = 50

    init(stats: DashboardStats.Snapshot, generation: Int, inFlight: Int, connections: Int, recording: Bool) {
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        timeMilliseconds = Int64(now.tv_sec) * 1000 + Int64(now.tv_nsec) / 1_000_000
        configurationGeneration = generation
        requests = stats.requests
        errors = stats.errors
        retries = stats.retries
        self.inFlight = inFlight
        self.connections = connections
        p50 = stats.p50
        p90 = stats.p90
        p99 = stats.p99
        self.recording = recording
        totalBytesOut = stats.hosts.reduce(0) { $0 + $1.row.bytesOut }
        hosts = stats.hosts.prefix(Self.maxRows).map { row in
            Host(
                host: row.host, requests: row.row.requests, errors: row.row.errors, retries: row.row.retries,
                bytesOut: row.row.bytesOut,
                meanMilliseconds: row.row.requests > 0 && row.row.totalMicroseconds > 0
                    ? Double(row.row.totalMicroseconds) / Double(row.row.requests) / 1000 : nil)
        }
    }
}

extension Dashboard {
    /// The page: HTML, CSS and script in one response, nothing fetched from elsewhere.
    static let page = #"""
        <!doctype html>
        <html lang="en">
        <head>
        <meta charset="utf-8">
        <meta name="viewport" content="width=device-width, initial-scale=1">
        <title>Sluice</title>
        <style>
          :root { color-scheme: light dark; font-family: system-ui, sans-serif; }
          body { margin: 1.5rem; }
          h1 { font-size: 1.3rem; margin: 0 0 1rem; }
          #status { font-size: .9rem; margin-left: .5rem; font-weight: normal; }
          .cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(9rem, 1fr)); gap: .75rem; }
          .card { border: 1px solid #8884; border-radius: .5rem; padding: .6rem .8rem; }
          .card b { display: block; font-size: 1.5rem; font-variant-numeric: tabular-nums; }
          .card span { font-size: .8rem; opacity: .75; }
          table { border-collapse: collapse; margin-top: 1.25rem; width: 100%; font-variant-numeric: tabular-nums; }
          th, td { text-align: right; padding: .3rem .6rem; border-bottom: 1px solid #8883; }
          th:first-child, td:first-child { text-align: left; }
          form { margin: 1rem 0; }
          .charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(22rem, 1fr)); gap: .75rem; margin-top: 1.25rem; }
          .chart { border: 1px solid #8884; border-radius: .5rem; padding: .5rem .8rem; }
          .chart h2 { font-size: .85rem; font-weight: normal; opacity: .75; margin: 0 0 .3rem; }
          .chart div { position: relative; height: 10rem; }
          .circuit-open { color: #ef4444; font-weight: bold; }
          .circuit-half_open { color: #f59e0b; font-weight: bold; }
        </style>
        <script src="/dashboard/chart.js"></script>
        </head>
        <body>
        <h1>Sluice <span id="status">connecting…</span></h1>
        <form id="login" hidden><label>Admin token <input id="token" type="password" autocomplete="off"></label>
          <button>Connect</button></form>
        <div class="cards">
          <div class="card"><b id="rate">–</b><span>requests/s</span></div>
          <div class="card"><b id="errors">–</b><span>errors (5xx, failed)</span></div>
          <div class="card"><b id="retries">–</b><span>retries/s</span></div>
          <div class="card"><b id="p50">–</b><span>p50 upstream ms</span></div>
          <div class="card"><b id="p90">–</b><span>p90 upstream ms</span></div>
          <div class="card"><b id="p99">–</b><span>p99 upstream ms</span></div>
          <div class="card"><b id="inflight">–</b><span>in flight</span></div>
          <div class="card"><b id="connections">–</b><span>client connections</span></div>
          <div class="card"><b id="total">–</b><span>requests since start</span></div>
          <div class="card"><b id="generation">–</b><span>configuration generation</span></div>
        </div>
        <div class="charts" id="charts">
          <div class="chart"><h2>requests/s</h2><div><canvas id="c-rate"></canvas></div></div>
          <div class="chart"><h2>errors (5xx, failed), % of requests</h2><div><canvas id="c-errors"></canvas></div></div>
          <div class="chart"><h2>upstream latency, ms</h2><div><canvas id="c-latency"></canvas></div></div>
          <div class="chart"><h2>retries/s</h2><div><canvas id="c-retries"></canvas></div></div>
          <div class="chart"><h2>connections and requests in flight</h2><div><canvas id="c-load"></canvas></div></div>
          <div class="chart"><h2>response bytes/s to clients</h2><div><canvas id="c-bytes"></canvas></div></div>
        </div>
        <p id="nocharts" hidden>The charts need Chart.js on the gateway: <code>apt install libjs-chart.js</code>. The numbers above still update.</p>
        <p id="fleet" hidden>Fleet: <b id="instances">–</b> instances alive; <b id="fallbacks">–</b> rate-limit decisions taken without Redis.</p>
        <p id="norecording" hidden>The <code>metrics</code> monitor is not configured: only in-flight requests and connections move.</p>
        <table>
          <thead><tr><th>host</th><th>requests</th><th>req/s</th><th>errors</th><th>retries</th><th>mean ms</th><th>bytes out</th></tr></thead>
          <tbody id="hosts"></tbody>
        </table>
        <table id="upstreamstable" hidden>
          <thead><tr><th>origin (health)</th><th>circuit</th><th>failures in a row</th><th>opened</th><th>opens</th><th>failed fast</th></tr></thead>
          <tbody id="upstreams"></tbody>
        </table>
        <table id="limitstable" hidden>
          <thead><tr><th>rate_limit policy</th><th>waiting</th><th>in flight</th><th>waited</th><th>refused (429)</th><th>origin holds</th></tr></thead>
          <tbody id="limits"></tbody>
        </table>
        <p><span id="ticks">0</span> updates</p>
        <script>
        "use strict";
        const $ = (id) => document.getElementById(id);
        const fmt = (v, digits) => v === null || v === undefined ? "–" : Number(v).toFixed(digits);
        let previous = null;
        let previousHosts = new Map();

        // The last 15 minutes: one point a second, from GET /dashboard/history at the start and
        // then from each event. Counters become rates between consecutive samples.
        const WINDOW = 900;
        const series = { t: [], rate: [], errors: [], p50: [], p99: [], retries: [], connections: [], inflight: [], bytes: [] };
        const charts = [];
        let lastSample = null;
        const clock = (ms) => new Date(ms).toLocaleTimeString([], { hour12: false });

        function makeCharts() {
          if (!window.Chart) { $("nocharts").hidden = false; $("charts").hidden = true; return; }
          const chart = (id, lines) => {
            charts.push(new Chart($(id), {
              type: "line",
              data: { labels: series.t, datasets: lines.map(([label, key, color]) =>
                ({ label, data: series[key], borderColor: color, backgroundColor: color, pointRadius: 0, borderWidth: 1.5, tension: 0, spanGaps: true })) },
              options: { animation: false, responsive: true, maintainAspectRatio: false,
                scales: { x: { ticks: { maxTicksLimit: 6, maxRotation: 0 } }, y: { beginAtZero: true } },
                plugins: { legend: { display: lines.length > 1, labels: { boxWidth: 12 } } } },
            }));
          };
          chart("c-rate", [["requests/s", "rate", "#3b82f6"]]);
          chart("c-errors", [["errors %", "errors", "#ef4444"]]);
          chart("c-latency", [["p50", "p50", "#10b981"], ["p99", "p99", "#f59e0b"]]);
          chart("c-retries", [["retries/s", "retries", "#8b5cf6"]]);
          chart("c-load", [["client connections", "connections", "#0ea5e9"], ["in flight", "inflight", "#f97316"]]);
          chart("c-bytes", [["bytes/s", "bytes", "#64748b"]]);
        }

        function addSample(s) {
          if (lastSample && s.time_ms > lastSample.time_ms) {
            const dt = (s.time_ms - lastSample.time_ms) / 1000;
            const req = Math.max(0, s.requests - lastSample.requests);
            series.t.push(clock(s.time_ms));
            series.rate.push(req / dt);
            series.errors.push(req > 0 ? 100 * Math.max(0, s.errors - lastSample.errors) / req : 0);
            series.retries.push(Math.max(0, s.retries - lastSample.retries) / dt);
            series.bytes.push(Math.max(0, s.bytes_out - lastSample.bytes_out) / dt);
            series.p50.push(s.p50_ms);
            series.p99.push(s.p99_ms);
            series.connections.push(s.connections);
            series.inflight.push(s.in_flight);
            for (const key in series) while (series[key].length > WINDOW) series[key].shift();
          }
          if (!lastSample || s.time_ms > lastSample.time_ms) lastSample = s;
        }

        // The origins with `health:` and their circuits (GET /upstreams), every 2 s.
        async function pollUpstreams(headers) {
          for (;;) {
            try {
              const response = await fetch("/upstreams", { headers, cache: "no-store" });
              if (response.ok) {
                const list = (await response.json()).upstreams;
                const body = $("upstreams");
                body.replaceChildren();
                for (const u of list) {
                  const row = body.insertRow();
                  row.dataset.origin = u.origin;
                  const opened = u.opened_ms_ago === null ? "never" : fmt(u.opened_ms_ago / 1000, 0) + " s ago";
                  for (const v of [u.origin, u.state, `${u.consecutive_failures} of ${u.failure_threshold}`, opened, u.opens, u.failed_fast]) {
                    row.insertCell().textContent = v;
                  }
                  row.cells[1].className = "circuit-" + u.state;
                }
                $("upstreamstable").hidden = list.length === 0;
              }
            } catch (e) { /* the stream's status line says when the listener is gone */ }
            await new Promise((r) => setTimeout(r, 2000));
          }
        }

        async function loadHistory(headers) {
          const response = await fetch("/dashboard/history", { headers, cache: "no-store" });
          if (!response.ok) return;
          const h = await response.json();
          for (let i = 0; i < h.time_ms.length; i++) {
            addSample({ time_ms: h.time_ms[i], requests: h.requests[i], errors: h.errors[i], retries: h.retries[i],
              bytes_out: h.bytes_out[i], in_flight: h.in_flight[i], connections: h.connections[i],
              p50_ms: h.p50_ms[i], p99_ms: h.p99_ms[i] });
          }
          for (const c of charts) c.update("none");
        }

        function show(d) {
          const dt = previous ? (d.time_ms - previous.time_ms) / 1000 : 0;
          if (dt > 0) {
            const req = d.requests - previous.requests;
            $("rate").textContent = fmt(req / dt, 1);
            $("errors").textContent = req > 0 ? fmt(100 * (d.errors - previous.errors) / req, 1) + " %" : "0 %";
            $("retries").textContent = fmt((d.retries - previous.retries) / dt, 1);
          }
          $("p50").textContent = fmt(d.p50_ms, 2);
          $("p90").textContent = fmt(d.p90_ms, 2);
          $("p99").textContent = fmt(d.p99_ms, 2);
          $("inflight").textContent = d.in_flight;
          $("connections").textContent = d.connections;
          $("total").textContent = d.requests;
          $("generation").textContent = d.configuration_generation;
          $("norecording").hidden = d.recording;
          const body = $("hosts");
          const seen = new Set();
          for (const h of d.hosts) {
            seen.add(h.host);
            let row = body.querySelector(`tr[data-host="${CSS.escape(h.host)}"]`);
            if (!row) {
              row = document.createElement("tr");
              row.dataset.host = h.host;
              for (let i = 0; i < 7; i++) row.appendChild(document.createElement("td"));
              row.cells[0].textContent = h.host;
              body.appendChild(row);
            }
            const before = previousHosts.get(h.host);
            row.cells[1].textContent = h.requests;
            row.cells[2].textContent = before && dt > 0 ? fmt((h.requests - before) / dt, 1) : "–";
            row.cells[3].textContent = h.errors;
            row.cells[4].textContent = h.retries;
            row.cells[5].textContent = fmt(h.mean_ms, 2);
            row.cells[6].textContent = h.bytes_out;
          }
          for (const row of [...body.rows]) if (!seen.has(row.dataset.host)) row.remove();
          const limits = $("limits");
          limits.replaceChildren();
          for (const l of d.limits) {
            const row = limits.insertRow();
            for (const v of [l.policy, l.waiting, l.in_flight, l.waited, l.rejected, l.holds.join("; ") || "none"]) {
              row.insertCell().textContent = v;
            }
          }
          $("limitstable").hidden = d.limits.length === 0;
          $("fleet").hidden = !d.fleet;
          if (d.fleet) { $("instances").textContent = d.fleet.instances_alive; $("fallbacks").textContent = d.fleet.fallbacks; }
          previousHosts = new Map(d.hosts.map((h) => [h.host, h.requests]));
          previous = d;
          addSample(d);
          for (const c of charts) c.update("none");
          $("ticks").textContent = Number($("ticks").textContent) + 1;
        }

        async function stream(token) {
          const headers = token ? { Authorization: "Bearer " + token } : {};
          for (;;) {
            try {
              const response = await fetch("/dashboard/events", { headers, cache: "no-store" });
              if (response.status === 401) { $("status").textContent = "token needed"; $("login").hidden = false; return; }
              if (!response.ok) throw new Error("HTTP " + response.status);
              $("status").textContent = "live";
              if (!lastSample) {
                await loadHistory(headers).catch(() => {});
                pollUpstreams(headers);
              }
              const reader = response.body.getReader();
              const decoder = new TextDecoder();
              let text = "";
              for (;;) {
                const { value, done } = await reader.read();
                if (done) break;
                text += decoder.decode(value, { stream: true });
                let end;
                while ((end = text.indexOf("\n\n")) >= 0) {
                  const event = text.slice(0, end);
                  text = text.slice(end + 2);
                  for (const line of event.split("\n")) if (line.startsWith("data: ")) show(JSON.parse(line.slice(6)));
                }
              }
              $("status").textContent = "reconnecting…";
            } catch (e) {
              $("status").textContent = "disconnected (" + e.message + "), retrying…";
            }
            await new Promise((r) => setTimeout(r, 2000));
          }
        }

        const fromHash = new URLSearchParams(location.hash.slice(1)).get("token");
        if (fromHash) history.replaceState(null, "", location.pathname);  // keep it out of the address bar
        $("login").addEventListener("submit", (e) => { e.preventDefault(); $("login").hidden = true; stream($("token").value); });
        makeCharts();
        stream(fromHash);
        </script>
        </body>
        </html>
        """#
}
