import Synchronization

/// A policy's `health:` section: when an origin's circuit opens, how long it stays open, and
/// how Sluice finds out the origin is back (`CircuitBreaker`, docs/configuration.md#health).
///
/// ```yaml
/// health: { consecutive_failures: 5, cooldown: 10s, probe: { path: /healthz, interval: 5s } }
/// ```
public struct Health: Sendable, Equatable {
    /// `5` by default.
    public static let defaultConsecutiveFailures = 5
    /// `10s` by default.
    public static let defaultCooldown = 10_000
    /// `5s` by default.
    public static let defaultProbeInterval = 5_000

    /// An active check of a half-open origin: `GET path` every `interval` until one answers
    /// below 500.
    public struct Probe: Sendable, Equatable {
        /// Origin-form, starting with `/`.
        public var path: String
        public var interval: Int
        public init(path: String, interval: Int = Health.defaultProbeInterval) {
            self.path = path
            self.interval = interval
        }
    }

    /// Connect failures or `5xx` answers in a row that open the circuit.
    public var consecutiveFailures: Int
    /// How long (ms) an open circuit fails requests fast before it lets a trial (or a probe) go.
    public var cooldown: Int
    /// nil: the first request after the cooldown is the trial.
    public var probe: Probe?

    public init(
        consecutiveFailures: Int = Health.defaultConsecutiveFailures, cooldown: Int = Health.defaultCooldown,
        probe: Probe? = nil
    ) {
        self.consecutiveFailures = consecutiveFailures
        self.cooldown = cooldown
        self.probe = probe
    }
}

/// What a try tells about its origin's health.
public enum HealthOutcome: Sendable, Equatable {
    /// The origin answered below 500.
    case success
    /// The origin could not be reached or did not answer (connect-side failures), or
    /// answered `5xx`.
    case failure
    /// The try ended without telling anything about the origin (the client left, Sluice's own
    /// refusal, a parent proxy's fault, a TLS trust decision).
    case abandoned

    /// A response head's status: `5xx` is a failure.
    public init(status: Int) { self = status >= 500 ? .failure : .success }

    /// A try's failure: the origin (or the way to it) failing counts; what is about the
    /// request, Sluice, the client or the parent proxy does not.
    public init(error: ProxyError) {
        switch error {
        case .upstreamRefused, .dnsFailure, .tlsFailure, .upstreamProtocol:
            self = .failure
        case .upstreamTimeout(_, let phase):
            switch phase {
            case .connect, .transfer, .noResponseHead: self = .failure
            case .retryDeadlinePassed, .tokenRequest: self = .abandoned
            }
        default:
            self = .abandoned
        }
    }
}

/// Every origin's `CircuitBreaker`, shared by all workers: a try to an origin whose policy has
/// `health:` asks it first, and reports how it ended.
///
/// State is per origin (scheme, host, port), created on the first try. A breaker keeps the
/// settings it was made with: a reload that changes an origin's `health:` (or removes it)
/// replaces (or drops) the breaker, which starts closed; a reload that leaves it unchanged
/// keeps its state (`reconcile`).
///
/// Threading: `Sendable`; every method takes one small lock (a dictionary lookup and a few
/// integer updates), called from any worker thread, the probe timer's worker and the admin
/// thread. Only tries to origins with `health:` take it: plain forwarding never does.
public final class UpstreamHealth: Sendable {
    /// Origins kept at most. When a new origin finds the table full, it is cut to 90 % of
    /// this: closed breakers with no failures go first, then the least recently used ones,
    /// open or not (an origin forgotten while open starts closed again). The cut costs
    /// O(n log n) once per 1,000 new origins, so clients naming endless hosts that fail (a
    /// `health:` in `policies.default`) cannot grow the table or make every try scan it.
    public static let maxOrigins = 10_000

    /// Where tries go: the breaker's key.
    public struct Origin: Sendable, Hashable, Comparable {
        public var scheme: String
        /// Lower-cased, without brackets for an IPv6 literal.
        public var host: String
        public var port: Int
        public init(scheme: String, host: String, port: Int) {
            self.scheme = scheme
            self.host = host.lowercased()
            self.port = port
        }
        /// `scheme://host:port` (an IPv6 literal in brackets): its name in logs, metrics and
        /// the admin API.
        public var name: String { "\(scheme)://\(host.contains(":") ? "[\(host)]" : host):\(port)" }
        public static func < (a: Origin, b: Origin) -> Bool { a.name < b.name }
    }

    /// A state change, for the log.
    public struct Change: Sendable, Equatable {
        public var origin: Origin
        public var from: CircuitBreaker.State
        public var to: CircuitBreaker.State
        public var consecutiveFailures: Int
    }

    /// One origin as the admin API and the metrics show it.
    public struct Status: Sendable {
        public var origin: Origin
        public var breaker: CircuitBreaker
    }

    private let breakers = Mutex<[Origin: CircuitBreaker]>([:])
    /// Circuits other instances of the fleet opened (`fleet:`), by origin name: until when
    /// (monotonic ms). Applied to the origin's breaker at its next try (this instance may not
    /// know the origin's settings before then); bounded like the table.
    private let openedElsewhere = Mutex<[String: Int]>([:])

    /// Another instance closed its circuit to the origin named `name` (its trial or probe
    /// succeeded).
    public func closedElsewhere(_ name: String) {
        openedElsewhere.withLock { table in
            guard table.count < Self.maxOrigins || table[name] != nil else { return }
            table[name] = Self.closedNews
        }
    }

    /// The news "closed" in `openedElsewhere`'s table.
    static let closedNews = -1

    /// Another instance opened its circuit to the origin named `name` for `milliseconds`.
    public func openedElsewhere(_ name: String, milliseconds: Int, now: Int) {
        openedElsewhere.withLock { table in
            if table.count >= Self.maxOrigins { table = table.filter { $0.value > now } }
            guard table.count < Self.maxOrigins else { return }
            table[name] = max(table[name] ?? 0, now + milliseconds)  // later news of opening wins over "closed"
        }
    }

    /// The news of another instance for `origin`, taken once: the end of a circuit it opened
    /// (past already, the circuit is half-open here: one trial for the fleet), `closedNews`,
    /// or nil.
    private func takeOpenedElsewhere(_ origin: Origin, now: Int) -> Int? {
        openedElsewhere.withLock { table in
            guard !table.isEmpty, let until = table.removeValue(forKey: origin.name) else { return nil }
            // News of an opening that ended long ago is stale: the circuit stays as it is here.
            if until != Self.closedNews && now > until + Self.staleNews { return nil }
            return until
        }
    }

    /// How long after an opening elsewhere ended its news still makes the circuit half-open
    /// here (its trial next), in ms.
    static let staleNews = 30_000

    public init() {}

    /// Hands `event` to `origin`'s breaker. An `.attempt` makes one with `settings` when the
    /// origin has none, or one with other settings (a reload changed them); any other event
    /// for a breaker that is gone or has other settings (a try or a probe that started before
    /// the reload) is ignored. Answers the action, the state after it, and the change of
    /// state if there was one.
    public func handle(
        _ event: CircuitBreaker.Event, for origin: Origin, settings: Health, now: Int
    )
        -> (action: CircuitBreaker.Action, state: CircuitBreaker.State, change: Change?)
    {
        breakers.withLock { table in
            let existing = table[origin]
            var breaker: CircuitBreaker
            if let existing, existing.settings == settings {
                breaker = existing
            } else {
                guard case .attempt = event else { return (.none, existing?.state ?? .closed, nil) }
                breaker = CircuitBreaker(settings: settings)
            }
            if existing == nil, table.count >= Self.maxOrigins { Self.shrink(&table) }
            if case .attempt = event, let until = takeOpenedElsewhere(origin, now: now) {
                // Not a change of this instance's (the subscriber logged it).
                let news: CircuitBreaker.Event =
                    until == Self.closedNews ? .closedElsewhere : .openedElsewhere(milliseconds: max(0, until - now))
                _ = breaker.handle(news, now: now)
            }
            let before = breaker.state
            let action = breaker.handle(event, now: now)
            table[origin] = breaker
            let change =
                before == breaker.state
                ? nil
                : Change(origin: origin, from: before, to: breaker.state, consecutiveFailures: breaker.consecutiveFailures)
            return (action, breaker.state, change)
        }
    }

    /// Cuts a full table to 90 % of `maxOrigins` (see there).
    static func shrink(_ table: inout [Origin: CircuitBreaker]) {
        let keep = Self.maxOrigins * 9 / 10
        table = table.filter { $0.value.state != .closed || $0.value.consecutiveFailures > 0 }
        guard table.count > keep else { return }
        let oldest = table.sorted { $0.value.lastUsed < $1.value.lastUsed }.prefix(table.count - keep)
        for (origin, _) in oldest { table[origin] = nil }
    }

    /// The probes due now: each origin's breaker got `.tick` (its half-open state then
    /// waits for `probeEnded`).
    public func probesDue(now: Int) -> [(origin: Origin, settings: Health, change: Change?)] {
        breakers.withLock { table in
            var due: [(Origin, Health, Change?)] = []
            for (origin, var breaker) in table where breaker.settings.probe != nil && breaker.state != .closed {
                let before = breaker.state
                guard breaker.handle(.tick, now: now) == .startProbe else {
                    if before != breaker.state { table[origin] = breaker }
                    continue
                }
                table[origin] = breaker
                let change =
                    before == breaker.state
                    ? nil
                    : Change(origin: origin, from: before, to: breaker.state, consecutiveFailures: breaker.consecutiveFailures)
                due.append((origin, breaker.settings, change))
            }
            return due
        }
    }

    /// After a reload: breakers whose origin's settings changed are dropped (the next try
    /// makes a closed one), as are those of origins without `health:` now.
    public func reconcile(_ settings: (Origin) -> Health?) {
        breakers.withLock { table in
            table = table.filter { settings($0.key) == $0.value.settings }
        }
    }

    /// `origin`'s circuit state without an event (nil: no breaker yet, i.e. closed).
    public func state(of origin: Origin) -> CircuitBreaker.State? {
        breakers.withLock { $0[origin]?.state }
    }

    /// Every origin tried since its policy got `health:`, sorted by name.
    public func statuses() -> [Status] {
        breakers.withLock { table in table.map { Status(origin: $0.key, breaker: $0.value) } }.sorted { $0.origin < $1.origin }
    }

    /// Whether any breaker waits for a probe (the probe timer's quick check).
    public var anyProbing: Bool {
        breakers.withLock { table in table.values.contains { $0.settings.probe != nil && $0.state != .closed } }
    }
}
