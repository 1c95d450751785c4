import Synchronization

/// What the admin listener's live dashboard shows (`GET /`, fed by `GET /dashboard/events`):
/// totals, the last minute's latencies, and a row per host. The `metrics` monitor records
/// every finished exchange here as well as in `SluiceMetrics`.
///
/// Bounded by construction: latencies are a ring of the last `latencyWindow` exchanges, and
/// hosts beyond `maxHosts` are counted under `other` (a proxy's destinations are its clients'
/// choice).
///
/// Threading: workers record under a lock held for a few additions; the admin thread takes
/// snapshots under the same lock.
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

    private struct State {
        var requests: Int64 = 0
        var errors: Int64 = 0
        var retries: Int64 = 0
        var hosts: [String: HostRow] = [:]
        var latencies = [Int64](repeating: 0, count: DashboardStats.latencyWindow)
        var latencyCount = 0
        var latencyNext = 0
    }

    private let state = Mutex(State())

    public init() {}

    /// One finished exchange: an error is a 5xx answer or none at all (a failure before or
    /// during the response).
    public func record(host: String, status: Int, failed: Bool, retries: Int, bytesOut: Int64, totalMicroseconds: Int64?) {
        let isError = failed || status >= 500 || status == 0
        state.withLock { s in
            s.requests += 1
            if isError { s.errors += 1 }
            s.retries += Int64(retries)
            let key = s.hosts[host] != nil || s.hosts.count < Self.maxHosts ? host : "other"
            s.hosts[key, default: HostRow()].requests += 1
            if isError { s.hosts[key]!.errors += 1 }
            s.hosts[key]!.retries += Int64(retries)
            s.hosts[key]!.bytesOut += bytesOut
            if let t = totalMicroseconds, t > 0 {
                s.hosts[key]!.totalMicroseconds += t
                s.latencies[s.latencyNext] = t
                s.latencyNext = (s.latencyNext + 1) % Self.latencyWindow
                s.latencyCount = min(s.latencyCount + 1, Self.latencyWindow)
            }
        }
    }

    public func snapshot() -> Snapshot {
        let (s, recent) = state.withLock { s in (s, Array(s.latencies.prefix(s.latencyCount))) }
        let sorted = recent.sorted()
        func percentile(_ p: Double) -> Double? {
            guard !sorted.isEmpty else { return nil }
            let index = min(sorted.count - 1, Int((p * Double(sorted.count)).rounded(.up)) - 1)
            return Double(sorted[max(0, index)]) / 1000
        }
        let hosts = s.hosts.sorted { $0.value.requests != $1.value.requests ? $0.value.requests > $1.value.requests : $0.key < $1.key }
        return Snapshot(requests: s.requests, errors: s.errors, retries: s.retries,
                        p50: percentile(0.5), p90: percentile(0.9), p99: percentile(0.99),
                        hosts: hosts.map { ($0.key, $0.value) })
    }
}
