/// The dashboard's memory of the last 15 minutes: one sample a second in a ring of fixed size
/// (`capacity`, 900), each the process's totals at that second — merged across workers from
/// `DashboardStats` and the workers' live counts — so that a page opened now can draw what
/// happened before it was opened (`GET /dashboard/history`, docs/admin-api.yaml).
///
/// Counters are totals since start (a rate is the difference of two samples over their time
/// apart); gauges and percentiles are the values at the sample's second. Bounded by
/// construction: `memoryBytes` is the ring's whole size (about 80 KB), whatever the traffic.
///
/// Threading: a value owned by the admin thread, which samples once a second and reads it
/// for the endpoint.
public struct DashboardHistory: Sendable {
    /// 15 minutes at one sample a second.
    public static let capacity = 900

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

        public init(
            timeMilliseconds: Int64, requests: Int64, errors: Int64, retries: Int64, bytesOut: Int64, inFlight: Int64,
            connections: Int64, p50: Double?, p99: Double?
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
        }
    }

    private var ring: [Sample] = []
    /// Where the next sample goes once the ring is full.
    private var next = 0

    public init() { ring.reserveCapacity(Self.capacity) }

    /// Adds the sample of this second, replacing the oldest once 15 minutes are kept.
    public mutating func append(_ sample: Sample) {
        if ring.count < Self.capacity {
            ring.append(sample)
        } else {
            ring[next] = sample
            next = (next + 1) % Self.capacity
        }
    }

    /// The samples kept, oldest first.
    public var samples: [Sample] {
        ring.count < Self.capacity ? ring : Array(ring[next...] + ring[..<next])
    }

    public var count: Int { ring.count }

    /// The ring's memory once full: what the dashboard's history costs, whatever the traffic.
    public static var memoryBytes: Int { capacity * MemoryLayout<Sample>.stride }
}
