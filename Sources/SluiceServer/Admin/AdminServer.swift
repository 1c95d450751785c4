import CLibEvent
import CShims
import SluiceConfig
import SluiceCore

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

#if canImport(Glibc)
    import Glibc
#endif

/// The admin listener (`admin:`): health and readiness, the exchanges in flight and their
/// cancellation (Alamofire's `withAllRequests` / `cancelAllRequests`), the effective
/// configuration, reload, and the Prometheus metrics (`SluiceMetrics`). JSON in and out; `docs/admin-api.yaml` is its OpenAPI
/// description, and the e2e suite checks every answer against it.
///
/// It serves with libevent's `evhttp` on a thread and event loop of its own, so nothing it
/// does (waiting for the workers' answers included) can delay a proxied request.
///
/// Threading: built on the thread that starts the server (the bind happens there, so a
/// taken address fails the start), then owned by its thread. `stop()` may be called from any
/// thread. It reads the `ProxyServer`'s thread-safe state and asks workers through their
/// mailboxes (`Worker.requestAdmin`), waiting at most `workerAnswerMilliseconds` for them.
final class AdminServer: @unchecked Sendable {
    // @unchecked: `base`, `http` and `stopEvent` are used by the admin thread only once it
    // runs; other threads only activate `stopEvent` through its handle, which lives until
    // this object does (the server joins the admin thread before it drops it).
    private unowned let server: ProxyServer
    private let workers: [Worker.StopHandle]
    private let token: Secret?
    let address: String
    private let base: OpaquePointer
    private let http: OpaquePointer
    private var stopEvent: LoopWake<AdminServer>!
    private var stopHandle: LoopWake<AdminServer>.Handle!
    private var thread: pthread_t?
    /// The live dashboard and its event streams.
    private var dashboard: Dashboard!

    /// How long a request waits for every worker's answer (a stuck worker must not hang it).
    static let workerAnswerMilliseconds = 2000
    /// Request bodies larger than this are refused (413).
    static let maxBodySize = 64 * 1024
    /// How long the admin loop runs on after `stop()`, so replies being written leave.
    static let stopGraceMicroseconds = 200_000

    init(server: ProxyServer, settings: ServerConfiguration.Admin, workers: [Worker.StopHandle]) throws(ServerError) {
        self.server = server
        self.workers = workers
        token = settings.token
        address = settings.listen
        guard let base = event_base_new() else { throw .startup("admin: cannot create an event loop") }
        guard let http = evhttp_new(base) else {
            event_base_free(base)
            throw .startup("admin: cannot create the HTTP server")
        }
        self.base = base
        self.http = http
        let (host, port) = Self.split(settings.listen)
        guard evhttp_bind_socket_with_handle(http, host, port) != nil else {
            let reason = String(cString: strerror(errno))
            evhttp_free(http)
            event_base_free(base)
            throw .startup("cannot listen on \(settings.listen) (admin): \(reason)")
        }
        evhttp_set_max_body_size(http, Int(Self.maxBodySize))
        evhttp_set_timeout(http, 10)
        let me = Unmanaged.passUnretained(self).toOpaque()
        evhttp_set_gencb(
            http,
            { request, arg in
                guard let request else { return }
                Unmanaged<AdminServer>.fromOpaque(arg!).takeUnretainedValue().serve(request)
            }, me)
        stopEvent = LoopWake(on: base, owner: self, crossThread: true) { admin in
            admin.dashboard.stop()
            // A grace period for answers still being written: the request that made the
            // server stop (a cancel that ended the last exchange of a drain) gets its reply.
            var grace = timeval(tv_sec: 0, tv_usec: AdminServer.stopGraceMicroseconds)
            event_base_loopexit(admin.base, &grace)
        }
        stopHandle = stopEvent.handle
        dashboard = Dashboard(base: base) { [unowned self] forPage in dashboardPayload(forPage: forPage) }
    }

    deinit {
        // The HTTP server first: freeing it closes its connections, whose close callbacks
        // still reach the dashboard.
        evhttp_free(http)
        dashboard = nil
        stopEvent = nil
        event_base_free(base)
    }

    private static func split(_ address: String) -> (String, UInt16) {
        let colon = address.lastIndex(of: ":")!
        var host = String(address[..<colon])
        if host.hasPrefix("[") { host = String(host.dropFirst().dropLast()) }
        return (host, UInt16(address[address.index(after: colon)...])!)
    }

    /// Starts the admin thread. The server keeps this object alive until `join()`.
    func start() {
        var thread = pthread_t()
        pthread_create(
            &thread, nil,
            { arg in
                let admin = Unmanaged<AdminServer>.fromOpaque(arg!).takeUnretainedValue()
                sluice_set_thread_name("sluice-admin")
                event_base_dispatch(admin.base)
                return nil
            }, Unmanaged.passUnretained(self).toOpaque())
        self.thread = thread
    }

    /// Ends the admin loop after `stopGraceMicroseconds` (replies being written leave first).
    /// Safe from any thread.
    func stop() { stopHandle.activate() }

    func join() {
        if let thread { pthread_join(thread, nil) }
        thread = nil
    }

    // MARK: requests

    private func serve(_ request: OpaquePointer) {
        let method = evhttp_request_get_command(request)
        let uri = evhttp_request_get_uri(request).map { String(cString: $0) } ?? "/"
        let path = String(uri.prefix { $0 != "?" })
        var body: [UInt8] = []
        if let input = evhttp_request_get_input_buffer(request) {
            let length = evbuffer_get_length(input)
            if length > 0, let bytes = evbuffer_pullup(input, -1) {
                body = Array(UnsafeBufferPointer(start: bytes, count: length))
            }
        }
        let response: AdminResponse
        let isGet = method == EVHTTP_REQ_GET || method == EVHTTP_REQ_HEAD
        if path == "/" && isGet {
            // The page holds no data (its stream asks for the token), so it is served to anyone
            // who reaches the listener.
            response = AdminResponse(status: 200, contentType: "text/html; charset=utf-8", body: Array(Dashboard.page.utf8))
        } else if path == Dashboard.chartLibraryPath && isGet {
            // Debian's Chart.js, a public library: no data, no token.
            response = dashboard.chartLibrary()
        } else if !authorized(request) {
            response = .error(
                401, "missing or wrong bearer token", headers: [("WWW-Authenticate", "Bearer realm=\"sluice admin\"")])
        } else if path == "/dashboard/events" && isGet {
            dashboard.startStream(request)
            return
        } else {
            response = route(method: method, path: path, query: String(uri.dropFirst(path.count + 1)), body: body)
        }
        send(response, to: request)
    }

    private func authorized(_ request: OpaquePointer) -> Bool {
        guard let token else { return true }
        guard let headers = evhttp_request_get_input_headers(request),
            let value = evhttp_find_header(headers, "Authorization")
        else { return false }
        return Self.constantTimeEqual(Array(String(cString: value).utf8), Array(("Bearer " + token.value).utf8))
    }

    /// Compares without stopping at the first difference (the time does not tell how much of
    /// a guessed token was right).
    static func constantTimeEqual(_ a: [UInt8], _ b: [UInt8]) -> Bool {
        var difference = UInt8(a.count == b.count ? 0 : 1)
        for i in 0..<max(a.count, b.count) {
            difference |= (i < a.count ? a[i] : 0) ^ (i < b.count ? b[i] : 0)
        }
        return difference == 0
    }

    private func route(method: evhttp_cmd_type, path: String, query: String, body: [UInt8]) -> AdminResponse {
        let isGet = method == EVHTTP_REQ_GET || method == EVHTTP_REQ_HEAD
        let isPost = method == EVHTTP_REQ_POST
        switch path {
        case "/healthz":
            return isGet ? .json(200, ["status": "alive"]) : .methodNotAllowed("GET")
        case "/readyz":
            return isGet ? readiness() : .methodNotAllowed("GET")
        case "/requests":
            return isGet ? listRequests() : .methodNotAllowed("GET")
        case "/requests/cancel":
            return isPost ? cancelRequests(body) : .methodNotAllowed("POST")
        case "/config":
            return isGet ? configuration() : .methodNotAllowed("GET")
        case "/reload":
            return isPost ? reload() : .methodNotAllowed("POST")
        case "/metrics":
            return isGet ? metrics() : .methodNotAllowed("GET")
        case "/upstreams":
            return isGet ? upstreams() : .methodNotAllowed("GET")
        case "/limits":
            return isGet ? limits() : .methodNotAllowed("GET")
        case "/fleet":
            return isGet ? fleet() : .methodNotAllowed("GET")
        case "/dashboard/data":
            return isGet ? .encoded(200, dashboardPayload(forPage: true)) : .methodNotAllowed("GET")
        case "/dashboard/history":
            return isGet ? .encoded(200, DashboardHistoryView(dashboard.history)) : .methodNotAllowed("GET")
        case "/dashboard/host":
            return isGet ? hostView(query) : .methodNotAllowed("GET")
        case "/", "/dashboard/events":
            return .methodNotAllowed("GET")
        default:
            return .error(404, "no such admin endpoint: \(path) (see docs/admin-api.yaml)")
        }
    }

    private func askWorkers<T: Sendable>(
        milliseconds: Int = AdminServer.workerAnswerMilliseconds, _ make: (AdminGather<T>) -> Worker.AdminTask
    ) -> (results: [T], complete: Bool) {
        let gather = AdminGather<T>(expected: workers.count)
        for worker in workers { Worker.requestAdmin(worker, make(gather)) }
        return gather.wait(milliseconds: milliseconds)
    }

    /// The workers' counts for the history's sample each second: answers within 100 ms, and
    /// the last known counts of a worker busy longer, so that a tick never holds the admin
    /// thread (and the requests behind it) for long.
    private var lastCounts: [Int: Worker.WorkerCounts] = [:]
    private func dashboardCounts() -> [Worker.WorkerCounts] {
        for counts in askWorkers(milliseconds: 100, { Worker.AdminTask.counts($0) }).results where counts.index >= 0 {
            lastCounts[counts.index] = counts
        }
        return Array(lastCounts.values)
    }

    private func readiness() -> AdminResponse {
        let answers = askWorkers { Worker.AdminTask.ping($0) }
        let usable = answers.results.filter { $0 }.count
        let ready = answers.complete && usable == workers.count
        return .encoded(
            ready ? 200 : 503,
            Readiness(
                ready: ready, listeners: true, configurationGeneration: server.configurationGeneration,
                workers: workers.count, workersReady: usable))
    }

    private func listRequests() -> AdminResponse {
        let answers = askWorkers { Worker.AdminTask.list($0) }
        let all = answers.results.flatMap { $0 }.sorted { $0.ageMilliseconds > $1.ageMilliseconds }
        return .encoded(200, RequestList(requests: all, complete: answers.complete))
    }

    private func cancelRequests(_ body: [UInt8]) -> AdminResponse {
        let filter: AdminCancelFilter
        do {
            filter = try AdminCancelFilter(json: body)
        } catch {
            return .error(400, error.message)
        }
        let answers = askWorkers { Worker.AdminTask.cancel(filter, $0) }
        let count = answers.results.reduce(0, +)
        Log.info("admin: cancelled \(count) request(s) (\(filter))")
        return .encoded(200, CancelResult(cancelled: count, complete: answers.complete))
    }

    private func reload() -> AdminResponse {
        let result = server.reloadFile()
        return .encoded(
            result.applied ? 200 : 422,
            ReloadAnswer(applied: result.applied, errors: result.errors, configurationGeneration: result.generation))
    }

    /// The Prometheus text exposition (docs/metrics.md): the gauges are read from the workers
    /// now; the rest is what the `metrics` monitor and the server recorded.
    /// The counts of every worker whose loop still runs.
    private func workerCounts() -> [Worker.WorkerCounts] {
        askWorkers { Worker.AdminTask.counts($0) }.results.filter { $0.index >= 0 }
    }

    /// `GET /upstreams`: every origin a policy with `health:` sent tries to, and its circuit.
    private func upstreams() -> AdminResponse {
        let now = MonotonicClock.milliseconds()
        let answers = askWorkers { Worker.AdminTask.pools($0) }
        var pools: [String: (open: Int, idle: Int)] = [:]
        for count in answers.results.joined() {
            pools[count.origin, default: (0, 0)].open += count.open
            pools[count.origin]!.idle += count.idle
        }
        return .encoded(
            200,
            UpstreamList(
                upstreams: server.health.statuses().map { UpstreamList.Upstream($0, now: now) },
                pools: pools.sorted { $0.key < $1.key }.map {
                    UpstreamList.Pool(origin: $0.key, open: $0.value.open, idle: $0.value.idle)
                },
                complete: answers.complete))
    }

    /// `GET /limits`: every policy's `rate_limit` as it stands — its keys, the tries waiting
    /// and in flight, what its limits decided, and the holds its origins asked for
    /// (`rate_limit.learn`) with the time left.
    private func limits() -> AdminResponse {
        let configured = server.currentConfiguration.pipeline.policies
        let states = server.rateLimits.snapshot(now: MonotonicClock.microseconds())
        return .encoded(200, LimitList(states, configured))
    }

    /// `GET /fleet`: the fleet's Redis as each worker sees it, the instances alive at the last
    /// heartbeat and the decisions taken without Redis (`on_redis_down`); with `fleet.cache`,
    /// the shared cache's members (`FleetCacheView`).
    private func fleet() -> AdminResponse {
        let settings = server.currentConfiguration.server.fleet
        let cache = server.fleetPeers.map(FleetCacheView.init)
        guard settings != nil || cache != nil else {
            return .error(404, "no fleet is configured (fleet: in the configuration, docs/fleet.md)")
        }
        var view = FleetView(cache: cache)
        if let settings {
            let shared = server.fleetShared
            view.redis = FleetView.Redis(
                redis: settings.redis.description, instance: shared.instance,
                instancesAlive: shared.instancesAlive.load(ordering: .relaxed), onRedisDown: settings.onRedisDown.rawValue,
                timeoutMs: settings.timeout, fallbacks: shared.fallbacks.load(ordering: .relaxed),
                episodes: shared.episodes.load(ordering: .relaxed),
                workers: askWorkers { Worker.AdminTask.fleet($0) }.results.filter { $0.worker >= 0 }.sorted {
                    $0.worker < $1.worker
                })
        }
        return .encoded(200, view)
    }

    private func metrics() -> AdminResponse {
        SluiceMetrics.shared.recordCircuits(server.health.statuses())
        SluiceMetrics.shared.recordRateLimits(server.rateLimits.snapshot(now: MonotonicClock.microseconds()))
        if let disk = server.diskTier {
            SluiceMetrics.shared.recordCacheDisk(
                sendfileBytes: disk.sendfileBytes.load(ordering: .relaxed),
                verifiedBytes: disk.verifiedBytes.load(ordering: .relaxed))
        }
        if server.currentConfiguration.server.fleet != nil {
            SluiceMetrics.shared.recordFleet(instances: server.fleetShared.instancesAlive.load(ordering: .relaxed))
        }
        if let peers = server.fleetPeers {
            SluiceMetrics.shared.recordFleetCache(members: peers.membership.members.count)
        }
        SluiceMetrics.shared.recordLuaStates()
        SluiceMetrics.shared.recordState(
            generation: server.configurationGeneration,
            workers: workerCounts().map { ($0.index, $0.exchangesInFlight, $0.clientConnections) })
        return AdminResponse(
            status: 200, contentType: "text/plain; version=0.0.4; charset=utf-8",
            body: SluiceMetrics.shared.exposition())
    }

    /// `GET /dashboard/host?host=NAME`: one host's page on the dashboard — its seconds of the
    /// last 15 minutes, its policy as `sluice check --host` describes it, its last failed
    /// exchanges and its last script errors.
    private func hostView(_ query: String) -> AdminResponse {
        var host: String?
        for pair in query.split(separator: "&") where pair.hasPrefix("host=") {
            host = PercentEncoding.decode(String(pair.dropFirst(5)).replacing("+", with: " "))
        }
        guard let host, !host.isEmpty else { return .error(400, "name the host: GET /dashboard/host?host=NAME") }
        let policy: String
        switch host {
        case DashboardStats.noHost:
            policy = "no policy: these requests were refused before a host was known (docs/errors.md)"
        case DashboardStats.otherHosts:
            policy = "no policy: the hosts beyond the \(DashboardStats.maxHosts) the dashboard counts one by one"
        default:
            policy = PolicyDescription.describe(server.currentConfiguration.pipeline, host: host)
        }
        return .encoded(
            200,
            DashboardHostView(
                host: host, policy: policy, history: dashboard.history,
                failures: DashboardStats.shared.failedExchanges(host: host),
                scriptErrors: DashboardStats.shared.scriptErrors(host: host)))
    }

    /// `forPage`: every field (the page, `/dashboard/data`); else what the history keeps,
    /// with the workers' counts asked for with a short deadline (`dashboardCounts`).
    private func dashboardPayload(forPage: Bool) -> DashboardPayload {
        let live = forPage ? workerCounts() : dashboardCounts()
        let recording = server.currentConfiguration.pipeline.monitors.contains { $0 is MetricsMonitorFactory }
        var payload = DashboardPayload(
            stats: DashboardStats.shared.snapshot(), generation: server.configurationGeneration,
            inFlight: live.reduce(0) { $0 + $1.exchangesInFlight },
            connections: live.reduce(0) { $0 + $1.clientConnections }, recording: recording)
        guard forPage else { return payload }
        payload.limits = server.rateLimits.snapshot(now: MonotonicClock.microseconds()).map(DashboardPayload.Limit.init)
        if server.currentConfiguration.server.fleet != nil {
            let shared = server.fleetShared
            payload.fleet = DashboardPayload.Fleet(
                instancesAlive: shared.instancesAlive.load(ordering: .relaxed),
                fallbacks: shared.fallbacks.load(ordering: .relaxed))
        }
        if let peers = server.fleetPeers {
            let membership = peers.membership
            payload.fleetCache = DashboardPayload.FleetCache(
                members: membership.members.count, share: membership.share(of: membership.advertise),
                state: membership.state.rawValue)
        }
        return payload
    }

    private func configuration() -> AdminResponse {
        .encoded(
            200,
            ConfigurationView(
                server.currentConfiguration, generation: server.configurationGeneration,
                source: server.configPath))
    }

    private func send(_ response: AdminResponse, to request: OpaquePointer) {
        if let headers = evhttp_request_get_output_headers(request) {
            evhttp_add_header(headers, "Content-Type", response.contentType)
            evhttp_add_header(headers, "Cache-Control", "no-store")
            for (name, value) in response.headers { evhttp_add_header(headers, name, value) }
        }
        let output = evbuffer_new()
        response.body.withUnsafeBytes { _ = evbuffer_add(output, $0.baseAddress, $0.count) }
        evhttp_send_reply(request, Int32(response.status), Self.reason(response.status), output)
        evbuffer_free(output)
    }

    private static func reason(_ status: Int) -> String {
        switch status {
        case 200: return "OK"
        case 400: return "Bad Request"
        case 401: return "Unauthorized"
        case 404: return "Not Found"
        case 405: return "Method Not Allowed"
        case 422: return "Unprocessable Content"
        case 503: return "Service Unavailable"
        default: return "Status"
        }
    }
}

/// One admin answer before it is written.
struct AdminResponse {
    var status: Int
    var contentType = "application/json"
    var headers: [(String, String)] = []
    var body: [UInt8]

    static func encoded(_ status: Int, _ value: some Encodable) -> AdminResponse {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        let data = (try? encoder.encode(value)) ?? Data("{}".utf8)
        return AdminResponse(status: status, body: Array(data) + [0x0A])
    }

    static func json(_ status: Int, _ value: [String: String]) -> AdminResponse { encoded(status, value) }

    /// `{"error": message}`; every admin error has this form.
    static func error(_ status: Int, _ message: String, headers: [(String, String)] = []) -> AdminResponse {
        var response = encoded(status, ["error": message])
        response.headers = headers
        return response
    }

    static func methodNotAllowed(_ allowed: String) -> AdminResponse {
        error(405, "use \(allowed) here", headers: [("Allow", allowed)])
    }
}

/// Which exchanges `POST /requests/cancel` ends: `{"all": true}`, `{"id": N}`, `{"ids": [N, …]}`
/// or `{"host": "example.com"}` (the host the policy was matched for, case-insensitive).
enum AdminCancelFilter: Sendable, CustomStringConvertible {
    case all
    case ids(Set<UInt64>)
    case host(String)

    struct Invalid: Error { let message: String }

    private struct Body: Decodable {
        var all: Bool?
        var id: UInt64?
        var ids: [UInt64]?
        var host: String?
    }

    init(json: [UInt8]) throws(Invalid) {
        let usage = #"the body must be one of {"all": true}, {"id": N}, {"ids": [N, …]}, {"host": "NAME"}"#
        guard let body = try? JSONDecoder().decode(Body.self, from: Data(json)) else { throw Invalid(message: usage) }
        let given = [body.all == true, body.id != nil, body.ids != nil, body.host != nil].filter { $0 }.count
        guard given == 1 else { throw Invalid(message: usage) }
        if body.all == true {
            self = .all
        } else if let id = body.id {
            self = .ids([id])
        } else if let ids = body.ids {
            self = .ids(Set(ids))
        } else {
            self = .host(body.host!.lowercased())
        }
    }

    func matches(_ exchange: AdminExchange) -> Bool {
        switch self {
        case .all: return true
        case .ids(let ids): return ids.contains(exchange.id)
        case .host(let host): return exchange.host.lowercased() == host
        }
    }

    var description: String {
        switch self {
        case .all: return "all"
        case .ids(let ids): return "ids " + ids.sorted().map(String.init).joined(separator: ", ")
        case .host(let host): return "host \(host)"
        }
    }
}

// MARK: answers (docs/admin-api.yaml's schemas)

private struct Readiness: Encodable {
    let ready: Bool
    let listeners: Bool
    let configurationGeneration: Int
    let workers: Int
    let workersReady: Int
    enum CodingKeys: String, CodingKey {
        case ready, listeners, workers
        case configurationGeneration = "configuration_generation"
        case workersReady = "workers_ready"
    }
}

private struct RequestList: Encodable {
    let requests: [AdminExchange]
    /// False when a worker did not answer in time (its exchanges are missing).
    let complete: Bool
}

/// `GET /fleet` (docs/admin-api.yaml): the Redis part's fields at the top (with `fleet.redis`),
/// and `cache` (with `fleet.cache`).
private struct FleetView: Encodable {
    struct Redis: Encodable {
        let redis: String
        let instance: String
        let instancesAlive: Int
        let onRedisDown: String
        let timeoutMs: Int
        let fallbacks: Int
        let episodes: Int
        let workers: [FleetWorkerState]
        enum CodingKeys: String, CodingKey {
            case redis, instance, fallbacks, workers
            case episodes = "fallback_episodes"
            case instancesAlive = "instances_alive"
            case onRedisDown = "on_redis_down"
            case timeoutMs = "timeout_ms"
        }
    }
    var redis: Redis?
    let cache: FleetCacheView?

    init(cache: FleetCacheView?) { self.cache = cache }

    func encode(to encoder: any Encoder) throws {
        try redis?.encode(to: encoder)
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encodeIfPresent(cache, forKey: .cache)
    }
    enum CodingKeys: String, CodingKey { case cache }
}

/// `GET /limits` (docs/admin-api.yaml).
private struct LimitList: Encodable {
    struct Hold: Encodable {
        let key: String
        let remainingMs: Int
        let reason: String
        enum CodingKeys: String, CodingKey {
            case key, reason
            case remainingMs = "remaining_ms"
        }
    }
    struct Policy: Encodable {
        let policy: String
        /// As configured now (nil: the policy no longer has a `rate_limit`).
        let limits: [String]?
        let onLimit: String?
        let maxWaitMs: Int?
        let key: String?
        let learn: Bool?
        let maxConcurrent: Int?
        let keys: Int
        let waiting: Int
        let inFlight: Int
        let evicted: Int
        let allowed: Int
        let waited: Int
        let rejected: Int
        let left: Int
        let learned: Int
        let holds: [Hold]
        enum CodingKeys: String, CodingKey {
            case policy, limits, key, learn, keys, waiting, evicted, allowed, waited, rejected, left, learned, holds
            case onLimit = "on_limit"
            case maxWaitMs = "max_wait_ms"
            case maxConcurrent = "max_concurrent"
            case inFlight = "in_flight"
        }
    }
    let policies: [Policy]

    init(_ states: [RateLimitTable.PolicyState], _ table: PolicyTable) {
        var byName = Dictionary(uniqueKeysWithValues: states.map { ($0.policy, $0) })
        var names = table.names.filter { table.policy(named: $0)?.rateLimit != nil }
        names += states.map(\.policy).filter { !names.contains($0) }
        policies = names.map { name in
            let state = byName.removeValue(forKey: name)
            let settings = table.policy(named: name)?.rateLimit
            let counts = state?.counts ?? RateLimitTable.Counts()
            return Policy(
                policy: name, limits: settings.map { $0.limits.map { "\($0) (burst \($0.burst))" } },
                onLimit: settings?.onLimit.rawValue, maxWaitMs: settings?.maxWait, key: settings.map { "\($0.key)" },
                learn: settings?.learn, maxConcurrent: settings?.maxConcurrent, keys: state?.keys ?? 0,
                waiting: state?.waiting ?? 0, inFlight: state?.inFlight ?? 0, evicted: state?.evicted ?? 0,
                allowed: counts.allowed, waited: counts.waited, rejected: counts.rejected, left: counts.left,
                learned: counts.learned,
                holds: (state?.holds ?? []).map {
                    Hold(key: $0.key, remainingMs: Int(($0.remaining + 999) / 1000), reason: $0.reason)
                })
        }
    }
}

/// `GET /upstreams` (docs/admin-api.yaml).
private struct UpstreamList: Encodable {
    struct Upstream: Encodable {
        let origin: String
        let state: String
        let consecutiveFailures: Int
        let failureThreshold: Int
        let cooldownMs: Int
        let probe: String?
        /// Milliseconds since the circuit last opened from closed (nil: never).
        let openedMsAgo: Int?
        let opens: Int
        let failedFast: Int
        enum CodingKeys: String, CodingKey {
            case origin, state, probe, opens
            case consecutiveFailures = "consecutive_failures"
            case failureThreshold = "failure_threshold"
            case cooldownMs = "cooldown_ms"
            case openedMsAgo = "opened_ms_ago"
            case failedFast = "failed_fast"
        }
        init(_ status: UpstreamHealth.Status, now: Int) {
            let b = status.breaker
            origin = status.origin.name
            state = b.state.rawValue
            consecutiveFailures = b.consecutiveFailures
            failureThreshold = b.settings.consecutiveFailures
            cooldownMs = b.settings.cooldown
            probe = b.settings.probe?.path
            openedMsAgo = b.openedAt.map { now - $0 }
            opens = b.opens
            failedFast = b.failedFast
        }
        func encode(to encoder: any Encoder) throws {
            var c = encoder.container(keyedBy: CodingKeys.self)
            try c.encode(origin, forKey: .origin)
            try c.encode(state, forKey: .state)
            try c.encode(consecutiveFailures, forKey: .consecutiveFailures)
            try c.encode(failureThreshold, forKey: .failureThreshold)
            try c.encode(cooldownMs, forKey: .cooldownMs)
            try c.encode(probe, forKey: .probe)
            try c.encode(openedMsAgo, forKey: .openedMsAgo)
            try c.encode(opens, forKey: .opens)
            try c.encode(failedFast, forKey: .failedFast)
        }
    }
    struct Pool: Encodable {
        let origin: String
        /// Connections open to it (carrying a request or idle), every worker's together.
        let open: Int
        /// Of those, the ones idle in the pools, ready for a request.
        let idle: Int
    }
    let upstreams: [Upstream]
    /// The native transport's keep-alive pools, by origin (`upstream.engine: native`; tries
    /// through libcurl are not counted).
    let pools: [Pool]
    /// Whether every worker answered in time (the pools of one that did not are missing).
    let complete: Bool
}

private struct CancelResult: Encodable {
    let cancelled: Int
    let complete: Bool
}

private struct ReloadAnswer: Encodable {
    let applied: Bool
    let errors: [String]
    let configurationGeneration: Int
    enum CodingKeys: String, CodingKey {
        case applied, errors
        case configurationGeneration = "configuration_generation"
    }
}
