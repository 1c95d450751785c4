/// The dashboard's memory of the last 15 minutes: one sample a second in a ring of fixed size
/// (`capacity`, 900), each the process's totals at that second — merged across workers from
/// `DashboardStats` and the workers' live counts — so that a page opened now can draw what
/// happened before it was opened (`GET /dashboard/history`, docs/admin-api.yaml).
///
/// Beside the ring, aligned with its slots: the totals of each kind of refusal seen
/// (`ProxyError.Kind`, a column made when the kind first occurs), and per host a ring of what
/// that host's second held (`HostSample`), for at most `maxHostRings` hosts with traffic in
/// the last 15 minutes: a host gets a ring when it has requests (the busiest of the second
/// first), taking the ring of the host quiet longest once all are held (`GET /dashboard/host`).
///
/// Counters are totals since start (a rate is the difference of two samples over their time
/// apart); gauges and percentiles are the values at the sample's second; a host's samples are
/// that second's own values. Bounded by construction: the ring is `ringBytes`, each refusal
/// kind's column `capacity` × 8 bytes, each host's ring `hostRingBytes`; `memoryBytes` is
/// what is held now, `maximumBytes` what it can ever reach, whatever the traffic.
///
/// Threading: a value owned by the admin thread, which samples once a second and reads it
/// for the endpoints.
public struct DashboardHistory: Sendable {
    /// 15 minutes at one sample a second.
    public static let capacity = 900
    /// Hosts with a ring of their own at most.
    public static let maxHostRings = DashboardStats.maxHosts

    public struct Sample: Sendable, Equatable {
        /// Wall-clock milliseconds.
        public var timeMilliseconds: Int64
        public var requests: Int64
        /// Answers 5xx or none (a failure): `DashboardStats`' errors.
        public var errors: Int64
        public var retries: Int64
        public var bytesOut: Int64
        public var inFlight: Int64
        public var connections: Int64
        /// Upstream time percentiles of the recent exchanges, milliseconds (nil: none yet).
        public var p50: Double?
        public var p99: Double?
        /// `DashboardStats.Outcomes` at this second (its refusals as their total; the kinds
        /// have columns of their own).
        public var origin5xx: Int64 = 0
        public var refusals: Int64 = 0
        public var failures: Int64 = 0
        public var cacheLookups: Int64 = 0
        public var cacheServed: Int64 = 0
        public var bytesFromCache: Int64 = 0
        public var bytesFromOrigin: Int64 = 0
        public var quotaWaits: Int64 = 0
        public var resumes: Int64 = 0

        public init(
            timeMilliseconds: Int64, requests: Int64, errors: Int64, retries: Int64, bytesOut: Int64, inFlight: Int64,
            connections: Int64, p50: Double?, p99: Double?, outcomes: DashboardStats.Outcomes = .init()
        ) {
            self.timeMilliseconds = timeMilliseconds
            self.requests = requests
            self.errors = errors
            self.retries = retries
            self.bytesOut = bytesOut
            self.inFlight = inFlight
            self.connections = connections
            self.p50 = p50
            self.p99 = p99
            origin5xx = outcomes.origin5xx
            refusals = outcomes.refusalsTotal
            failures = outcomes.failures
            cacheLookups = outcomes.cacheLookups
            cacheServed = outcomes.cacheServed
            bytesFromCache = outcomes.bytesFromCache
            bytesFromOrigin = outcomes.bytesFromOrigin
            quotaWaits = outcomes.quotaWaits
            resumes = outcomes.resumes
        }
    }

    /// One second of one host: its own counts in that second (not totals), compact.
    public struct HostSample: Sendable, Equatable {
        public var requests: UInt32 = 0
        /// 5xx answers and failures, as the host's row counts them.
        public var errors: UInt32 = 0
        /// Response bytes to clients (at most 4 GiB in a second).
        public var bytesOut: UInt32 = 0
        /// The mean upstream time of the second's exchanges that went upstream, milliseconds;
        /// NaN: none did.
        public var meanMilliseconds: Float = .nan

        public init() {}
    }

    private struct HostRing {
        var samples: [HostSample]
        /// The sample number of the host's last second with a request.
        var lastActive: Int
    }

    private var ring: [Sample] = []
    /// Where the next sample goes once the ring is full.
    private var next = 0
    /// Samples appended since start.
    private var appended = 0
    private var kinds: [ProxyError.Kind: [Int64]] = [:]
    private var hosts: [String: HostRing] = [:]
    /// Each host's totals at the last sample (for the second's difference).
    private var lastHostTotals: [String: DashboardStats.HostRow] = [:]

    public init() { ring.reserveCapacity(Self.capacity) }

    /// Adds the sample of this second, replacing the oldest once 15 minutes are kept, with the
    /// refusals' totals by kind and the hosts' totals (the busiest first) at this second.
    public mutating func append(
        _ sample: Sample, refusals: [ProxyError.Kind: Int64] = [:],
        hosts rows: [(host: String, row: DashboardStats.HostRow)] = []
    ) {
        let slot = ring.count < Self.capacity ? ring.count : next
        if ring.count < Self.capacity {
            ring.append(sample)
        } else {
            ring[next] = sample
            next = (next + 1) % Self.capacity
        }
        for kind in refusals.keys where kinds[kind] == nil {
            kinds[kind] = [Int64](repeating: 0, count: Self.capacity)
        }
        var k = kinds.startIndex
        while k != kinds.endIndex {  // by index: iterating the keys while writing would copy the columns
            kinds.values[k][slot] = refusals[kinds.keys[k]] ?? 0
            kinds.formIndex(after: &k)
        }
        appendHosts(rows, slot: slot)
        appended += 1
    }

    private mutating func appendHosts(_ rows: [(host: String, row: DashboardStats.HostRow)], slot: Int) {
        // Every ring gets this slot (a quiet host's second is zero), then the hosts that moved.
        // Walked by index: iterating the keys while writing would copy every ring.
        var i = hosts.values.startIndex
        while i != hosts.values.endIndex {
            hosts.values[i].samples[slot] = HostSample()
            hosts.values.formIndex(after: &i)
        }
        var waiting: [(host: String, sample: HostSample)] = []
        for entry in rows {
            let before = lastHostTotals[entry.host] ?? DashboardStats.HostRow()
            lastHostTotals[entry.host] = entry.row
            let requests = entry.row.requests - before.requests
            guard requests > 0 else { continue }
            var s = HostSample()
            s.requests = UInt32(clamping: requests)
            s.errors = UInt32(clamping: entry.row.errors - before.errors)
            s.bytesOut = UInt32(clamping: entry.row.bytesOut - before.bytesOut)
            let timed = entry.row.timedRequests - before.timedRequests
            if timed > 0 {
                s.meanMilliseconds = Float(Double(entry.row.totalMicroseconds - before.totalMicroseconds) / Double(timed) / 1000)
            }
            if let index = hosts.index(forKey: entry.host) {
                hosts.values[index].samples[slot] = s
                hosts.values[index].lastActive = appended
            } else {
                waiting.append((entry.host, s))
            }
        }
        // Hosts without a ring get one, the busiest of this second first: a free one, or the
        // ring of the host quiet longest (not one active this second).
        for (host, s) in waiting.sorted(by: { $0.sample.requests > $1.sample.requests }) {
            if hosts.count >= Self.maxHostRings {
                guard let quietest = hosts.min(by: { $0.value.lastActive < $1.value.lastActive }),
                    quietest.value.lastActive < appended
                else { break }
                hosts[quietest.key] = nil
            }
            var ring = HostRing(samples: [HostSample](repeating: HostSample(), count: Self.capacity), lastActive: appended)
            ring.samples[slot] = s
            hosts[host] = ring
        }
        // A host quiet for the whole window has nothing to show: its ring goes.
        let quiet = hosts.filter { appended - $0.value.lastActive >= Self.capacity }.keys
        for key in quiet { hosts[key] = nil }
    }

    /// The slots in time order, oldest first.
    private var order: [Int] {
        ring.count < Self.capacity ? Array(0..<ring.count) : Array(next..<Self.capacity) + Array(0..<next)
    }

    /// The samples kept, oldest first.
    public var samples: [Sample] {
        ring.count < Self.capacity ? ring : Array(ring[next...] + ring[..<next])
    }

    /// Each refusal kind seen, with its totals at each kept sample (oldest first), by name.
    public var refusalsByKind: [(kind: ProxyError.Kind, totals: [Int64])] {
        let order = self.order
        return kinds.sorted { $0.key.rawValue < $1.key.rawValue }.map { kind, column in
            (kind, order.map { column[$0] })
        }
    }

    /// `host`'s seconds, aligned with `samples` (oldest first); nil when it has no ring (no
    /// traffic in the window, or beyond the busiest `maxHostRings`).
    public func host(_ host: String) -> [HostSample]? {
        guard let ring = hosts[host] else { return nil }
        return order.map { ring.samples[$0] }
    }

    public var count: Int { ring.count }
    public var hostRingCount: Int { hosts.count }

    /// The ring of samples once full.
    public static var ringBytes: Int { capacity * MemoryLayout<Sample>.stride }
    /// One host's ring.
    public static var hostRingBytes: Int { capacity * MemoryLayout<HostSample>.stride }
    /// What the history's arrays can ever hold: the ring, a column per refusal kind, every
    /// host ring (the tables' overhead and the hosts' last totals aside).
    public static var maximumBytes: Int {
        ringBytes + ProxyError.Kind.allCases.count * capacity * 8 + maxHostRings * hostRingBytes
    }
    /// What it holds now: the arrays' payloads (the tables' own overhead and the hosts' last
    /// totals, 48 bytes a host, aside).
    public var memoryBytes: Int {
        Self.ringBytes + kinds.count * Self.capacity * 8 + hosts.count * Self.hostRingBytes
    }
}
