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
    public static let latencyWindow = 4096

    public struct HostRow: Sendable, Equatable {
        public var requests: Int64 = 0
        public var errors: Int64 = 0
        public var retries: Int64 = 0
        public var bytesOut: Int64 = 0
        /// Sum of the last tries' durations, microseconds (for the mean).
        public var totalMicroseconds: Int64 = 0
    }

    public struct Snapshot: Sendable, Equatable {
        public var requests: Int64
        public var errors: Int64
        public var retries: Int64
        /// Percentiles of the recent exchanges' upstream time, milliseconds (nil: none yet).
        public var p50: Double?
        public var p90: Double?
        public var p99: Double?
        /// The busiest hosts first.
        public var hosts: [(host: String, row: HostRow)]

        public static func == (a: Snapshot, b: Snapshot) -> Bool {
            a.requests == b.requests && a.errors == b.errors && a.retries == b.retries && a.p50 == b.p50
                && a.p90 == b.p90 && a.p99 == b.p99 && a.hosts.map(\.host) == b.hosts.map(\.host)
                && a.hosts.map(\.row) == b.hosts.map(\.row)
        }
    }

    fileprivate struct State {
        var requests: Int64 = 0
        var errors: Int64 = 0
        var retries: Int64 = 0
        var hosts: [String: HostRow] = [:]
        var latencies = [Int64](repeating: 0, count: DashboardStats.latencyWindow)
        var latencyCount = 0
        var latencyNext = 0
    }

    /// One worker thread's part: recorded without contention (only a snapshot takes its
    /// lock from another thread), merged by `snapshot()`.
    public final class Shard: Sendable {
        fileprivate let state = Mutex(State())

        /// One finished exchange: an error is a 5xx answer or none at all (a failure before
        /// or during the response).
        public func record(
            host: String, status: Int, failed: Bool, retries: Int, bytesOut: Int64,
            totalMicroseconds: Int64?
        ) {
            let isError = failed || status >= 500 || status == 0
            state.withLock { s in
                s.requests += 1
                if isError { s.errors += 1 }
                s.retries += Int64(retries)
                let key = s.hosts[host] != nil || s.hosts.count < DashboardStats.maxHosts ? host : "other"
                s.hosts[key, default: HostRow()].requests += 1
                if isError { s.hosts[key]!.errors += 1 }
                s.hosts[key]!.retries += Int64(retries)
                s.hosts[key]!.bytesOut += bytesOut
                if let t = totalMicroseconds, t > 0 {
                    s.hosts[key]!.totalMicroseconds += t
                    s.latencies[s.latencyNext] = t
                    s.latencyNext = (s.latencyNext + 1) % DashboardStats.latencyWindow
                    s.latencyCount = min(s.latencyCount + 1, DashboardStats.latencyWindow)
                }
            }
        }
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
                for (host, row) in part.hosts {
                    s.hosts[host, default: HostRow()].requests += row.requests
                    s.hosts[host]!.errors += row.errors
                    s.hosts[host]!.retries += row.retries
                    s.hosts[host]!.bytesOut += row.bytesOut
                    s.hosts[host]!.totalMicroseconds += row.totalMicroseconds
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
            requests: s.requests, errors: s.errors, retries: s.retries,
            p50: percentile(0.5), p90: percentile(0.9), p99: percentile(0.99),
            hosts: hosts.map { ($0.key, $0.value) })
    }
}
