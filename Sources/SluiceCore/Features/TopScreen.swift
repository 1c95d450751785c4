/// What `sluice top` shows: the admin API's dashboard numbers (`GET /dashboard/data`) as a
/// terminal screen, like `varnishstat` — a summary line of rates and latencies, then one row
/// per host sorted by its request rate (docs/operations.md, "sluice top").
///
/// A value built from two consecutive samples (rates are their difference over their time
/// apart; the first screen, with no earlier sample, sorts by total requests and shows no
/// rates), rendered into lines that fit the terminal's width and height.
///
/// Threading: a value; `sluice top` builds and renders it on its one thread.
public struct TopScreen: Sendable, Equatable {
    /// One sample of `GET /dashboard/data` (the fields `top` uses).
    public struct Sample: Sendable, Equatable, Decodable {
        public struct Host: Sendable, Equatable, Decodable {
            public var host: String
            public var requests: Int64
            public var errors: Int64
            public var retries: Int64
            public var bytesOut: Int64
            public var meanMilliseconds: Double?
            enum CodingKeys: String, CodingKey {
                case host, requests, errors, retries
                case bytesOut = "bytes_out"
                case meanMilliseconds = "mean_ms"
            }
            public init(
                host: String, requests: Int64, errors: Int64 = 0, retries: Int64 = 0, bytesOut: Int64 = 0,
                meanMilliseconds: Double? = nil
            ) {
                self.host = host
                self.requests = requests
                self.errors = errors
                self.retries = retries
                self.bytesOut = bytesOut
                self.meanMilliseconds = meanMilliseconds
            }
        }
        public var timeMilliseconds: Int64
        public var configurationGeneration: Int
        public var requests: Int64
        public var errors: Int64
        public var retries: Int64
        public var inFlight: Int
        public var connections: Int
        public var p50: Double?
        public var p90: Double?
        public var p99: Double?
        public var recording: Bool
        public var hosts: [Host]
        enum CodingKeys: String, CodingKey {
            case requests, errors, retries, connections, recording, hosts
            case timeMilliseconds = "time_ms"
            case configurationGeneration = "configuration_generation"
            case inFlight = "in_flight"
            case p50 = "p50_ms"
            case p90 = "p90_ms"
            case p99 = "p99_ms"
        }
        public init(
            timeMilliseconds: Int64, configurationGeneration: Int = 1, requests: Int64, errors: Int64 = 0, retries: Int64 = 0,
            inFlight: Int = 0, connections: Int = 0, p50: Double? = nil, p90: Double? = nil, p99: Double? = nil,
            recording: Bool = true, hosts: [Host]
        ) {
            self.timeMilliseconds = timeMilliseconds
            self.configurationGeneration = configurationGeneration
            self.requests = requests
            self.errors = errors
            self.retries = retries
            self.inFlight = inFlight
            self.connections = connections
            self.p50 = p50
            self.p90 = p90
            self.p99 = p99
            self.recording = recording
            self.hosts = hosts
        }
    }

    /// One host's row: its totals and, with an earlier sample, its rate.
    public struct Row: Sendable, Equatable {
        public var host: String
        public var rate: Double?
        public var requests: Int64
        public var errors: Int64
        public var retries: Int64
        public var meanMilliseconds: Double?
        public var bytesOut: Int64
    }

    /// The admin API sends the busiest this many hosts: a host missing from a full earlier
    /// sample may have been just below them, so its rate is unknown (not its whole total).
    public static let hostRowsSent = 50

    public let source: String
    public let sample: Sample
    /// Requests, errors and retries per second since the earlier sample (nil on the first).
    public let rate: Double?
    public let errorShare: Double?
    public let retryRate: Double?
    /// Busiest first: by rate, then by total requests, then by name.
    public let rows: [Row]

    /// `source`: where the numbers come from (the admin address), for the title line.
    public init(source: String, sample: Sample, previous: Sample?) {
        self.source = source
        self.sample = sample
        let seconds = previous.map { Double(sample.timeMilliseconds - $0.timeMilliseconds) / 1000 } ?? 0
        let earlier = seconds > 0 ? previous : nil
        if let earlier {
            let requests = Double(sample.requests - earlier.requests)
            rate = max(0, requests / seconds)
            errorShare = requests > 0 ? Double(sample.errors - earlier.errors) / requests : 0
            retryRate = max(0, Double(sample.retries - earlier.retries) / seconds)
        } else {
            (rate, errorShare, retryRate) = (nil, nil, nil)
        }
        let before = Dictionary(earlier?.hosts.map { ($0.host, $0.requests) } ?? [], uniquingKeysWith: { a, _ in a })
        let earlierFull = (earlier?.hosts.count ?? 0) >= Self.hostRowsSent
        rows = sample.hosts.map { h in
            let rate: Double?
            if earlier == nil {
                rate = nil
            } else if let was = before[h.host] {
                rate = max(0, Double(h.requests - was) / seconds)
            } else {
                rate = earlierFull ? nil : Double(h.requests) / seconds
            }
            return Row(
                host: h.host, rate: rate,
                requests: h.requests, errors: h.errors, retries: h.retries, meanMilliseconds: h.meanMilliseconds,
                bytesOut: h.bytesOut)
        }.sorted { a, b in
            if (a.rate ?? 0) != (b.rate ?? 0) { return (a.rate ?? 0) > (b.rate ?? 0) }
            if a.requests != b.requests { return a.requests > b.requests }
            return a.host < b.host
        }
    }

    /// The screen as lines of at most `width` characters, at most `height` lines (the
    /// host rows that do not fit are counted on the last line). `clock`: the title's time.
    public func render(width: Int, height: Int, clock: String) -> [String] {
        let width = max(width, 40)
        var lines: [String] = []
        lines.append("sluice top — \(source) — generation \(sample.configurationGeneration) — \(clock)   (q quits)")
        lines.append(
            "req/s \(Self.number(rate, 1))   errors \(errorShare.map { Self.number($0 * 100, 1) + " %" } ?? "–")"
                + "   retries/s \(Self.number(retryRate, 1))   in flight \(sample.inFlight)"
                + "   connections \(sample.connections)   total \(sample.requests)")
        lines.append(
            "upstream ms: p50 \(Self.number(sample.p50, 2))   p90 \(Self.number(sample.p90, 2))   p99 \(Self.number(sample.p99, 2))"
        )
        if !sample.recording {
            lines.append("the metrics monitor is not configured: only in flight and connections move")
        }
        lines.append("")
        let hostWidth = max(12, min(40, width - 62))
        lines.append(
            Self.pad("HOST", hostWidth) + Self.right("REQ/S", 9) + Self.right("REQUESTS", 11) + Self.right("ERRORS", 9)
                + Self.right("RETRIES", 9) + Self.right("MEAN MS", 10) + Self.right("BYTES OUT", 12))
        let room = max(0, height - lines.count)
        for row in rows.prefix(rows.count > room ? max(0, room - 1) : room) {
            lines.append(
                Self.pad(row.host, hostWidth) + Self.right(Self.number(row.rate, 1), 9) + Self.right(String(row.requests), 11)
                    + Self.right(String(row.errors), 9) + Self.right(String(row.retries), 9)
                    + Self.right(Self.number(row.meanMilliseconds, 2), 10) + Self.right(String(row.bytesOut), 12))
        }
        if rows.count > room { lines.append("… \(rows.count - max(0, room - 1)) more host(s)") }
        return lines.map { String($0.prefix(width)) }
    }

    static func number(_ value: Double?, _ digits: Int) -> String {
        guard let value, value.isFinite else { return "–" }
        var scale = 1.0
        for _ in 0..<digits { scale *= 10 }
        let scaled = (value * scale).rounded()
        let whole = Int64(scaled / scale)
        guard digits > 0 else { return String(whole) }
        var fraction = String(Int64(abs(scaled)) % Int64(scale))
        while fraction.count < digits { fraction = "0" + fraction }
        return (value < 0 && whole == 0 ? "-" : "") + String(whole) + "." + fraction
    }

    private static func pad(_ text: String, _ width: Int) -> String {
        let cut = text.count > width - 1 ? String(text.prefix(width - 2)) + "…" : text
        return cut + String(repeating: " ", count: max(1, width - cut.count))
    }

    private static func right(_ text: String, _ width: Int) -> String {
        String(repeating: " ", count: max(1, width - text.count)) + text
    }
}
