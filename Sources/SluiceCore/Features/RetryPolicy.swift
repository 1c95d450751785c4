import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// The `retry` policy (Alamofire's `RetryPolicy`): exponential backoff with a cap and
/// optional jitter, idempotent methods, retryable statuses and transport failures, and
/// `Retry-After`. Deadline, budget and body buffering are enforced by `ExchangeMachine`, which
/// knows time, traffic and the body; their settings live here so one YAML section holds all.
public struct RetryPolicy: RequestRetrier, Equatable {
    public enum Jitter: String, Sendable {
        /// Exactly base^n × scale (Alamofire's behaviour). The default.
        case none
        /// Uniformly random in [0, delay] ("full jitter").
        case full
        /// delay/2 plus a uniformly random [0, delay/2] ("equal jitter").
        case equal
    }

    /// `2`, as Alamofire.
    public static let defaultRetryLimit = 2
    /// `2`, as Alamofire.
    public static let defaultExponentialBackoffBase = 2
    /// `500` ms, as Alamofire's 0.5 s.
    public static let defaultExponentialBackoffScale = 500
    /// `30 s`: no single wait is longer, whatever the formula or `Retry-After` says.
    public static let defaultMaxDelay = 30_000
    /// DELETE, GET, HEAD, OPTIONS, PUT, TRACE: Alamofire's idempotent methods.
    public static let defaultRetryableMethods: Set<String> = ["DELETE", "GET", "HEAD", "OPTIONS", "PUT", "TRACE"]

    /// Whether `method` is one of `defaultRetryableMethods`, without hashing it: every try
    /// asks (whether a reused connection's failure may be resent), and a `switch` of short
    /// literals compares a GET's inline bytes once.
    @inlinable
    public static func isDefaultRetryable(_ method: String) -> Bool {
        switch method {
        case "GET", "HEAD", "PUT", "DELETE", "OPTIONS", "TRACE": true
        default: false
        }
    }
    /// 408, 500, 502, 503, 504, as Alamofire.
    public static let defaultRetryableStatusCodes: Set<Int> = [408, 500, 502, 503, 504]
    /// Every transport kind Alamofire's retryable URL errors map to.
    public static let defaultRetryableErrors: Set<TransportErrorKind> = [.refused, .dns, .timeout, .reset, .tls]
    /// Retries may be at most 20 % of a host's requests per second, or 3 per second.
    public static let defaultBudget: RetryBudget.Limits? = RetryBudget.Limits(ratio: 0.2, minPerSecond: 3)
    /// `1 MiB`: bodies up to this are kept for replay.
    public static let defaultBufferLimit = 1 << 20

    public var name: String { "retry" }
    public var limit: Int
    public var base: Int
    public var scale: Int
    public var maxDelay: Int
    public var jitter: Jitter
    public var methods: Set<String>
    public var statuses: Set<Int>
    public var errors: Set<TransportErrorKind>
    /// Honour `Retry-After` on 429 and 503. `true` by default.
    public var retryAfter: Bool
    /// Start of a try → response head, in ms; nil means `timeouts.upstream_per_try`.
    public var perTryTimeout: Int?
    /// All tries together, in ms; nil means no deadline.
    public var deadline: Int?
    public var budget: RetryBudget.Limits?
    public var bufferLimit: Int

    public init(
        limit: Int = Self.defaultRetryLimit, base: Int = Self.defaultExponentialBackoffBase,
        scale: Int = Self.defaultExponentialBackoffScale, maxDelay: Int = Self.defaultMaxDelay,
        jitter: Jitter = .none, methods: Set<String> = Self.defaultRetryableMethods,
        statuses: Set<Int> = Self.defaultRetryableStatusCodes,
        errors: Set<TransportErrorKind> = Self.defaultRetryableErrors, retryAfter: Bool = true,
        perTryTimeout: Int? = nil, deadline: Int? = nil, budget: RetryBudget.Limits? = Self.defaultBudget,
        bufferLimit: Int = Self.defaultBufferLimit
    ) {
        self.limit = limit
        self.base = base
        self.scale = scale
        self.maxDelay = maxDelay
        self.jitter = jitter
        self.methods = methods
        self.statuses = statuses
        self.errors = errors
        self.retryAfter = retryAfter
        self.perTryTimeout = perTryTimeout
        self.deadline = deadline
        self.budget = budget
        self.bufferLimit = bufferLimit
    }

    /// Whether a try that failed this way may be retried at all (method, status, error kind),
    /// before counting attempts.
    public func isRetryable(method: String, failure: TryFailure) -> Bool {
        methods.contains(method) && isRetryable(failure)
    }

    /// Whether the failure itself is one this policy retries (whatever the method).
    public func isRetryable(_ failure: TryFailure) -> Bool {
        switch failure {
        case .transport(let kind, _): return errors.contains(kind)
        case .status(let code, _): return statuses.contains(code)
        case .validation, .script: return true
        }
    }

    /// The wait before retry number `attempt` (0-based), before jitter: base^attempt × scale,
    /// capped by `maxDelay`.
    public func backoff(attempt: Int) -> Int {
        var delay = Double(scale)
        for _ in 0..<attempt { delay *= Double(base) }
        return Int(min(delay, Double(maxDelay)))
    }

    public func retry(
        _ request: ProxyRequest, dueTo failure: TryFailure, attempt: Int,
        completion: @escaping (RetryResult) -> Void
    ) {
        var random = SystemRandomNumberGenerator()
        completion(decision(method: request.method, failure: failure, attempt: attempt, using: &random))
    }

    public func retry(
        _ request: ProxyRequest, dueTo failure: TryFailure, attempt: Int,
        using random: inout any RandomNumberGenerator, completion: @escaping (RetryResult) -> Void
    ) {
        completion(decision(method: request.method, failure: failure, attempt: attempt, using: &random))
    }

    /// The policy's answer for retry number `attempt` (0-based) of a `method` request that
    /// failed with `failure`: `.doNotRetry` for a failure it does not retry, a stop reason for
    /// one it does (`method`, `limit`), else the delay: `Retry-After` on 429 and 503 when
    /// honoured, else the backoff with jitter drawn from `random`; capped by `maxDelay`.
    public func decision<Random: RandomNumberGenerator>(
        method: String, failure: TryFailure, attempt: Int,
        using random: inout Random
    ) -> RetryResult {
        guard isRetryable(failure) else { return .doNotRetry }
        guard methods.contains(method) else { return .doNotRetryWithError(.method) }
        guard attempt < limit else { return .doNotRetryWithError(.limit) }
        if retryAfter, case .status(let code, let after?) = failure, code == 429 || code == 503 {
            return .retryWithDelay(milliseconds: min(after, maxDelay))
        }
        let delay = backoff(attempt: attempt)
        switch jitter {
        case .none: return .retryWithDelay(milliseconds: delay)
        case .full: return .retryWithDelay(milliseconds: Int.random(in: 0...max(0, delay), using: &random))
        case .equal: return .retryWithDelay(milliseconds: delay / 2 + Int.random(in: 0...max(0, delay / 2), using: &random))
        }
    }
}

/// The retry budgets of one policy, one per host (created on first use), shared by every
/// worker. Bounded: past `maxHosts` distinct hosts the table starts afresh.
public final class RetryBudgets: Sendable {
    public static let maxHosts = 10_000
    public let limits: RetryBudget.Limits
    private let budgets = Mutex<[String: RetryBudget]>([:])

    public init(limits: RetryBudget.Limits) { self.limits = limits }

    public func budget(for host: String) -> RetryBudget {
        budgets.withLock { table in
            if let budget = table[host] { return budget }
            if table.count >= Self.maxHosts { table.removeAll() }
            let budget = RetryBudget(limits: limits)
            table[host] = budget
            return budget
        }
    }
}

/// A retry budget shared by every worker for one host: in any one-second window,
/// retries started may be at most max(`minPerSecond`, `ratio` × requests started), so a
/// failing origin is not hit by a retry storm. One small lock per request and per retry.
public final class RetryBudget: Sendable {
    public struct Limits: Sendable, Equatable {
        public var ratio: Double
        public var minPerSecond: Int
        public init(ratio: Double, minPerSecond: Int) {
            self.ratio = ratio
            self.minPerSecond = minPerSecond
        }
    }

    struct Window {
        var second: Int = 0
        var requests = 0
        var retries = 0
    }

    public let limits: Limits
    private let window = Mutex(Window())

    public init(limits: Limits) { self.limits = limits }

    /// Counts a request started at `now` (ms on the monotonic clock).
    public func recordRequest(now: Int = MonotonicClock.milliseconds()) {
        let second = now / 1000
        window.withLock { w in
            if w.second != second { w = Window(second: second) }
            w.requests += 1
        }
    }

    /// Takes one retry from the budget at `now` (ms on the monotonic clock); false when the
    /// budget is spent.
    public func tryAcquireRetry(now: Int = MonotonicClock.milliseconds()) -> Bool {
        let second = now / 1000
        return window.withLock { w in
            if w.second != second { w = Window(second: second) }
            let allowed = max(limits.minPerSecond, Int(limits.ratio * Double(w.requests)))
            guard w.retries < allowed else { return false }
            w.retries += 1
            return true
        }
    }
}

/// The `validate` section: acceptable statuses and content types (Alamofire's `validate()`).
public struct ResponseValidator: Sendable, Equatable {
    public var statuses: [ClosedRange<Int>]
    /// `type/subtype` or `type/*`; empty means any content type.
    public var contentTypes: [String]

    public init(statuses: [ClosedRange<Int>] = [200...299], contentTypes: [String] = []) {
        self.statuses = statuses
        self.contentTypes = contentTypes
    }

    /// nil when the response is acceptable, else why not.
    public func validate(status: Int, contentType: String?) -> String? {
        if !statuses.isEmpty, !statuses.contains(where: { $0.contains(status) }) {
            return "status \(status) is not acceptable"
        }
        guard !contentTypes.isEmpty else { return nil }
        guard let contentType else { return "no Content-Type (expected \(contentTypes.joined(separator: ", ")))" }
        let mime = contentType.split(separator: ";").first.map { $0.trimmingCharacters() }?.lowercased() ?? ""
        for accepted in contentTypes {
            let a = accepted.lowercased()
            if a == mime || a == "*/*" { return nil }
            if a.hasSuffix("/*"), mime.hasPrefix(a.dropLast()) { return nil }
        }
        return "content type \(mime) is not acceptable"
    }
}

/// Username and password answering Basic and Digest challenges (Alamofire's
/// `authenticate(username:password:)`); libcurl does the challenge-response.
public struct Credentials: Sendable, Equatable {
    public var username: String
    public var password: Secret
    public init(username: String, password: Secret) {
        self.username = username
        self.password = password
    }
}

extension Substring {
    func trimmingCharacters() -> String {
        var s = self
        while s.first == " " || s.first == "\t" { s = s.dropFirst() }
        while s.last == " " || s.last == "\t" { s = s.dropLast() }
        return String(s)
    }
}
