import CoreMetrics
import Prometheus
import Synchronization

/// Every metric Sluice exports, declared here and nowhere else: its name, type, labels and
/// help text (`docs/metrics.md` lists the same table; a test compares the two and the admin
/// listener's `GET /metrics`). Recorded through swift-metrics (`CoreMetrics`) handles made
/// by a `PrometheusMetricsFactory` on this process's own registry (not the global
/// `MetricsSystem`, which a library user may have bootstrapped for their own metrics).
/// swift-prometheus takes help text only through its own API (and insists that every handle
/// of a name agree on it), so `exposition` writes each metric's `# HELP` line from the
/// catalog before its `# TYPE` line.
///
/// Threading: the registry and every handle are thread-safe (atomics, or a lock per
/// histogram); the catalog is immutable; `circuitOrigins` is behind its own lock.
public final class SluiceMetrics: Sendable {
    public enum Kind: String, Sendable { case counter, gauge, histogram }

    /// One metric: what `docs/metrics.md` lists.
    public struct Metric: Sendable {
        public let name: String
        public let kind: Kind
        public let labels: [String]
        public let help: String
    }

    public static let requests = Metric(
        name: "sluice_requests_total", kind: .counter, labels: ["policy", "method", "status_class"],
        help:
            "Finished exchanges (CONNECT tunnels included) by host policy, method class and status class of the answer (0xx: none sent)"
    )
    public static let retries = Metric(
        name: "sluice_retries_total", kind: .counter, labels: ["reason"],
        help: "Retries scheduled, by reason (`status 503`, `refused`, `dns`, `timeout`, `reset`, `tls`, `validation`, `lua`)")
    public static let retriesStopped = Metric(
        name: "sluice_retries_stopped_total", kind: .counter, labels: ["reason"],
        help: "Retriable failures that were not retried, by reason (limit, budget, deadline, method, buffer_limit)")
    public static let luaCalls = Metric(
        name: "sluice_lua_calls_total", kind: .counter, labels: ["script", "hook", "outcome"],
        help: "Calls of lua scripts' hooks, by script, hook (on_request, on_response, on_log) and outcome (ok, error, limit)")
    public static let luaCallDuration = Metric(
        name: "sluice_lua_call_duration_seconds", kind: .histogram, labels: ["script", "hook"],
        help: "Wall-clock time of lua scripts' hook calls (yields included), by script and hook")
    public static let luaScriptCounters = Metric(
        name: "sluice_lua_metric_total", kind: .counter, labels: ["script", "name"],
        help: "Counters lua scripts keep with `sluice.metric(name):inc(n)`, by script and name (at most 64 names a script)")
    public static let luaStates = Metric(
        name: "sluice_lua_states", kind: .gauge, labels: [],
        help:
            "Lua states alive in the process: one per script (file name and content) per worker that ran it, read when /metrics is scraped"
    )
    public static let luaMemory = Metric(
        name: "sluice_lua_memory_bytes", kind: .gauge, labels: [],
        help:
            "Bytes the Lua states' allocators hold, every worker's, each state's as of its load or its last call that moved it by 16 KiB, read when /metrics is scraped"
    )
    public static let trustFailures = Metric(
        name: "sluice_trust_failures_total", kind: .counter, labels: ["evaluator"],
        help: "Upstream certificates refused by a trust evaluator, by evaluator")
    public static let credentialRefreshes = Metric(
        name: "sluice_credential_refreshes_total", kind: .counter, labels: ["result"],
        help: "OAuth token fetches and refreshes, by result (ok, failed)")
    public static let upstreamConnect = Metric(
        name: "sluice_upstream_connect_seconds", kind: .histogram, labels: [],
        help: "Time to the upstream TCP connection, for tries that opened one")
    public static let upstreamTLS = Metric(
        name: "sluice_upstream_tls_seconds", kind: .histogram, labels: [],
        help: "Time to the end of the upstream TLS handshake (https tries on a new connection)")
    public static let upstreamFirstByte = Metric(
        name: "sluice_upstream_first_byte_seconds", kind: .histogram, labels: [],
        help: "Time from the start of the last try to the upstream's first response byte")
    public static let upstreamTotal = Metric(
        name: "sluice_upstream_total_seconds", kind: .histogram, labels: [],
        help: "Duration of the last upstream try, body included")
    public static let upstreamRequests = Metric(
        name: "sluice_upstream_requests_total", kind: .counter, labels: ["protocol", "connection"],
        help:
            "Exchanges' last upstream try by HTTP version (HTTP/1.0, HTTP/1.1, HTTP/2) and connection (new: the try opened it; reused: pooled, or one more HTTP/2 stream); an upgrade's handshake, whose connection becomes its tunnel, is not one"
    )
    public static let bytesIn = Metric(
        name: "sluice_request_body_bytes_total", kind: .counter, labels: [],
        help: "Request body bytes read from clients (tunnels: bytes from the client)")
    public static let bytesOut = Metric(
        name: "sluice_response_body_bytes_total", kind: .counter, labels: [],
        help: "Response body bytes sent to clients (tunnels: bytes to the client)")
    public static let tunnels = Metric(
        name: "sluice_tunnels_total", kind: .counter, labels: [],
        help: "CONNECT tunnels and upgraded connections (101 Switching Protocols: WebSocket) opened")
    public static let exchangesInFlight = Metric(
        name: "sluice_exchanges_in_flight", kind: .gauge, labels: ["worker"],
        help: "Exchanges in flight per worker, read when /metrics is scraped")
    public static let clientConnections = Metric(
        name: "sluice_client_connections", kind: .gauge, labels: ["worker"],
        help: "Open client connections per worker, read when /metrics is scraped")
    public static let reloads = Metric(
        name: "sluice_config_reloads_total", kind: .counter, labels: ["result"],
        help: "Configuration reloads (SIGHUP, POST /reload), by result (applied, failed)")
    public static let configGeneration = Metric(
        name: "sluice_config_generation", kind: .gauge, labels: [],
        help: "The configuration generation serving now (1 at start, +1 per applied reload)")

    public static let connectionsRefused = Metric(
        name: "sluice_connections_refused_total", kind: .counter, labels: ["reason"],
        help: "Client connections refused at accept with 503, by limit (max_connections, max_connections_per_client)")
    public static let requestsRefused = Metric(
        name: "sluice_requests_refused_total", kind: .counter, labels: ["reason"],
        help:
            "Requests answered 503 without going upstream because the worker's upstream slots were taken, by reason (queue_full, queue_timeout)"
    )
    public static let ownResponses = Metric(
        name: "sluice_own_responses_total", kind: .counter, labels: ["kind"],
        help:
            "Responses Sluice produced itself instead of an origin's (docs/errors.md), by kind; connections refused at accept included"
    )
    public static let requestsQueued = Metric(
        name: "sluice_requests_queued_total", kind: .counter, labels: [],
        help: "Requests that waited for an upstream slot (limits.max_in_flight_upstream)")

    public static let circuitState = Metric(
        name: "sluice_upstream_circuit_state", kind: .gauge, labels: ["origin"],
        help: "Each origin's circuit (`health:`): 0 closed, 1 open, 2 half_open; read when /metrics is scraped")
    public static let circuitOpened = Metric(
        name: "sluice_upstream_circuit_opened_total", kind: .counter, labels: ["origin"],
        help: "Times an origin's circuit opened after `health.consecutive_failures` failures in a row")
    public static let circuitFailedFast = Metric(
        name: "sluice_upstream_circuit_failed_fast_total", kind: .counter, labels: ["origin"],
        help: "Requests answered 503 without going upstream because the origin's circuit was open")
    public static let cache = Metric(
        name: "sluice_cache_total", kind: .counter, labels: ["event"],
        help:
            "Shared-cache steps (docs/caching.md), by event: lookup, hit, miss, stored, revalidated, evicted and invalidated (objects)"
    )
    public static let cacheDiskWriteFailures = Metric(
        name: "sluice_cache_disk_write_failures_total", kind: .counter, labels: [],
        help:
            "Disk cache writes that failed (disk full, quota, permissions): responses are served without the disk tier until a write succeeds"
    )
    public static let cacheDiskSendfileBytes = Metric(
        name: "sluice_cache_disk_sendfile_bytes_total", kind: .counter, labels: [],
        help:
            "Body bytes of disk cache hits sent by the kernel (sendfile) from the stored file to a plain-http client, without passing through Sluice"
    )
    public static let cacheDiskVerifiedBytes = Metric(
        name: "sluice_cache_disk_verified_bytes_total", kind: .counter, labels: [],
        help:
            "Body bytes of disk cache entries read and checked against their checksums before the kernel sent them: a block's first send by this process, or its first after its file changed"
    )
    public static let resumes = Metric(
        name: "sluice_download_resumes_total", kind: .counter, labels: ["outcome"],
        help:
            "Downloads whose upstream broke mid-body and were asked for the rest (docs/configuration.md, Resumable downloads), by outcome: resumed (the origin's 206 carried the body on), refused (its answer could not: another representation or range), failed (the resume's own request failed), exhausted (the limit was reached; the response ended incomplete)"
    )

    public static let upstreamTries = Metric(
        name: "sluice_upstream_tries_total", kind: .counter, labels: ["kind"],
        help:
            "Requests Sluice sent upstream, each a try that passed the try stages (its circuit, its rate_limit turn, the adapters of every try), by kind: request (an exchange's tries: the first, its retries and redirect hops, counted when the exchange ends), resume (the rest of a broken download), fill_resume (the same for a shared fill whose client left), revalidation (a background stale-while-revalidate request)"
    )

    public static let rateLimitDecisions = Metric(
        name: "sluice_rate_limit_decisions_total", kind: .counter, labels: ["policy", "decision"],
        help:
            "Tries under a policy's `rate_limit`, by decision: allowed (went at once), waited (went after its turn came), rejected (answered 429), left (the client went while it waited)"
    )
    public static let rateLimitWait = Metric(
        name: "sluice_rate_limit_wait_seconds", kind: .histogram, labels: [],
        help: "How long tries that waited for their turn under `rate_limit` waited")
    public static let rateLimitWaiting = Metric(
        name: "sluice_rate_limit_waiting", kind: .gauge, labels: ["policy"],
        help: "Tries waiting for their turn under each policy's `rate_limit`, read when /metrics is scraped")
    public static let rateLimitLearned = Metric(
        name: "sluice_rate_limit_learned_total", kind: .counter, labels: ["policy"],
        help: "Origin answers that said the origin's own limit was reached, so its requests were held (`rate_limit.learn`)")
    public static let rateLimitEvicted = Metric(
        name: "sluice_rate_limit_keys_evicted_total", kind: .counter, labels: ["policy"],
        help: "Rate-limit keys forgotten (least recently used first) to keep each table within `limits.rate_limit_keys`")

    public static let fleetFallbacks = Metric(
        name: "sluice_fleet_fallbacks_total", kind: .counter, labels: ["mode"],
        help:
            "Rate-limit decisions taken without the fleet's Redis (it did not answer in time), by `fleet.on_redis_down` mode (local_share, allow, deny)"
    )
    public static let fleetInstances = Metric(
        name: "sluice_fleet_instances", kind: .gauge, labels: [],
        help: "Sluice instances alive at the fleet's last heartbeat (this one included), read when /metrics is scraped")
    public static let fleetCacheMembers = Metric(
        name: "sluice_fleet_cache_members", kind: .gauge, labels: [],
        help: "Members of the fleet's shared cache this instance ranks keys over (itself included), read when /metrics is scraped"
    )

    /// Every metric, in the order `docs/metrics.md` lists them.
    public static let catalog: [Metric] = [
        requests, retries, retriesStopped, luaCalls, luaCallDuration, luaScriptCounters, luaStates, luaMemory, trustFailures,
        credentialRefreshes,
        upstreamConnect, upstreamTLS, upstreamFirstByte, upstreamTotal, upstreamRequests, upstreamTries,
        bytesIn, bytesOut, tunnels, exchangesInFlight, clientConnections, reloads, configGeneration,
        connectionsRefused, requestsRefused, ownResponses, requestsQueued, circuitState, circuitOpened, circuitFailedFast, cache,
        cacheDiskWriteFailures, cacheDiskSendfileBytes, cacheDiskVerifiedBytes, resumes, rateLimitDecisions, rateLimitWait,
        rateLimitWaiting, rateLimitLearned, rateLimitEvicted,
        fleetFallbacks, fleetInstances, fleetCacheMembers, peerRequests, peerRequestDuration,
    ]

    /// Why a client connection was refused (`sluice_connections_refused_total`'s `reason`).
    public enum ConnectionRefusal: String, Sendable, CaseIterable {
        case maxConnections = "max_connections"
        case maxConnectionsPerClient = "max_connections_per_client"
    }

    /// Why a request was refused before it went upstream (`sluice_requests_refused_total`'s `reason`).
    public enum RequestRefusal: String, Sendable, CaseIterable {
        case queueFull = "queue_full"
        case queueTimeout = "queue_timeout"
    }

    /// Upstream time buckets, in seconds: 0.5 ms to 60 s.
    public static let durationBuckets: [Double] = [
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
    ]

    /// Hook call time buckets, in seconds: 10 µs to 1 s (a call is tens of microseconds; the
    /// default wall-clock limit is 1 s).
    public static let luaCallBuckets: [Double] = [
        0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
    ]

    /// The process's metrics (a reload keeps every value).
    public static let shared = SluiceMetrics()

    public let registry = PrometheusCollectorRegistry()
    let factory: PrometheusMetricsFactory
    /// The origins that have `sluice_upstream_circuit_*` series: those the health registry
    /// forgets (a reload, or its size bound) lose theirs at the next `/metrics`, so the
    /// series stay as bounded as the registry.
    private let circuitOrigins = Mutex<Set<String>>([])
    /// The rate-limit counts already added to the counters, per policy (they are read from
    /// `RateLimitTable` at each scrape, and only the difference is added).
    private let rateLimitReported = Mutex<[String: RateLimitTable.Counts]>([:])
    /// The disk tier's kernel-send and verification byte counts already added to their
    /// counters (read from the tier at each scrape; only the difference is added).
    private let diskReported = Mutex<(sendfile: UInt64, verified: UInt64)>((0, 0))
    /// The names each script's counters have taken (`sluice.metric`), by script name: at most
    /// `LuaMetricAPI.maxNamesPerScript` each, so a script cannot grow the exposition unbounded.
    private let luaCounterNames = Mutex<[String: Set<String>]>([:])
    let rateLimitWaitTimer: CoreMetrics.Timer

    private init() {
        var factory = PrometheusMetricsFactory(registry: registry)
        let buckets = Self.durationBuckets.map { Duration.nanoseconds(Int64($0 * 1_000_000_000)) }
        for metric in Self.catalog where metric.kind == .histogram {
            factory.durationHistogramBuckets[metric.name] = buckets
        }
        factory.durationHistogramBuckets[Self.luaCallDuration.name] = Self.luaCallBuckets.map {
            Duration.nanoseconds(Int64($0 * 1_000_000_000))
        }
        self.factory = factory
        rateLimitWaitTimer = CoreMetrics.Timer(label: Self.rateLimitWait.name, dimensions: [], factory: factory)
        // The overload counters are served from the start (at 0), so an alert on their rate
        // has a series before the first refusal.
        for reason in ConnectionRefusal.allCases { _ = counter(Self.connectionsRefused, [("reason", reason.rawValue)]) }
        for reason in RequestRefusal.allCases { _ = counter(Self.requestsRefused, [("reason", reason.rawValue)]) }
        _ = counter(Self.requestsQueued)
        // Likewise the failures an alert watches with increase(): a series that first appears
        // at 1 would hide the first failure (docs/monitoring/sluice-alerts.yml).
        for result in ["applied", "failed"] { _ = counter(Self.reloads, [("result", result)]) }
        _ = counter(Self.cacheDiskWriteFailures)
        _ = counter(Self.cacheDiskSendfileBytes)
        _ = counter(Self.cacheDiskVerifiedBytes)
    }

    func counter(_ metric: Metric, _ labels: [(String, String)] = []) -> CoreMetrics.Counter {
        CoreMetrics.Counter(label: metric.name, dimensions: labels, factory: factory)
    }

    func timer(_ metric: Metric, _ labels: [(String, String)] = []) -> CoreMetrics.Timer {
        CoreMetrics.Timer(label: metric.name, dimensions: labels, factory: factory)
    }

    func gauge(_ metric: Metric, _ labels: [(String, String)] = []) -> CoreMetrics.Gauge {
        CoreMetrics.Gauge(label: metric.name, dimensions: labels, factory: factory)
    }

    /// A connection refused at accept (recorded with or without the metrics monitor).
    public func recordRefusal(_ reason: ConnectionRefusal) {
        counter(Self.connectionsRefused, [("reason", reason.rawValue)]).increment()
    }

    /// A request refused before it went upstream (recorded with or without the monitor).
    public func recordRefusal(_ reason: RequestRefusal) {
        counter(Self.requestsRefused, [("reason", reason.rawValue)]).increment()
    }

    /// A response Sluice produced itself at accept (recorded with or without the monitor; the
    /// monitor records those of exchanges).
    public func recordOwnResponse(_ kind: ProxyError.Kind) {
        counter(Self.ownResponses, [("kind", kind.rawValue)]).increment()
    }

    /// A request that had to wait for an upstream slot.
    public func recordQueued() {
        counter(Self.requestsQueued).increment()
    }

    /// A request answered `503` because `origin`'s circuit was open.
    public func recordCircuitFailedFast(origin: String) {
        circuitOrigins.withLock { _ = $0.insert(origin) }
        counter(Self.circuitFailedFast, [("origin", origin)]).increment()
    }

    /// `origin`'s circuit opened.
    public func recordCircuitOpened(origin: String) {
        circuitOrigins.withLock { _ = $0.insert(origin) }
        counter(Self.circuitOpened, [("origin", origin)]).increment()
    }

    /// Every origin's circuit state, set just before `/metrics` is emitted; the series of
    /// origins no longer in `statuses` are removed.
    public func recordCircuits(_ statuses: [UpstreamHealth.Status]) {
        let current = Set(statuses.map(\.origin.name))
        let gone = circuitOrigins.withLock { origins in
            let gone = origins.subtracting(current)
            origins = current
            return gone
        }
        for origin in gone {
            gauge(Self.circuitState, [("origin", origin)]).destroy()
            counter(Self.circuitOpened, [("origin", origin)]).destroy()
            counter(Self.circuitFailedFast, [("origin", origin)]).destroy()
        }
        for status in statuses {
            gauge(Self.circuitState, [("origin", status.origin.name)]).record(status.breaker.state.gauge)
        }
    }

    /// A try that waited `microseconds` for its rate-limit turn.
    public func recordRateLimitWait(microseconds: Int64) {
        rateLimitWaitTimer.recordNanoseconds(microseconds * 1000)
    }

    /// Every policy's rate-limit counts and queue, set just before `/metrics` is emitted
    /// (`RateLimitTable.snapshot`): counters grow by what happened since the last scrape.
    public func recordRateLimits(_ policies: [RateLimitTable.PolicyState]) {
        let added = rateLimitReported.withLock { reported in
            policies.map { state -> (String, RateLimitTable.Counts) in
                let before = reported[state.policy] ?? RateLimitTable.Counts()
                reported[state.policy] = state.counts
                return (state.policy, state.counts.minus(before))
            }
        }
        for (policy, delta) in added {
            for (decision, n) in [
                ("allowed", delta.allowed), ("waited", delta.waited), ("rejected", delta.rejected), ("left", delta.left),
            ] where n > 0 {
                counter(Self.rateLimitDecisions, [("policy", policy), ("decision", decision)]).increment(by: n)
            }
            if delta.learned > 0 { counter(Self.rateLimitLearned, [("policy", policy)]).increment(by: delta.learned) }
            if delta.evicted > 0 { counter(Self.rateLimitEvicted, [("policy", policy)]).increment(by: delta.evicted) }
        }
        for state in policies { gauge(Self.rateLimitWaiting, [("policy", state.policy)]).record(state.waiting) }
    }

    /// A decision `fleet.on_redis_down` took (`mode`) while Redis did not answer.
    public func recordFleetFallback(mode: String) {
        counter(Self.fleetFallbacks, [("mode", mode)]).increment()
    }

    /// What became of a resume asked for a broken download (`sluice_download_resumes_total`).
    public enum ResumeOutcome: String, Sendable, CaseIterable {
        case resumed, refused, failed, exhausted
    }

    public func recordResume(_ outcome: ResumeOutcome) {
        counter(Self.resumes, [("outcome", outcome.rawValue)]).increment()
    }

    /// Kinds of requests Sluice sends upstream (`sluice_upstream_tries_total`). An exchange's
    /// own tries are counted by the metrics monitor from its record (`attempts`).
    public enum TryKind: String, Sendable, CaseIterable {
        case request, resume, fillResume = "fill_resume", revalidation
    }

    public func recordTry(_ kind: TryKind, count: Int = 1) {
        counter(Self.upstreamTries, [("kind", kind.rawValue)]).increment(by: Int64(count))
    }

    /// The disk tier's running byte counts (sent by the kernel, verified for it), set just
    /// before `/metrics` is emitted: the counters grow by what happened since the last scrape.
    public func recordCacheDisk(sendfileBytes: UInt64, verifiedBytes: UInt64) {
        let delta = diskReported.withLock { reported in
            defer { reported = (sendfileBytes, verifiedBytes) }
            return (sendfileBytes &- reported.sendfile, verifiedBytes &- reported.verified)
        }
        if delta.0 > 0 { counter(Self.cacheDiskSendfileBytes).increment(by: Int64(clamping: delta.0)) }
        if delta.1 > 0 { counter(Self.cacheDiskVerifiedBytes).increment(by: Int64(clamping: delta.1)) }
    }

    /// A write of the disk cache tier failed.
    public func recordCacheDiskWriteFailure() {
        counter(Self.cacheDiskWriteFailures).increment()
    }

    /// The handle of script `script`'s counter `name` (`sluice.metric`); nil when the script
    /// has `LuaMetricAPI.maxNamesPerScript` other names already.
    func luaCounter(script: String, name: String) -> CoreMetrics.Counter? {
        let allowed = luaCounterNames.withLock { names in
            if names[script, default: []].contains(name) { return true }
            guard names[script, default: []].count < LuaMetricAPI.maxNamesPerScript else { return false }
            names[script, default: []].insert(name)
            return true
        }
        return allowed ? counter(Self.luaScriptCounters, [("script", script), ("name", name)]) : nil
    }

    /// The Lua states alive (`LuaState.alive`) and their memory (`LuaState.memory`), set just
    /// before `/metrics` is emitted.
    public func recordLuaStates() {
        gauge(Self.luaStates).record(LuaState.alive)
        gauge(Self.luaMemory).record(LuaState.memory)
    }

    /// The instances alive at the fleet's last heartbeat, set just before `/metrics` is emitted.
    public func recordFleet(instances: Int) {
        gauge(Self.fleetInstances).record(instances)
    }

    /// The members of the fleet's shared cache (`fleet.cache`), set just before `/metrics` is
    /// emitted.
    public func recordFleetCache(members: Int) {
        gauge(Self.fleetCacheMembers).record(members)
    }

    /// A reload's result (`ProxyServer.reloadFile`).
    public func recordReload(applied: Bool) {
        counter(Self.reloads, [("result", applied ? "applied" : "failed")]).increment()
    }

    /// The server's and the workers' current counts, set just before `/metrics` is emitted.
    public func recordState(generation: Int, workers: [(index: Int, exchangesInFlight: Int, clientConnections: Int)]) {
        gauge(Self.configGeneration).record(generation)
        for worker in workers {
            gauge(Self.exchangesInFlight, [("worker", String(worker.index))]).record(worker.exchangesInFlight)
            gauge(Self.clientConnections, [("worker", String(worker.index))]).record(worker.clientConnections)
        }
    }

    /// The Prometheus text exposition of every metric (`GET /metrics`).
    public func exposition() -> [UInt8] {
        Self.withHelp(registry.emitToBuffer())
    }

    /// Each metric's help text as an exposition line, by name (escaped as the text format
    /// asks: backslash and line feed).
    private static let helpLines: [String: [UInt8]] = Dictionary(
        uniqueKeysWithValues: catalog.map { metric in
            var text = ""
            for c in metric.help {
                switch c {
                case "\\": text += "\\\\"
                case "\n": text += "\\n"
                default: text.append(c)
                }
            }
            return (metric.name, Array("# HELP \(metric.name) \(text)\n".utf8))
        })

    /// `# HELP` before every `# TYPE` line of a metric in the catalog.
    static func withHelp(_ text: [UInt8]) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(text.count + helpLines.count * 120)
        let marker = Array("# TYPE ".utf8)
        var start = 0
        while start < text.count {
            let end = text[start...].firstIndex(of: 10).map { $0 + 1 } ?? text.count
            let line = text[start..<end]
            if line.starts(with: marker) {
                let rest = line.dropFirst(marker.count)
                let name = String(decoding: rest.prefix { $0 != 32 }, as: UTF8.self)
                if let help = helpLines[name] { out += help }
            }
            out += line
            start = end
        }
        return out
    }
}

/// The `metrics` monitor (`monitors: [ { metrics: {} } ]`): counts finished exchanges,
/// retries, trust failures, credential refreshes, tunnels and body bytes, and records the
/// last try's upstream timings, into `SluiceMetrics.shared` (served at the admin listener's
/// `/metrics`).
///
/// One instance per worker: its cache of handles per label set is touched by that worker's
/// thread only; the handles themselves are shared and thread-safe.
public final class MetricsMonitor: EventMonitor {
    private let metrics: SluiceMetrics
    private let dashboard: DashboardStats
    /// This worker's part of the dashboard's numbers (taken on the first exchange, on the
    /// worker's thread).
    private var dashboardShard: DashboardStats.Shard?
    private struct RequestKey: Hashable {
        let policy: String
        let method: MethodClass
        let statusClass: UInt8
    }

    /// Methods as a label: the registered ones, and `other` (a label must stay bounded).
    enum MethodClass: String {
        case get = "GET"
        case head = "HEAD"
        case post = "POST"
        case put = "PUT"
        case delete = "DELETE"
        case patch = "PATCH"
        case options = "OPTIONS"
        case connect = "CONNECT"
        case trace = "TRACE"
        case other
        init(_ method: String) { self = MethodClass(rawValue: method) ?? .other }
    }

    private var requestCounters: [RequestKey: CoreMetrics.Counter] = [:]
    private var reasonCounters: [String: CoreMetrics.Counter] = [:]
    private var stoppedCounters: [RetryStopReason: CoreMetrics.Counter] = [:]
    private var evaluatorCounters: [String: CoreMetrics.Counter] = [:]
    private var ownResponseCounters: [String: CoreMetrics.Counter] = [:]
    private var cacheCounters: [String: CoreMetrics.Counter] = [:]
    private var luaCounters: [String: CoreMetrics.Counter] = [:]
    private var luaTimers: [String: CoreMetrics.Timer] = [:]
    private let refreshedOK: CoreMetrics.Counter
    private let refreshFailed: CoreMetrics.Counter
    private let connect: CoreMetrics.Timer
    private let tls: CoreMetrics.Timer
    private let firstByte: CoreMetrics.Timer
    private let total: CoreMetrics.Timer
    private let bytesIn: CoreMetrics.Counter
    private let bytesOut: CoreMetrics.Counter
    private let tunnels: CoreMetrics.Counter
    /// `sluice_upstream_tries_total{kind="request"}`: an exchange's tries, from its record.
    private let requestTries: CoreMetrics.Counter
    /// `sluice_upstream_requests_total` by version and new connection (bounded: 3 × 2).
    private var protocolCounters: [ProtocolKey: CoreMetrics.Counter] = [:]
    private struct ProtocolKey: Hashable {
        let version: UpstreamHTTPVersion
        let newConnection: Bool
    }

    public init(metrics: SluiceMetrics = .shared, dashboard: DashboardStats = .shared) {
        self.metrics = metrics
        self.dashboard = dashboard
        refreshedOK = metrics.counter(SluiceMetrics.credentialRefreshes, [("result", "ok")])
        refreshFailed = metrics.counter(SluiceMetrics.credentialRefreshes, [("result", "failed")])
        connect = metrics.timer(SluiceMetrics.upstreamConnect)
        tls = metrics.timer(SluiceMetrics.upstreamTLS)
        firstByte = metrics.timer(SluiceMetrics.upstreamFirstByte)
        total = metrics.timer(SluiceMetrics.upstreamTotal)
        bytesIn = metrics.counter(SluiceMetrics.bytesIn)
        bytesOut = metrics.counter(SluiceMetrics.bytesOut)
        tunnels = metrics.counter(SluiceMetrics.tunnels)
        requestTries = metrics.counter(SluiceMetrics.upstreamTries, [("kind", SluiceMetrics.TryKind.request.rawValue)])
    }

    public var events: ProxyEvent.Kinds {
        [
            .finished, .tunnelClosed, .tunnelOpened, .retrying, .retryStopped, .trustFailed,
            .credentialRefreshed, .credentialRefreshFailed, .cache,
        ]
    }

    /// The exchange's counts, read from its record where it lies (no copy of it).
    public func exchangeEnded(_ summary: ExchangeSummary) { finished(summary) }

    public func handle(_ event: ProxyEvent) {
        switch event {
        case .finished(let summary), .tunnelClosed(let summary):
            finished(summary)
        case .tunnelOpened:
            tunnels.increment()
        case .retrying(_, let record):
            // A validation failure's reason carries its details; the label keeps the kind only.
            let reason = record.reason.hasPrefix("validation") ? "validation" : record.reason
            counter(&reasonCounters, reason, SluiceMetrics.retries, "reason").increment()
        case .retryStopped(_, let reason):
            if let c = stoppedCounters[reason] {
                c.increment()
            } else {
                let c = metrics.counter(SluiceMetrics.retriesStopped, [("reason", reason.rawValue)])
                stoppedCounters[reason] = c
                c.increment()
            }
        case .trustFailed(_, _, let evaluator, _):
            counter(&evaluatorCounters, evaluator, SluiceMetrics.trustFailures, "evaluator").increment()
        case .credentialRefreshed:
            refreshedOK.increment()
        case .credentialRefreshFailed:
            refreshFailed.increment()
        case .cache(_, let step):
            let (name, count): (String, Int)
            switch step {
            case .lookup: (name, count) = ("lookup", 1)
            case .hit: (name, count) = ("hit", 1)
            case .miss: (name, count) = ("miss", 1)
            case .stored: (name, count) = ("stored", 1)
            case .revalidated: (name, count) = ("revalidated", 1)
            case .evicted(let n): (name, count) = ("evicted", n)
            case .invalidated(let n): (name, count) = ("invalidated", n)
            }
            counter(&cacheCounters, name, SluiceMetrics.cache, "event").increment(by: Int64(count))
        default:
            break
        }
    }

    private func counter(
        _ cache: inout [String: CoreMetrics.Counter], _ value: String,
        _ metric: SluiceMetrics.Metric, _ label: String
    ) -> CoreMetrics.Counter {
        if let c = cache[value] { return c }
        let c = metrics.counter(metric, [(label, value)])
        cache[value] = c
        return c
    }

    private func luaCounter(_ call: LuaCallRecord) -> CoreMetrics.Counter {
        let key = call.script + "\u{0}" + call.hook + "\u{0}" + call.outcome
        if let c = luaCounters[key] { return c }
        let c = metrics.counter(
            SluiceMetrics.luaCalls, [("script", call.script), ("hook", call.hook), ("outcome", call.outcome)])
        luaCounters[key] = c
        return c
    }

    private func luaTimer(_ call: LuaCallRecord) -> CoreMetrics.Timer {
        let key = call.script + "\u{0}" + call.hook
        if let t = luaTimers[key] { return t }
        let t = metrics.timer(SluiceMetrics.luaCallDuration, [("script", call.script), ("hook", call.hook)])
        luaTimers[key] = t
        return t
    }

    private func finished(_ s: ExchangeSummary) {
        let key = RequestKey(policy: s.policy, method: MethodClass(s.method), statusClass: UInt8(clamping: s.status / 100))
        let counter: CoreMetrics.Counter
        if let c = requestCounters[key] {
            counter = c
        } else {
            counter = metrics.counter(
                SluiceMetrics.requests,
                [
                    ("policy", key.policy), ("method", key.method.rawValue), ("status_class", "\(key.statusClass)xx"),
                ])
            requestCounters[key] = counter
        }
        counter.increment()
        if let kind = s.errorKind {
            self.counter(&ownResponseCounters, kind.rawValue, SluiceMetrics.ownResponses, "kind").increment()
        }
        if let lua = s.lua {
            luaCounter(lua).increment()
            luaTimer(lua).recordMicroseconds(lua.microseconds)
            for call in lua.counted {
                luaCounter(call).increment()
                luaTimer(call).recordMicroseconds(call.microseconds)
            }
        }
        if s.attempts > 0 { requestTries.increment(by: Int64(s.attempts)) }
        if s.bytesIn > 0 { bytesIn.increment(by: s.bytesIn) }
        if s.bytesOut > 0 { bytesOut.increment(by: s.bytesOut) }
        // libcurl's times are microseconds since the try started; 0 means "did not happen".
        if let t = s.timings, t.total > 0 {
            if t.connect > 0 { connect.recordMicroseconds(t.connect) }
            if t.tls > 0 { tls.recordMicroseconds(t.tls) }
            if t.firstByte > 0 { firstByte.recordMicroseconds(t.firstByte) }
            total.recordMicroseconds(t.total)
        }
        if let t = s.timings, let version = t.httpVersion {
            let key = ProtocolKey(version: version, newConnection: t.newConnection)
            if let c = protocolCounters[key] {
                c.increment()
            } else {
                let c = metrics.counter(
                    SluiceMetrics.upstreamRequests,
                    [
                        ("protocol", version.rawValue), ("connection", t.newConnection ? "new" : "reused"),
                    ])
                protocolCounters[key] = c
                c.increment()
            }
        }
        let shard = dashboardShard ?? dashboard.shardForCurrentThread()
        dashboardShard = shard
        shard.record(s, host: !s.host.isEmpty ? s.host : !s.policy.isEmpty ? s.policy : DashboardStats.noHost)
    }
}

/// Makes one `MetricsMonitor` per worker.
public struct MetricsMonitorFactory: EventMonitorFactory {
    public init() {}
    public var summary: String { "metrics (GET /metrics on the admin listener)" }
    public func makeMonitor() -> any EventMonitor { MetricsMonitor() }
}
