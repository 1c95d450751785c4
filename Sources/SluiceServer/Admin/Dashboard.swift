import CLibEvent
import SluiceCore

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

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
    private var timer: LoopTimer<Dashboard>!
    /// Builds the current payload (the admin server asks the workers for their counts);
    /// `true`: for a page (every field), `false`: for the history alone (what it keeps).
    private let payload: (_ forPage: Bool) -> DashboardPayload
    /// One sample a second, the last 15 minutes.
    private(set) var history = DashboardHistory()

    init(base: OpaquePointer, payload: @escaping (_ forPage: Bool) -> DashboardPayload) {
        self.base = base
        self.payload = payload
        timer = LoopTimer(on: base, owner: self, repeating: true) { $0.tick() }
        // The first sample at the first tick: the workers do not run yet (they would not
        // answer a sample taken now).
        timer.arm(milliseconds: 1000)
    }

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
                connections: Int64(p.connections), p50: p.p50, p99: p.p99, outcomes: p.outcomes),
            refusals: p.outcomes.refusals, hosts: p.allHosts)
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
        timer.stop()
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
    let memoryBytes: Int
    let maximumBytes = DashboardHistory.maximumBytes
    let timeMilliseconds: [Int64]
    let requests: [Int64]
    let errors: [Int64]
    let origin5xx: [Int64]
    let refusals: [Int64]
    let refusalsByKind: [String: [Int64]]
    let failures: [Int64]
    let retries: [Int64]
    let quotaWaits: [Int64]
    let resumes: [Int64]
    let cacheLookups: [Int64]
    let cacheServed: [Int64]
    let bytesOut: [Int64]
    let bytesFromCache: [Int64]
    let bytesFromOrigin: [Int64]
    let inFlight: [Int64]
    let connections: [Int64]
    let p50: [Double?]
    let p99: [Double?]

    enum CodingKeys: String, CodingKey {
        case capacity, requests, errors, refusals, failures, retries, resumes, connections
        case intervalMilliseconds = "interval_ms"
        case memoryBytes = "memory_bytes"
        case maximumBytes = "maximum_bytes"
        case timeMilliseconds = "time_ms"
        case origin5xx = "origin_5xx"
        case refusalsByKind = "refusals_by_kind"
        case quotaWaits = "quota_waits"
        case cacheLookups = "cache_lookups"
        case cacheServed = "cache_served"
        case bytesOut = "bytes_out"
        case bytesFromCache = "bytes_from_cache"
        case bytesFromOrigin = "bytes_from_origin"
        case inFlight = "in_flight"
        case p50 = "p50_ms"
        case p99 = "p99_ms"
    }

    init(_ history: DashboardHistory) {
        let samples = history.samples
        memoryBytes = history.memoryBytes
        timeMilliseconds = samples.map(\.timeMilliseconds)
        requests = samples.map(\.requests)
        errors = samples.map(\.errors)
        origin5xx = samples.map(\.origin5xx)
        refusals = samples.map(\.refusals)
        refusalsByKind = Dictionary(uniqueKeysWithValues: history.refusalsByKind.map { ($0.kind.rawValue, $0.totals) })
        failures = samples.map(\.failures)
        retries = samples.map(\.retries)
        quotaWaits = samples.map(\.quotaWaits)
        resumes = samples.map(\.resumes)
        cacheLookups = samples.map(\.cacheLookups)
        cacheServed = samples.map(\.cacheServed)
        bytesOut = samples.map(\.bytesOut)
        bytesFromCache = samples.map(\.bytesFromCache)
        bytesFromOrigin = samples.map(\.bytesFromOrigin)
        inFlight = samples.map(\.inFlight)
        connections = samples.map(\.connections)
        p50 = samples.map(\.p50)
        p99 = samples.map(\.p99)
    }
}

/// `GET /dashboard/host?host=NAME` (`docs/admin-api.yaml`, `DashboardHost`): one host's
/// seconds of the last 15 minutes (that second's own counts), its policy as `sluice check
/// --host` prints it, and its last failed exchanges, oldest first.
struct DashboardHostView: Encodable {
    struct Seconds: Encodable {
        let timeMilliseconds: [Int64]
        let requests: [UInt32]
        let errors: [UInt32]
        let bytesOut: [UInt32]
        let meanMilliseconds: [Float?]
        enum CodingKeys: String, CodingKey {
            case requests, errors
            case timeMilliseconds = "time_ms"
            case bytesOut = "bytes_out"
            case meanMilliseconds = "mean_ms"
        }
    }
    let host: String
    let policy: String
    /// nil: no history kept for the host (no traffic in the window, or not among the busiest).
    let history: Seconds?
    let failures: [DashboardStats.FailedExchange]
    let scriptErrors: [DashboardStats.ScriptError]

    enum CodingKeys: String, CodingKey {
        case host, policy, history, failures
        case scriptErrors = "script_errors"
    }

    func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(host, forKey: .host)
        try c.encode(policy, forKey: .policy)
        try c.encode(history, forKey: .history)  // null when none is kept, not left out
        try c.encode(failures, forKey: .failures)
        try c.encode(scriptErrors, forKey: .scriptErrors)
    }

    init(
        host: String, policy: String, history: DashboardHistory, failures: [DashboardStats.FailedExchange],
        scriptErrors: [DashboardStats.ScriptError]
    ) {
        self.host = host
        self.policy = policy
        if let seconds = history.host(host) {
            self.history = Seconds(
                timeMilliseconds: history.samples.map(\.timeMilliseconds), requests: seconds.map(\.requests),
                errors: seconds.map(\.errors), bytesOut: seconds.map(\.bytesOut),
                meanMilliseconds: seconds.map { $0.meanMilliseconds.isNaN ? nil : $0.meanMilliseconds })
        } else {
            self.history = nil
        }
        self.failures = failures
        self.scriptErrors = scriptErrors
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
    /// What the exchanges came to: origin 5xx, refusals by kind, failures, cache, quota waits.
    let outcomes: DashboardStats.Outcomes
    /// Every host's totals (the history's host rings); not sent.
    let allHosts: [(host: String, row: DashboardStats.HostRow)]
    /// Every policy with `rate_limit`: its line and the origins' holds (`GET /limits` has more).
    var limits: [Limit] = []
    /// The fleet (`fleet:`), when one is configured.
    var fleet: Fleet?
    /// The fleet's shared cache (`fleet.cache`), when one is configured.
    var fleetCache: FleetCache?

    struct FleetCache: Encodable {
        let members: Int
        /// This instance's share of the keys.
        let share: Double
        /// `FleetMembership.State`: how the members were last learned.
        let state: String
    }

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
        case requests, errors, retries, resumes, connections, recording, hosts, limits, fleet, refusals, failures
        case fleetCache = "fleet_cache"
        case origin5xx = "origin_5xx"
        case refusalsByKind = "refusals_by_kind"
        case quotaWaits = "quota_waits"
        case cacheLookups = "cache_lookups"
        case cacheServed = "cache_served"
        case bytesFromCache = "bytes_from_cache"
        case bytesFromOrigin = "bytes_from_origin"
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
        timeMilliseconds = Int64(SystemClock().wallClockMilliseconds())
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
        outcomes = stats.outcomes
        allHosts = stats.hosts
        totalBytesOut = stats.hosts.reduce(0) { $0 + $1.row.bytesOut }
        hosts = stats.hosts.prefix(Self.maxRows).map { row in
            Host(
                host: row.host, requests: row.row.requests, errors: row.row.errors, retries: row.row.retries,
                bytesOut: row.row.bytesOut,
                meanMilliseconds: row.row.timedRequests > 0
                    ? Double(row.row.totalMicroseconds) / Double(row.row.timedRequests) / 1000 : nil)
        }
    }
}

extension DashboardPayload {
    func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(timeMilliseconds, forKey: .timeMilliseconds)
        try c.encode(configurationGeneration, forKey: .configurationGeneration)
        try c.encode(requests, forKey: .requests)
        try c.encode(errors, forKey: .errors)
        try c.encode(outcomes.origin5xx, forKey: .origin5xx)
        try c.encode(outcomes.refusalsTotal, forKey: .refusals)
        try c.encode(
            Dictionary(uniqueKeysWithValues: outcomes.refusals.map { ($0.key.rawValue, $0.value) }), forKey: .refusalsByKind)
        try c.encode(outcomes.failures, forKey: .failures)
        try c.encode(retries, forKey: .retries)
        try c.encode(outcomes.quotaWaits, forKey: .quotaWaits)
        try c.encode(outcomes.resumes, forKey: .resumes)
        try c.encode(outcomes.cacheLookups, forKey: .cacheLookups)
        try c.encode(outcomes.cacheServed, forKey: .cacheServed)
        try c.encode(totalBytesOut, forKey: .totalBytesOut)
        try c.encode(outcomes.bytesFromCache, forKey: .bytesFromCache)
        try c.encode(outcomes.bytesFromOrigin, forKey: .bytesFromOrigin)
        try c.encode(inFlight, forKey: .inFlight)
        try c.encode(connections, forKey: .connections)
        try c.encodeIfPresent(p50, forKey: .p50)
        try c.encodeIfPresent(p90, forKey: .p90)
        try c.encodeIfPresent(p99, forKey: .p99)
        try c.encode(recording, forKey: .recording)
        try c.encode(hosts, forKey: .hosts)
        try c.encode(limits, forKey: .limits)
        try c.encodeIfPresent(fleet, forKey: .fleet)
        try c.encodeIfPresent(fleetCache, forKey: .fleetCache)
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
          #hosts tr { cursor: pointer; }
          #hosts tr:hover { background: #8882; }
          #hostpanel { border: 1px solid #8886; border-radius: .5rem; padding: .6rem .9rem; margin-top: 1.25rem; }
          #hostpanel h2 { font-size: 1.1rem; margin: 0 0 .5rem; }
          #hostpolicy { font-size: .8rem; white-space: pre-wrap; background: #8881; padding: .5rem; border-radius: .3rem; }
          #hostfailurestable th, #hostfailurestable td, #hostscripterrorstable th, #hostscripterrorstable td { font-size: .85rem; text-align: left; }
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
          <div class="card"><b id="refusals">–</b><span>Sluice's own answers/s</span></div>
          <div class="card"><b id="hitratio">–</b><span>cache hit ratio</span></div>
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
          <div class="chart"><h2>errors, % of requests: origin 5xx, Sluice's own answers, broken responses</h2><div><canvas id="c-errors"></canvas></div></div>
          <div class="chart"><h2>Sluice's own answers/s, by case (docs/errors.md)</h2><div><canvas id="c-refusals"></canvas></div></div>
          <div class="chart"><h2>upstream latency, ms</h2><div><canvas id="c-latency"></canvas></div></div>
          <div class="chart"><h2>cache hit ratio, % of lookups</h2><div><canvas id="c-cache"></canvas></div></div>
          <div class="chart"><h2>response bytes/s to clients: from cache, from origins</h2><div><canvas id="c-bytes"></canvas></div></div>
          <div class="chart"><h2>retries, rate-limit waits and resumes/s</h2><div><canvas id="c-retries"></canvas></div></div>
          <div class="chart"><h2>connections and requests in flight</h2><div><canvas id="c-load"></canvas></div></div>
        </div>
        <p id="nocharts" hidden>The charts need Chart.js on the gateway: <code>apt install libjs-chart.js</code>. The numbers above still update.</p>
        <p id="fleet" hidden>Fleet: <span id="fleetredis"><b id="instances">–</b> instances alive; <b id="fallbacks">–</b> rate-limit decisions taken without Redis. </span><span id="fleetcache">Shared cache: <b id="members">–</b> members (<span id="membersstate">–</span>); this instance owns <b id="share">–</b> of the keys.</span></p>
        <p id="norecording" hidden>The <code>metrics</code> monitor is not configured: only in-flight requests and connections move.</p>
        <table>
          <thead><tr><th>host (click for its page)</th><th>requests</th><th>req/s</th><th>errors</th><th>retries</th><th>mean ms</th><th>bytes out</th></tr></thead>
          <tbody id="hosts"></tbody>
        </table>
        <section id="hostpanel" hidden>
          <h2><span id="hostname"></span> <button id="hostclose" type="button">close</button></h2>
          <div class="charts">
            <div class="chart"><h2>requests and errors/s</h2><div><canvas id="c-host-rate"></canvas></div></div>
            <div class="chart"><h2>mean upstream time, ms</h2><div><canvas id="c-host-latency"></canvas></div></div>
            <div class="chart"><h2>response bytes/s</h2><div><canvas id="c-host-bytes"></canvas></div></div>
          </div>
          <p id="hostnohistory" hidden>No history is kept for this host (no traffic in the last 15 minutes, or not among the busiest 200).</p>
          <pre id="hostpolicy"></pre>
          <table id="hostfailurestable">
            <thead><tr><th>time</th><th>method</th><th>URL</th><th>status</th><th>case</th><th>error</th></tr></thead>
            <tbody id="hostfailures"></tbody>
          </table>
          <p id="hostnofailures" hidden>No failed exchanges kept for this host.</p>
          <table id="hostscripterrorstable" hidden>
            <thead><tr><th>time</th><th>script</th><th>hook</th><th>error</th><th>request id</th></tr></thead>
            <tbody id="hostscripterrors"></tbody>
          </table>
        </section>
        <table id="upstreamstable" hidden>
          <thead><tr><th>origin</th><th>circuit (health)</th><th>failures in a row</th><th>opened</th><th>opens</th><th>failed fast</th><th>pooled: open (idle)</th></tr></thead>
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
        const series = { t: [], rate: [], origin5xx: [], refusals: [], failures: [], p50: [], p99: [], retries: [], quota: [], resumes: [],
          hitratio: [], bytescache: [], bytesorigin: [], connections: [], inflight: [] };
        const kindSeries = new Map();  // refusal kind -> its points
        const charts = [];
        let refusalChart = null;
        let lastSample = null;
        const COLORS = ["#ef4444", "#f59e0b", "#8b5cf6", "#0ea5e9", "#10b981", "#ec4899", "#64748b", "#84cc16"];
        const clock = (ms) => new Date(ms).toLocaleTimeString([], { hour12: false });
        const dataset = (label, data, color) =>
          ({ label, data, borderColor: color, backgroundColor: color, pointRadius: 0, borderWidth: 1.5, tension: 0, spanGaps: true });

        function lineChart(id, labels, lines) {
          return new Chart($(id), {
            type: "line",
            data: { labels, datasets: lines.map(([label, data, color]) => dataset(label, data, color)) },
            options: { animation: false, responsive: true, maintainAspectRatio: false,
              scales: { x: { ticks: { maxTicksLimit: 6, maxRotation: 0 } }, y: { beginAtZero: true } },
              plugins: { legend: { display: lines.length !== 1, labels: { boxWidth: 12 } } } },
          });
        }

        function makeCharts() {
          if (!window.Chart) { $("nocharts").hidden = false; $("charts").hidden = true; return; }
          const chart = (id, lines) => charts.push(lineChart(id, series.t, lines.map(([l, key, c]) => [l, series[key], c])));
          chart("c-rate", [["requests/s", "rate", "#3b82f6"]]);
          chart("c-errors", [["origin 5xx", "origin5xx", "#ef4444"], ["Sluice's answers", "refusals", "#f59e0b"], ["broken", "failures", "#8b5cf6"]]);
          chart("c-refusals", []);
          refusalChart = charts[charts.length - 1];
          chart("c-latency", [["p50", "p50", "#10b981"], ["p99", "p99", "#f59e0b"]]);
          chart("c-cache", [["hit ratio %", "hitratio", "#10b981"]]);
          chart("c-bytes", [["from cache", "bytescache", "#10b981"], ["from origins", "bytesorigin", "#64748b"]]);
          chart("c-retries", [["retries/s", "retries", "#8b5cf6"], ["rate-limit waits/s", "quota", "#f97316"],
            ["download resumes/s", "resumes", "#0ea5e9"]]);
          chart("c-load", [["client connections", "connections", "#0ea5e9"], ["in flight", "inflight", "#f97316"]]);
        }

        // A refusal kind's line, made when the kind first appears (zeros before).
        function kindLine(kind) {
          let points = kindSeries.get(kind);
          if (!points) {
            points = new Array(series.t.length).fill(0);
            kindSeries.set(kind, points);
            if (refusalChart) {
              refusalChart.data.datasets.push(dataset(kind, points, COLORS[(kindSeries.size - 1) % COLORS.length]));
            }
          }
          return points;
        }

        function addSample(s) {
          if (lastSample && s.time_ms > lastSample.time_ms) {
            const dt = (s.time_ms - lastSample.time_ms) / 1000;
            const delta = (key) => Math.max(0, (s[key] || 0) - (lastSample[key] || 0));
            const req = delta("requests");
            const share = (key) => req > 0 ? 100 * delta(key) / req : 0;
            const kinds = s.refusals_by_kind || {};
            const before = lastSample.refusals_by_kind || {};
            for (const kind of Object.keys(kinds)) kindLine(kind);  // before this point's label: aligned
            series.t.push(clock(s.time_ms));
            series.rate.push(req / dt);
            series.origin5xx.push(share("origin_5xx"));
            // Sluice's answers to requests: the errors that are neither the origin's 5xx nor broken
            // (refusals at accept had no request: they are in the chart by case).
            series.refusals.push(req > 0 ? 100 * Math.max(0, delta("errors") - delta("origin_5xx") - delta("failures")) / req : 0);
            series.failures.push(share("failures"));
            const lookups = delta("cache_lookups");
            series.hitratio.push(lookups > 0 ? 100 * delta("cache_served") / lookups : null);
            series.bytescache.push(delta("bytes_from_cache") / dt);
            series.bytesorigin.push(delta("bytes_from_origin") / dt);
            series.retries.push(delta("retries") / dt);
            series.quota.push(delta("quota_waits") / dt);
            series.resumes.push(delta("resumes") / dt);
            series.p50.push(s.p50_ms);
            series.p99.push(s.p99_ms);
            series.connections.push(s.connections);
            series.inflight.push(s.in_flight);
            for (const [kind, points] of kindSeries) {
              points.push(Math.max(0, (kinds[kind] || 0) - (before[kind] || 0)) / dt);
            }
            for (const key in series) while (series[key].length > WINDOW) series[key].shift();
            for (const points of kindSeries.values()) while (points.length > WINDOW) points.shift();
          }
          if (!lastSample || s.time_ms > lastSample.time_ms) lastSample = s;
        }

        // The circuits of the origins with `health:` and every origin's pooled connections
        // (GET /upstreams), every 2 s.
        async function pollUpstreams(headers) {
          for (;;) {
            try {
              const response = await fetch("/upstreams", { headers, cache: "no-store" });
              if (response.ok) {
                const answer = await response.json();
                const pools = new Map(answer.pools.map((p) => [p.origin, p]));
                const origins = [...new Set([...answer.upstreams.map((u) => u.origin), ...pools.keys()])].sort();
                const circuits = new Map(answer.upstreams.map((u) => [u.origin, u]));
                const body = $("upstreams");
                body.replaceChildren();
                for (const origin of origins) {
                  const u = circuits.get(origin);
                  const p = pools.get(origin);
                  const row = body.insertRow();
                  row.dataset.origin = origin;
                  const opened = !u ? "–" : u.opened_ms_ago === null ? "never" : fmt(u.opened_ms_ago / 1000, 0) + " s ago";
                  const cells = u ? [origin, u.state, `${u.consecutive_failures} of ${u.failure_threshold}`, opened, u.opens, u.failed_fast]
                                  : [origin, "no health:", "–", "–", "–", "–"];
                  for (const v of [...cells, p ? `${p.open} (${p.idle})` : "0"]) row.insertCell().textContent = v;
                  if (u) row.cells[1].className = "circuit-" + u.state;
                }
                $("upstreamstable").hidden = origins.length === 0;
              }
            } catch (e) { /* the stream's status line says when the listener is gone */ }
            await new Promise((r) => setTimeout(r, 2000));
          }
        }

        // A host's page: its charts, its policy, its last failed exchanges; refreshed every
        // 2 s while it is open.
        let openHost = null;
        let hostGeneration = 0;  // one polling loop: a click or a close ends the one before
        const hostCharts = [];
        async function showHost(host, headers) {
          if (openHost === host && !$("hostpanel").hidden) return;
          const generation = ++hostGeneration;
          openHost = host;
          $("hostname").textContent = host;
          $("hostpanel").hidden = false;
          $("hostpanel").dataset.host = host;
          $("hostpanel").dataset.loaded = "";
          $("hostpolicy").textContent = "loading…";
          $("hostfailures").replaceChildren();
          $("hostscripterrors").replaceChildren();
          while (generation === hostGeneration) {
            try {
              const response = await fetch("/dashboard/host?host=" + encodeURIComponent(host), { headers, cache: "no-store" });
              if (generation !== hostGeneration) break;
              if (response.ok) drawHost(await response.json());
              else $("hostpolicy").textContent = "HTTP " + response.status + ": " + (await response.text());
            } catch (e) { /* shown as stale; the stream's status line says when the listener is gone */ }
            await new Promise((r) => setTimeout(r, 2000));
          }
        }

        function drawHost(h) {
          $("hostpolicy").textContent = h.policy;
          const failures = $("hostfailures");
          failures.replaceChildren();
          for (const f of [...h.failures].reverse()) {
            const row = failures.insertRow();
            for (const v of [clock(f.time_ms), f.method, f.url, f.status, f.kind, f.error || ""]) row.insertCell().textContent = v;
          }
          $("hostnofailures").hidden = h.failures.length > 0;
          const scriptErrors = $("hostscripterrors");
          scriptErrors.replaceChildren();
          for (const e of [...h.script_errors].reverse()) {
            const row = scriptErrors.insertRow();
            for (const v of [clock(e.time_ms), e.script, e.hook, e.error, e.id]) row.insertCell().textContent = v;
          }
          $("hostscripterrorstable").hidden = h.script_errors.length === 0;
          $("hostnohistory").hidden = h.history !== null;
          $("hostpanel").dataset.loaded = h.host;
          if (!window.Chart) return;
          const hist = h.history || { time_ms: [], requests: [], errors: [], bytes_out: [], mean_ms: [] };
          const labels = hist.time_ms.map(clock);
          const lines = [
            ["c-host-rate", [["requests/s", hist.requests, "#3b82f6"], ["errors/s", hist.errors, "#ef4444"]]],
            ["c-host-latency", [["mean ms", hist.mean_ms, "#10b981"]]],
            ["c-host-bytes", [["bytes/s", hist.bytes_out, "#64748b"]]],
          ];
          lines.forEach(([id, data], i) => {
            if (!hostCharts[i]) hostCharts[i] = lineChart(id, labels, data);
            const c = hostCharts[i];
            c.data.labels = labels;
            data.forEach(([, points], j) => { c.data.datasets[j].data = points; });
            c.update("none");
          });
        }

        async function loadHistory(headers) {
          const response = await fetch("/dashboard/history", { headers, cache: "no-store" });
          if (!response.ok) return;
          const h = await response.json();
          const columns = ["requests", "errors", "origin_5xx", "refusals", "failures", "retries", "quota_waits", "resumes", "cache_lookups",
            "cache_served", "bytes_out", "bytes_from_cache", "bytes_from_origin", "in_flight", "connections", "p50_ms", "p99_ms"];
          for (let i = 0; i < h.time_ms.length; i++) {
            const s = { time_ms: h.time_ms[i], refusals_by_kind: {} };
            for (const key of columns) s[key] = h[key][i];
            for (const kind in h.refusals_by_kind) s.refusals_by_kind[kind] = h.refusals_by_kind[kind][i];
            addSample(s);
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
            $("refusals").textContent = fmt((d.refusals - previous.refusals) / dt, 1);
            const lookups = d.cache_lookups - previous.cache_lookups;
            $("hitratio").textContent = lookups > 0 ? fmt(100 * (d.cache_served - previous.cache_served) / lookups, 1) + " %" : "–";
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
              row.addEventListener("click", () => showHost(h.host, streamHeaders));
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
          $("fleet").hidden = !d.fleet && !d.fleet_cache;
          $("fleetredis").hidden = !d.fleet;
          if (d.fleet) { $("instances").textContent = d.fleet.instances_alive; $("fallbacks").textContent = d.fleet.fallbacks; }
          $("fleetcache").hidden = !d.fleet_cache;
          if (d.fleet_cache) {
            $("members").textContent = d.fleet_cache.members;
            $("membersstate").textContent = d.fleet_cache.state;
            $("share").textContent = (100 * d.fleet_cache.share).toFixed(1) + " %";
          }
          previousHosts = new Map(d.hosts.map((h) => [h.host, h.requests]));
          previous = d;
          addSample(d);
          for (const c of charts) c.update("none");
          $("ticks").textContent = Number($("ticks").textContent) + 1;
        }

        let streamHeaders = {};
        async function stream(token) {
          const headers = token ? { Authorization: "Bearer " + token } : {};
          streamHeaders = headers;
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
        $("hostclose").addEventListener("click", () => { hostGeneration++; openHost = null; $("hostpanel").hidden = true; });
        makeCharts();
        stream(fromHash);
        </script>
        </body>
        </html>
        """#
}
