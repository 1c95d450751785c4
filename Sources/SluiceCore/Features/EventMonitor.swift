import HTTPTypes

/// Timings of one upstream try, from libcurl, in microseconds since the try started.
public struct TryTimings: Sendable, Equatable {
    public var dns: Int64 = 0
    public var connect: Int64 = 0
    public var tls: Int64 = 0
    public var firstByte: Int64 = 0
    public var total: Int64 = 0
    /// The HTTP version the try spoke to the origin (nil when none was: no connection, or
    /// one that failed before a request went out).
    public var httpVersion: UpstreamHTTPVersion?
    /// The try opened a connection of its own; false when it reused a pooled one or ran as
    /// one more HTTP/2 stream on an open connection.
    public var newConnection = false
    /// The transport the try ran on (`UpstreamEngine.choose`); nil when no try ran.
    public var engine: UpstreamEngine?
    public init() {}
}

/// An upstream try's HTTP version, as the access log names it (`upstream_protocol`).
///
/// Threading: a value, read from libcurl on the try's worker thread and carried in events.
public enum UpstreamHTTPVersion: String, Sendable, Equatable, CaseIterable {
    case http1_0 = "HTTP/1.0"
    case http1_1 = "HTTP/1.1"
    case http2 = "HTTP/2"
}

/// How an exchange ended.
public enum Outcome: String, Sendable {
    case ok
    case error
    case clientAborted = "client_aborted"
    case upstreamAborted = "upstream_aborted"
    case tunnel
    /// A CONNECT answered with Sluice's own TLS: its requests have lines of their own.
    case intercepted
}

/// What is known about an exchange when it ends: everything an access log line needs.
public struct ExchangeSummary: Sendable {
    public var id: UInt64
    public var client: String
    /// The proxy user (`access.proxy_auth`) the request authenticated as; nil without one.
    public var user: String?
    /// The `X-Request-Id` the exchange carries upstream: the client's own, or one Sluice made.
    public var requestId: String?
    /// The host the policy was matched for (the dashboard's rows).
    public var host = ""
    public var method: String
    public var url: String
    public var policy: String
    public var status: Int
    public var bytesIn: Int64
    public var bytesOut: Int64
    public var attempts: Int
    public var redirects: Int
    public var timings: TryTimings?
    public var outcome: Outcome
    public var error: String?
    /// The last `lua` hook the exchange ran (`LuaCallRecord`), for the access log's `lua`.
    public var lua: LuaCallRecord?
    /// Every retry scheduled, in order.
    public var retries: [RetryRecord] = []
    /// Why a retriable failure was not retried (`limit`, `budget`, `deadline`, `method`, `buffer_limit`).
    public var retryStopped: RetryStopReason?
    /// The last validation failure, if any.
    public var validation: String?
    /// The trust evaluator that refused the origin's certificate, and why.
    public var trustFailure: (evaluator: String, reason: String)? {
        get { trustFailureBox?.value }
        set { trustFailureBox = newValue.map { Box($0) } }
    }
    /// What the policy's `rate_limit` did with the exchange's tries (nil: it has none).
    public var rateLimit: RateLimitRecord? {
        get { rateLimitBox?.value }
        set { rateLimitBox = newValue.map { $0 == .allowed ? RateLimitRecord.allowedBox : Box($0) } }
    }
    /// Whether `rateLimit` is set (without copying it out).
    public var hasRateLimitRecord: Bool { rateLimitBox != nil }
    /// Whether `trustFailure` is set (without copying it out).
    public var hasTrustFailure: Bool { trustFailureBox != nil }
    // Rare fields live boxed: an exchange (which holds its summary) stays within malloc's
    // per-thread cache, and the plain path allocates nothing for them.
    private var trustFailureBox: Box<(evaluator: String, reason: String)>?
    private var rateLimitBox: Box<RateLimitRecord>?
    /// The request went to its origin over TLS without verification (`trust: disabled`).
    public var insecure = false
    /// The body offsets at which a broken download was resumed and carried on (`Resume`).
    public var resumedAt: [Int64] = []
    /// Which of Sluice's own answers ended the exchange (a `ProxyError`'s case); nil when the
    /// response was the origin's or the cache's, or when it broke after it started.
    public var errorKind: ProxyError.Kind?
    /// The response (its body) came from the shared cache: a hit, or a stored response
    /// revalidated (304) or served stale on an origin's error.
    public var servedFromStore = false
    /// The state of the origin's circuit (`health:`) after the exchange's last try was asked
    /// or ended (`closed`, `open`, `half_open`); nil when the host has no `health:`.
    public var circuit: String?
    /// What the shared cache did (the `Cache-Status` parameters without the cache's name:
    /// `hit`, `fwd=uri-miss;stored`, …); nil when no `cache_store` is configured.
    public var cache: String?

}

// The initialisers live in an extension, so that Swift still makes the memberwise one: an
// explicit `init` body (Swift 6.3.1, -O) builds the struct in a local and copies it out,
// a retain and a release for each of its references (16), where the memberwise initialiser
// writes the fields where the result goes.
extension ExchangeSummary {
    public init(
        id: UInt64, client: String, method: String, url: String, policy: String, requestId: String? = nil,
        host: String = ""
    ) {
        self = .starting(
            id: id, client: client, method: method, url: url, policy: policy, requestId: requestId, host: host)
    }

    /// The summary an exchange begins with (admission): its fields moved in, not copied.
    public static func starting(
        id: UInt64, client: consuming String, method: consuming String, url: consuming String,
        policy: consuming String, requestId: consuming String?, host: consuming String
    ) -> ExchangeSummary {
        ExchangeSummary(
            id: id, client: client, requestId: requestId, host: host, method: method, url: url, policy: policy,
            status: 0, bytesIn: 0, bytesOut: 0, attempts: 0, redirects: 0, outcome: .ok)
    }
}

/// An immutable value on the heap, for a rare field of a watched-size struct.
public final class Box<Value: Sendable>: Sendable {
    public let value: Value
    public init(_ value: Value) { self.value = value }
}

/// What `rate_limit` did with an exchange (the access log's `rate_limit`): its tries went at
/// once (`allowed`), waited `waitedMilliseconds` in all (`waited`), or one was refused with
/// 429 (`rejected`); `limit` names what held it back (`50/s`, `max_concurrent 4`, or the
/// origin's own limit and where it was read).
public struct RateLimitRecord: Sendable, Equatable {
    public enum Decision: String, Sendable {
        case allowed, waited, rejected
    }
    public var decision: Decision
    public var waitedMilliseconds: Int
    public var limit: String

    public init(decision: Decision, waitedMilliseconds: Int = 0, limit: String = "") {
        self.decision = decision
        self.waitedMilliseconds = waitedMilliseconds
        self.limit = limit
    }

    public static let allowed = RateLimitRecord(decision: .allowed)
    static let allowedBox = Box(allowed)
}

public struct RetryRecord: Sendable, Equatable {
    public var attempt: Int
    public var delayMilliseconds: Int
    public var reason: String
    public init(attempt: Int, delayMilliseconds: Int, reason: String) {
        self.attempt = attempt
        self.delayMilliseconds = delayMilliseconds
        self.reason = reason
    }
}

/// Every step of the pipeline, as monitors see it (Alamofire's `EventMonitor` callbacks,
/// as one enum so a monitor can switch over the ones it cares about).
public enum ProxyEvent: Sendable {
    /// A request head arrived and matched `policy`.
    ///
    /// `indirect` (as `adaptationFailed`, `tryStarted`, `finished` and `tunnelClosed`): an event
    /// is as large as its largest inline case, and events travel by value inside the exchange
    /// machine's reports, which every step of every exchange returns. Boxed, these cases cost
    /// an allocation only when a monitor asks for them, and an event is 59 bytes, not 97.
    indirect case requestReceived(id: UInt64, client: String, method: String, url: String, policy: String)
    /// Every adapter ran; `adapters` lists their names in order.
    case requestAdapted(id: UInt64, adapters: [String])
    indirect case adaptationFailed(id: UInt64, error: AdaptationError)
    /// An upstream try starts (Alamofire's "resumed"): the request exactly as sent.
    indirect case tryStarted(id: UInt64, attempt: Int, request: ProxyRequest)
    case metricsCollected(id: UInt64, attempt: Int, timings: TryTimings)
    /// The upstream's response head for a try.
    case responseReceived(id: UInt64, attempt: Int, status: Int)
    case redirectFollowed(id: UInt64, status: Int, location: String, hop: Int)
    /// A try failed (or failed validation) and another is scheduled after a delay.
    case retrying(id: UInt64, record: RetryRecord)
    /// A retriable failure will not be retried; `reason` says why (`limit`, `budget`, …).
    case retryStopped(id: UInt64, reason: RetryStopReason)
    /// A credential (an OAuth token) was fetched or refreshed; `source` names the token URL.
    case credentialRefreshed(source: String)
    case credentialRefreshFailed(source: String, reason: String)
    /// `indirect` (and `tunnelClosed`): a summary is four times the size of every other
    /// event, and events travel inside the exchange machine's actions by value; boxed, an
    /// action is 88 bytes instead of 328, and the copies on every request shrink with it.
    indirect case finished(ExchangeSummary)
    /// The origin's certificate failed the host's trust evaluator (the try ends with 502).
    case trustFailed(id: UInt64, host: String, evaluator: String, reason: String)
    case tunnelOpened(id: UInt64, client: String, authority: String)
    indirect case tunnelClosed(ExchangeSummary)
    case configReloaded(success: Bool, message: String)
    /// What the shared cache did for an exchange (`docs/caching.md`).
    case cache(id: UInt64, event: CacheEvent)
}

/// A step of the shared cache, for monitors.
///
/// Threading: a value; reported on the worker's thread that runs the exchange.
public enum CacheEvent: Sendable, Equatable {
    /// A request was looked up (only with a `cache_store`, for a policy that caches).
    case lookup(url: String)
    /// Answered from the cache: `age` seconds old; `notModified` when the answer was `304`.
    case hit(age: Int64, notModified: Bool)
    /// Forwarded; `reason` is the `Cache-Status` `fwd` value (`uri-miss`, `stale`, …).
    case miss(reason: String)
    /// A response was stored whole (`bytes` of body).
    case stored(bytes: Int)
    /// A conditional request (the stored response's validators) got the origin's answer:
    /// `304` updated the stored response; another status replaced (or dropped) it. Not
    /// reported for a stored response without validators fetched again whole, nor when the
    /// try got no answer.
    case revalidated(status: Int)
    /// Storing evicted this many least recently used objects.
    case evicted(count: Int)
    /// An unsafe method's response invalidated this many stored objects.
    case invalidated(count: Int)
}

extension ProxyEvent {
    /// Kinds of events, for a monitor to say which ones it reads (`EventMonitor.events`): the
    /// engine does not build the others (an access log that reads `.finished` alone costs one
    /// event per exchange, not six).
    public struct Kinds: OptionSet, Sendable {
        public let rawValue: UInt32
        public init(rawValue: UInt32) { self.rawValue = rawValue }
        public static let requestReceived = Kinds(rawValue: 1 << 0)
        public static let requestAdapted = Kinds(rawValue: 1 << 1)
        public static let adaptationFailed = Kinds(rawValue: 1 << 2)
        public static let tryStarted = Kinds(rawValue: 1 << 3)
        public static let metricsCollected = Kinds(rawValue: 1 << 4)
        public static let responseReceived = Kinds(rawValue: 1 << 5)
        public static let redirectFollowed = Kinds(rawValue: 1 << 6)
        public static let retrying = Kinds(rawValue: 1 << 7)
        public static let retryStopped = Kinds(rawValue: 1 << 8)
        public static let credentialRefreshed = Kinds(rawValue: 1 << 9)
        public static let credentialRefreshFailed = Kinds(rawValue: 1 << 10)
        public static let finished = Kinds(rawValue: 1 << 11)
        public static let trustFailed = Kinds(rawValue: 1 << 12)
        public static let tunnelOpened = Kinds(rawValue: 1 << 13)
        public static let tunnelClosed = Kinds(rawValue: 1 << 14)
        public static let configReloaded = Kinds(rawValue: 1 << 15)
        public static let cache = Kinds(rawValue: 1 << 16)
        public static let all = Kinds(rawValue: .max)

        /// The kind of the event that reports an exchange's end with `outcome`: a tunnel's
        /// close, or any other exchange's finish.
        public static func ended(_ outcome: Outcome) -> Kinds { outcome == .tunnel ? .tunnelClosed : .finished }
    }

    /// The event that reports the end of the exchange `summary` records (`Kinds.ended`).
    public static func ended(_ summary: ExchangeSummary) -> ProxyEvent {
        summary.outcome == .tunnel ? .tunnelClosed(summary) : .finished(summary)
    }

    /// This event's kind.
    public var kind: Kinds {
        switch self {
        case .requestReceived: return .requestReceived
        case .requestAdapted: return .requestAdapted
        case .adaptationFailed: return .adaptationFailed
        case .tryStarted: return .tryStarted
        case .metricsCollected: return .metricsCollected
        case .responseReceived: return .responseReceived
        case .redirectFollowed: return .redirectFollowed
        case .retrying: return .retrying
        case .retryStopped: return .retryStopped
        case .credentialRefreshed: return .credentialRefreshed
        case .credentialRefreshFailed: return .credentialRefreshFailed
        case .finished: return .finished
        case .trustFailed: return .trustFailed
        case .tunnelOpened: return .tunnelOpened
        case .tunnelClosed: return .tunnelClosed
        case .configReloaded: return .configReloaded
        case .cache: return .cache
        }
    }
}

/// Observes the pipeline. Called on the worker thread that runs the exchange, in event order;
/// an implementation must be quick and must not block (buffer and hand I/O to another thread,
/// as `AccessLogMonitor` does).
public protocol EventMonitor: AnyObject {
    func handle(_ event: ProxyEvent)
    /// Whether this monitor reads the request in `.tryStarted` (headers as sent). Building
    /// that request costs allocations on every request, so Sluice does it only when an
    /// adapter (other than a fixed header edit), a redirect rule or a monitor that says `true`
    /// needs it. `false` by default; without it, `.tryStarted` is not sent for requests whose
    /// adapters are none or only fixed header edits.
    var wantsRequestDetails: Bool { get }
    /// The kinds of events this monitor reads; the engine may leave the others out (it never
    /// builds an event no monitor reads). All of them by default.
    var events: ProxyEvent.Kinds { get }
    /// Whether this monitor reads `ExchangeSummary.lua` for script calls that succeeded and
    /// left no `ctx.vars` (the metrics count every call; the access log shows only failed
    /// calls and `ctx.vars`). Without such a monitor, scripts run on a request's header lines
    /// record no such call (a record cost some 500 instructions a request). True by default:
    /// a monitor of a library's user may read them.
    var readsEveryScriptCall: Bool { get }
    /// An exchange ended: `summary` is its record, lent for the call — `.finished`, or
    /// `.tunnelClosed` when its `outcome` is `.tunnel`. The default hands that event to
    /// `handle` (when `events` has its kind), with a copy of the record in it; a monitor that
    /// implements this reads the record where it lies, which spares every request a copy of
    /// it into the event and another out of it (some 2,000 instructions).
    func exchangeEnded(_ summary: ExchangeSummary)
}

extension EventMonitor {
    public var wantsRequestDetails: Bool { false }
    public var events: ProxyEvent.Kinds { .all }
    public var readsEveryScriptCall: Bool { true }
    public func exchangeEnded(_ summary: ExchangeSummary) {
        guard events.contains(.ended(summary.outcome)) else { return }
        handle(.ended(summary))
    }
}

/// Fans each event out to several monitors, in order.
public final class CompositeEventMonitor: EventMonitor {
    public let monitors: [any EventMonitor]
    public let wantsRequestDetails: Bool
    public let events: ProxyEvent.Kinds
    public let readsEveryScriptCall: Bool
    public init(_ monitors: [any EventMonitor]) {
        self.monitors = monitors
        wantsRequestDetails = monitors.contains { $0.wantsRequestDetails }
        events = monitors.reduce(into: []) { $0.formUnion($1.events) }
        readsEveryScriptCall = monitors.contains { $0.readsEveryScriptCall }
    }
    /// Each monitor gets the kinds it reads.
    public func handle(_ event: ProxyEvent) {
        let kind = event.kind
        for monitor in monitors where monitor.events.contains(kind) { monitor.handle(event) }
    }
    /// Each monitor that reads the record's kind gets it lent in turn.
    public func exchangeEnded(_ summary: ExchangeSummary) {
        let kind = ProxyEvent.Kinds.ended(summary.outcome)
        for monitor in monitors where monitor.events.contains(kind) { monitor.exchangeEnded(summary) }
    }
}

/// Makes one monitor instance per worker, so a monitor's state (a log buffer) is owned by a
/// single thread and needs no lock on the hot path.
public protocol EventMonitorFactory: Sendable {
    /// A short description for `sluice check` (e.g. `access_log (stdout)`).
    var summary: String { get }
    func makeMonitor() -> any EventMonitor
}

/// A factory that hands every worker the same monitor object — for monitors that are
/// thread-safe by construction (a library user's inspector with its own lock).
public struct SharedMonitorFactory: EventMonitorFactory {
    public let summary: String
    private let box: Box
    final class Box: @unchecked Sendable {
        // @unchecked: the caller promises the monitor is thread-safe (see init).
        let monitor: any EventMonitor
        init(_ m: any EventMonitor) { monitor = m }
    }
    /// `monitor` must be safe to call from every worker thread.
    public init(_ monitor: any EventMonitor, summary: String = "custom") {
        box = Box(monitor)
        self.summary = summary
    }
    public func makeMonitor() -> any EventMonitor { box.monitor }
}
