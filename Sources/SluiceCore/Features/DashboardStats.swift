import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// What the admin listener's live dashboard shows (`GET /`, fed by `GET /dashboard/events`):
/// totals, the last minute's latencies, and a row per host. The `metrics` monitor records
/// every finished exchange here as well as in `SluiceMetrics`.
///
/// Bounded by construction: latencies are a ring of the last `latencyWindow` exchanges per
/// worker, and hosts beyond `maxHosts` (per worker) are counted under `other` (a proxy's destinations are its clients'
/// choice).
///
/// Threading: each worker thread records into its own `Shard` (its lock is uncontended but
/// for a snapshot); the admin thread merges the shards for a snapshot.
public final class DashboardStats: Sendable {
    public static let shared = DashboardStats()
    public static let maxHosts = 200
    /// The row of exchanges refused before a host was known (a request that did not parse,
    /// a 407, a CONNECT port not allowed).
    public static let noHost = "(no host)"
    /// The row of the hosts beyond `maxHosts`.
    public static let otherHosts = "other"
    public static let latencyWindow = 4096

    public struct HostRow: Sendable, Equatable {
        public var requests: Int64 = 0
        public var errors: Int64 = 0
        public var retries: Int64 = 0
        public var bytesOut: Int64 = 0
        /// Sum of the last tries' durations, microseconds, and the exchanges that had one (the
        /// mean's; cache hits and refusals did not go upstream).
        public var totalMicroseconds: Int64 = 0
        public var timedRequests: Int64 = 0
    }

    /// What each exchange came to, beyond its status: the page's error chart splits `errors`
    /// into these, and the cache chart reads the rest. Totals since start.
    public struct Outcomes: Sendable, Equatable {
        /// Answers 5xx from the origin (the response was the origin's).
        public var origin5xx: Int64 = 0
        /// Sluice's own answers (`ProxyError`), by case; refusals at accept included.
        public var refusals: [ProxyError.Kind: Int64] = [:]
        /// Exchanges that ended without a whole response and without an answer of Sluice's
        /// own: the origin's response broke after it started, or the client's connection did
        /// not get it.
        public var failures: Int64 = 0
        /// Exchanges the shared cache looked at (`cache_store`), and those it answered from
        /// the store (a hit, a 304 revalidation, stale on error).
        public var cacheLookups: Int64 = 0
        public var cacheServed: Int64 = 0
        /// Response bytes to clients from the store, and from origins (everything else).
        public var bytesFromCache: Int64 = 0
        public var bytesFromOrigin: Int64 = 0
        /// Exchanges whose tries waited for their turn under a `rate_limit`.
        public var quotaWaits: Int64 = 0
        /// Resumes that carried a broken download on (`Resume`).
        public var resumes: Int64 = 0

        public init() {}

        public var refusalsTotal: Int64 { refusals.values.reduce(0, +) }

        mutating func add(_ o: Outcomes) {
            origin5xx += o.origin5xx
            for (kind, n) in o.refusals { refusals[kind, default: 0] += n }
            failures += o.failures
            cacheLookups += o.cacheLookups
            cacheServed += o.cacheServed
            bytesFromCache += o.bytesFromCache
            bytesFromOrigin += o.bytesFromOrigin
            quotaWaits += o.quotaWaits
            resumes += o.resumes
        }
    }

    /// One of a host's recent failed exchanges (its page on the dashboard): a 5xx, a refusal
    /// of Sluice's, or a response that broke. The URL keeps no query (it may carry secrets).
    /// Encoded as `GET /dashboard/host` sends it (docs/admin-api.yaml, `DashboardHost`).
    public struct FailedExchange: Sendable, Equatable, Encodable {
        public var timeMilliseconds: Int64
        public var method: String
        public var url: String
        public var status: Int
        /// A `ProxyError.Kind` name, `origin_5xx`, or `broken` (no answer of Sluice's: the
        /// response broke after it started, or never came).
        public var kind: String
        public var error: String?
        public var attempts: Int

        enum CodingKeys: String, CodingKey {
            case method, url, status, kind, error, attempts
            case timeMilliseconds = "time_ms"
        }
    }

    /// One of a host's recent script errors (its page on the dashboard): a `lua` hook that
    /// failed or was stopped by a limit, whatever the client got (`fail_open` goes on).
    /// Encoded as `GET /dashboard/host` sends it (docs/admin-api.yaml, `DashboardHost`).
    public struct ScriptError: Sendable, Equatable, Encodable {
        public var timeMilliseconds: Int64
        public var script: String
        public var hook: String
        /// `error` or `limit`.
        public var outcome: String
        /// The script's message (`sign.lua:42: attempt to index a nil value`), cut as a failed
        /// exchange's error is.
        public var error: String
        /// The exchange's id, as the access log's `id` and the `502`'s body give it.
        public var id: UInt64

        enum CodingKeys: String, CodingKey {
            case script, hook, outcome, error, id
            case timeMilliseconds = "time_ms"
        }
    }

    /// A host's script errors kept: the last `10` (per worker; the merge keeps the newest).
    public static let scriptErrorsPerHost = 10

    /// A host's failed exchanges kept (per worker; the merge keeps the newest this many).
    public static let failuresPerHost = 50
    /// The longest URL and error a failed exchange keeps (longer ones end with `…`).
    static let failedURLLimit = 200
    static let failedErrorLimit = 300

    public struct Snapshot: Sendable, Equatable {
        public var requests: Int64
        public var errors: Int64
        public var retries: Int64
        public var outcomes = Outcomes()
        /// Percentiles of the recent exchanges' upstream time, milliseconds (nil: none yet).
        public var p50: Double?
        public var p90: Double?
        public var p99: Double?
        /// The busiest hosts first.
        public var hosts: [(host: String, row: HostRow)]

        public static func == (a: Snapshot, b: Snapshot) -> Bool {
            a.requests == b.requests && a.errors == b.errors && a.retries == b.retries && a.outcomes == b.outcomes
                && a.p50 == b.p50
                && a.p90 == b.p90 && a.p99 == b.p99 && a.hosts.map(\.host) == b.hosts.map(\.host)
                && a.hosts.map(\.row) == b.hosts.map(\.row)
        }
    }

    fileprivate struct State {
        var requests: Int64 = 0
        var errors: Int64 = 0
        var retries: Int64 = 0
        var outcomes = Outcomes()
        var hosts: [String: HostRow] = [:]
        /// The last `failuresPerHost` failed exchanges per host, oldest first.
        var failed: [String: [FailedExchange]] = [:]
        /// The last `scriptErrorsPerHost` script errors per host, oldest first.
        var scriptErrors: [String: [ScriptError]] = [:]
        var latencies = [Int64](repeating: 0, count: DashboardStats.latencyWindow)
        var latencyCount = 0
        var latencyNext = 0
    }

    /// One worker thread's part: recorded without contention (only a snapshot takes its
    /// lock from another thread), merged by `snapshot()`.
    public final class Shard: Sendable {
        fileprivate let state = Mutex(State())

        /// One finished exchange, as the `metrics` monitor sees it (`host`: its row's key). An
        /// error is a 5xx answer or none at all (a failure before or during the response).
        public func record(_ s: ExchangeSummary, host: String) {
            let failed = s.outcome == .error || s.outcome == .upstreamAborted
            let isError = failed || s.status >= 500 || s.status == 0
            let retries = Int64(s.retries.count)
            let total = s.timings?.total
            let failure = isError ? Failure(s).map { DashboardStats.failedExchange(s, $0) } : nil
            let scriptError = s.lua.flatMap { DashboardStats.scriptError(s, $0) }
            state.withLock { s2 in
                s2.requests += 1
                s2.retries += retries
                if isError { s2.errors += 1 }
                s2.outcomes.count(s)
                let key = s2.hosts[host] != nil || s2.hosts.count < DashboardStats.maxHosts ? host : DashboardStats.otherHosts
                s2.hosts[key, default: HostRow()].requests += 1
                if isError { s2.hosts[key]!.errors += 1 }
                s2.hosts[key]!.retries += retries
                s2.hosts[key]!.bytesOut += s.bytesOut
                if let t = total, t > 0 {
                    s2.hosts[key]!.totalMicroseconds += t
                    s2.hosts[key]!.timedRequests += 1
                    s2.latencies[s2.latencyNext] = t
                    s2.latencyNext = (s2.latencyNext + 1) % DashboardStats.latencyWindow
                    s2.latencyCount = min(s2.latencyCount + 1, DashboardStats.latencyWindow)
                }
                if let failure {
                    s2.failed[key, default: []].append(failure)
                    if s2.failed[key]!.count > DashboardStats.failuresPerHost { s2.failed[key]!.removeFirst() }
                }
                if let scriptError {
                    s2.scriptErrors[key, default: []].append(scriptError)
                    if s2.scriptErrors[key]!.count > DashboardStats.scriptErrorsPerHost { s2.scriptErrors[key]!.removeFirst() }
                }
            }
        }

        /// A connection refused at accept (`limits.max_connections…`): no exchange, no host.
        public func recordRefusal(_ kind: ProxyError.Kind) {
            state.withLock { $0.outcomes.refusals[kind, default: 0] += 1 }
        }
    }

    /// What kind of error an exchange ended in, if it ended in one the dashboard splits out:
    /// an answer of Sluice's own (its kind), a response that broke or never came, or the
    /// origin's 5xx. One reading for the error chart (`Outcomes`) and a host's failures.
    enum Failure: Equatable {
        case refusal(ProxyError.Kind)
        case broken
        case origin5xx

        init?(_ s: ExchangeSummary) {
            if let kind = s.errorKind {
                self = .refusal(kind)
            } else if s.outcome == .error || s.outcome == .upstreamAborted || s.status == 0 {
                self = .broken
            } else if s.status >= 500 {
                self = .origin5xx
            } else {
                return nil
            }
        }

        /// Its name on a host's failed exchanges.
        var name: String {
            switch self {
            case .refusal(let kind): return kind.rawValue
            case .broken: return "broken"
            case .origin5xx: return "origin_5xx"
            }
        }
    }

    static func failedExchange(_ s: ExchangeSummary, _ failure: Failure) -> FailedExchange {
        var url = String(s.url.prefix { $0 != "?" && $0 != "#" })
        if url.utf8.count < s.url.utf8.count { url += "?…" }
        if url.count > failedURLLimit { url = String(url.prefix(failedURLLimit)) + "…" }
        // A method is a client's token of any length; an error names hosts and reasons.
        let method = s.method.count > 16 ? String(s.method.prefix(16)) + "…" : s.method
        let error = s.error.map { $0.count > failedErrorLimit ? String($0.prefix(failedErrorLimit)) + "…" : $0 }
        return FailedExchange(
            timeMilliseconds: Int64(SystemClock().wallClockMilliseconds()), method: method, url: url,
            status: s.status, kind: failure.name, error: error, attempts: s.attempts)
    }

    /// `call` as a host's script error; nil when it succeeded.
    static func scriptError(_ s: ExchangeSummary, _ call: LuaCallRecord) -> ScriptError? {
        guard let error = call.error else { return nil }
        return ScriptError(
            timeMilliseconds: Int64(SystemClock().wallClockMilliseconds()), script: call.script, hook: call.hook,
            outcome: call.outcome, error: error.count > failedErrorLimit ? String(error.prefix(failedErrorLimit)) + "…" : error,
            id: s.id)
    }

    /// The shards by the thread that records into them: a worker keeps its shard across
    /// reloads (the monitors are made anew, the counts stay).
    private let shards = Mutex<[UInt: Shard]>([:])

    public init() {}

    /// The calling thread's shard (made on first use).
    public func shardForCurrentThread() -> Shard {
        let thread = UInt(pthread_self())
        return shards.withLock { shards in
            if let shard = shards[thread] { return shard }
            let shard = Shard()
            shards[thread] = shard
            return shard
        }
    }

    public func snapshot() -> Snapshot {
        var s = State()
        var recent: [Int64] = []
        for shard in shards.withLock({ Array($0.values) }) {
            shard.state.withLock { part in
                s.requests += part.requests
                s.errors += part.errors
                s.retries += part.retries
                s.outcomes.add(part.outcomes)
                for (host, row) in part.hosts {
                    s.hosts[host, default: HostRow()].requests += row.requests
                    s.hosts[host]!.errors += row.errors
                    s.hosts[host]!.retries += row.retries
                    s.hosts[host]!.bytesOut += row.bytesOut
                    s.hosts[host]!.totalMicroseconds += row.totalMicroseconds
                    s.hosts[host]!.timedRequests += row.timedRequests
                }
                recent.append(contentsOf: part.latencies.prefix(part.latencyCount))
            }
        }
        let sorted = recent.sorted()
        func percentile(_ p: Double) -> Double? {
            guard !sorted.isEmpty else { return nil }
            let index = min(sorted.count - 1, Int((p * Double(sorted.count)).rounded(.up)) - 1)
            return Double(sorted[max(0, index)]) / 1000
        }
        let hosts = s.hosts.sorted {
            $0.value.requests != $1.value.requests ? $0.value.requests > $1.value.requests : $0.key < $1.key
        }
        return Snapshot(
            requests: s.requests, errors: s.errors, retries: s.retries, outcomes: s.outcomes,
            p50: percentile(0.5), p90: percentile(0.9), p99: percentile(0.99),
            hosts: hosts.map { ($0.key, $0.value) })
    }
}

extension DashboardStats {
    /// `host`'s last failed exchanges, every worker's together, oldest first (at most
    /// `failuresPerHost`).
    public func failedExchanges(host: String) -> [FailedExchange] {
        var all: [FailedExchange] = []
        for shard in shards.withLock({ Array($0.values) }) {
            shard.state.withLock { all.append(contentsOf: $0.failed[host] ?? []) }
        }
        all.sort { $0.timeMilliseconds < $1.timeMilliseconds }
        return Array(all.suffix(Self.failuresPerHost))
    }

    /// `host`'s last script errors, every worker's together, oldest first (at most
    /// `scriptErrorsPerHost`).
    public func scriptErrors(host: String) -> [ScriptError] {
        var all: [ScriptError] = []
        for shard in shards.withLock({ Array($0.values) }) {
            shard.state.withLock { all.append(contentsOf: $0.scriptErrors[host] ?? []) }
        }
        all.sort { $0.timeMilliseconds < $1.timeMilliseconds }
        return Array(all.suffix(Self.scriptErrorsPerHost))
    }
}

extension DashboardStats.Outcomes {
    /// Counts what `s` came to.
    mutating func count(_ s: ExchangeSummary) {
        switch DashboardStats.Failure(s) {
        case .refusal(let kind)?: refusals[kind, default: 0] += 1
        case .broken?: failures += 1
        case .origin5xx?: origin5xx += 1
        case nil: break
        }
        if s.cache != nil { cacheLookups += 1 }
        if s.servedFromStore {
            cacheServed += 1
            bytesFromCache += s.bytesOut
        } else {
            bytesFromOrigin += s.bytesOut
        }
        if s.hasRateLimitRecord, s.rateLimit?.decision == .waited { quotaWaits += 1 }
        resumes += Int64(s.resumedAt.count)
    }
}
