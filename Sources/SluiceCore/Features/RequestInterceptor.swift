/// Why an adapter refused a request. The client receives `502` naming the adapter and the
/// reason; nothing is sent upstream.
public struct AdaptationError: Error, Sendable, Equatable {
    public var adapter: String
    /// For the `.adaptationFailed` event and the access log; the client's body says it too
    /// unless `answer` is set.
    public var reason: String
    /// What the client is answered instead of `ProxyError.adapterFailed` (a `lua` script's
    /// `luaScriptFailed`, whose body must not carry the script's message); nil: `adapterFailed`.
    public var answer: ProxyError?
    public init(adapter: String, reason: String, answer: ProxyError? = nil) {
        self.adapter = adapter
        self.reason = reason
        self.answer = answer
    }

    /// The error the client is answered with.
    public var proxyError: ProxyError { answer ?? .adapterFailed(name: adapter, reason: reason) }
}

/// Changes a request before it is sent (Alamofire's `RequestAdapter`). Built-ins: `headers`,
/// `bearer`, `basic`, `api_key`, `deflate`.
///
/// `adapt` runs on the request's worker thread and may call `completion` synchronously (the
/// hot path) or later on that same thread (an adapter that must wait, such as one fetching
/// an OAuth token). It must call it exactly once.
public protocol RequestAdapter: Sendable {
    /// The name used in errors, `sluice check` output and events (the YAML key for built-ins).
    var name: String { get }
    func adapt(_ request: ProxyRequest, completion: @escaping (Result<ProxyRequest, AdaptationError>) -> Void)
    /// The form the engine calls (Alamofire's `adapt(_:for:completion:)`): with the worker's
    /// session, for adapters that must fetch something. By default it calls the plain form.
    func adapt(
        _ request: ProxyRequest, for session: any SessionContext,
        completion: @escaping (Result<ProxyRequest, AdaptationError>) -> Void)
    /// The hot-path form for adapters that never wait: edits `request` in place, so a chain
    /// of them copies the request once, not once per adapter. Returns false when the adapter
    /// must be called through the completion form instead (the default).
    func adaptInPlace(_ request: inout ProxyRequest) throws(AdaptationError) -> Bool
    /// When the adapter runs: with the exchange's first try (and again before a retry, as
    /// Alamofire does: `.oncePerExchange`, the default), or on every try — each retry and each
    /// followed redirect — after every other adapter (`.everyTry`: signers, whose date and
    /// signature must be fresh and cover the request exactly as it is sent).
    var timing: AdapterTiming { get }
    /// Whether the adapter reads the request body (`TryContext.body`): the body is then read
    /// whole before the first try, up to the policy's `max_body` (a larger one is refused
    /// with `413`, `ProxyError.bodyTooLargeForAdapter`), and that copy is what every try
    /// sends. Only `.everyTry` adapters are given the body. `false` by default.
    var readsBody: Bool { get }
    /// The `.everyTry` form: edits the try's request in place, synchronously (a try does not
    /// wait for an adapter). By default it calls `adaptInPlace`, and fails when that form is
    /// not implemented.
    func adaptTry(_ request: inout ProxyRequest, _ context: TryContext) throws(AdaptationError)
}

/// When an adapter runs (`RequestAdapter.timing`).
public enum AdapterTiming: Sendable, Equatable {
    /// Before the first try, on the request as the client sent it (and again before a retry).
    case oncePerExchange
    /// Before each try — the first, each retry, each followed redirect — after every
    /// `.oncePerExchange` adapter, in the policy's order.
    case everyTry
}

/// What an `.everyTry` adapter is told about the try it adapts.
public struct TryContext: Sendable {
    /// The request body as the try sends it (after any encoder, such as `deflate`), when an
    /// adapter of the policy reads the body (`readsBody`) and the request has one; else nil.
    public var body: [UInt8]?
    /// The wall clock at the try's start, in milliseconds since the Unix epoch (a signer's
    /// date). Injected through the exchange's clock, so a test fixes it.
    public var wallClockMilliseconds: Int
    /// The try's number, from 1.
    public var attempt: Int

    public init(body: [UInt8]?, wallClockMilliseconds: Int, attempt: Int) {
        self.body = body
        self.wallClockMilliseconds = wallClockMilliseconds
        self.attempt = attempt
    }
}

extension RequestAdapter {
    public func adaptInPlace(_ request: inout ProxyRequest) throws(AdaptationError) -> Bool { false }
    public var timing: AdapterTiming { .oncePerExchange }
    public var readsBody: Bool { false }
    public func adaptTry(_ request: inout ProxyRequest, _ context: TryContext) throws(AdaptationError) {
        guard try adaptInPlace(&request) else {
            throw AdaptationError(adapter: name, reason: "runs on every try but cannot adapt without waiting")
        }
    }
}

/// An adapter that runs on every try (a signer): implement `adaptTry` (and `readsBody` when
/// it reads the body). The completion form — for a program that calls the adapter itself —
/// adapts the request at the wall clock's time, without a body.
public protocol EveryTryAdapter: RequestAdapter {}

extension EveryTryAdapter {
    public var timing: AdapterTiming { .everyTry }

    public func adapt(_ request: ProxyRequest, completion: @escaping (Result<ProxyRequest, AdaptationError>) -> Void) {
        var request = request
        do throws(AdaptationError) {
            let now = SystemClock().wallClockMilliseconds()
            try adaptTry(&request, TryContext(body: nil, wallClockMilliseconds: now, attempt: 1))
            completion(.success(request))
        } catch {
            completion(.failure(error))
        }
    }
}

/// A synchronous adapter: implement `adaptInPlace` only; the completion form follows from it.
public protocol SynchronousRequestAdapter: RequestAdapter {}

extension SynchronousRequestAdapter {
    public func adapt(_ request: ProxyRequest, completion: @escaping (Result<ProxyRequest, AdaptationError>) -> Void) {
        var request = request
        do throws(AdaptationError) {
            _ = try adaptInPlace(&request)
            completion(.success(request))
        } catch {
            completion(.failure(error))
        }
    }
}

extension RequestAdapter {
    public func adapt(
        _ request: ProxyRequest, for session: any SessionContext,
        completion: @escaping (Result<ProxyRequest, AdaptationError>) -> Void
    ) {
        adapt(request, completion: completion)
    }
}

/// What a retrier decides about a failed try (Alamofire's `RetryResult`).
public enum RetryResult: Sendable, Equatable {
    case retry
    case retryWithDelay(milliseconds: Int)
    /// Not a failure this retrier retries: the next retrier is asked.
    case doNotRetry
    /// A failure this retrier would retry, but not this time; `reason` is what the access log's
    /// `retry_stopped` and `.retryStopped` say.
    case doNotRetryWithError(RetryStopReason)
}

/// Why a retriable failure was not retried. The raw value is the access log's `retry_stopped`
/// (docs/configuration.md, "Retry events in the access log").
public enum RetryStopReason: String, Sendable, CaseIterable {
    /// `retry.limit` retries were made already.
    case limit
    /// The host's retry budget for the current second is spent.
    case budget
    /// The retry's delay would end at or past `retry.deadline`.
    case deadline
    /// The request's method is not in `retry.methods`.
    case method
    /// The request body outgrew `retry.buffer_limit` (or is not read whole yet): it cannot be
    /// sent again.
    case bufferLimit = "buffer_limit"
}

/// Why a try failed, as retriers see it.
public enum TryFailure: Sendable, Equatable {
    /// The transfer failed before a response head arrived.
    case transport(TransportErrorKind, ProxyError)
    /// The origin answered with this status; `retryAfterMilliseconds` from `Retry-After`.
    case status(Int, retryAfterMilliseconds: Int?)
    /// The response failed the policy's validation (a status or content type outside it).
    case validation(status: Int, reason: String)
    /// A `lua` script's `on_response` called `res:retry()` on a response with this status.
    case script(status: Int)

    /// A short reason for events and logs (`status 503`, `refused`, `validation: …`).
    public var reason: String {
        switch self {
        case .transport(let kind, _): return kind.rawValue
        case .status(let code, _): return "status \(code)"
        case .validation(_, let why): return "validation: \(why)"
        case .script: return "lua"
        }
    }
}

/// Transport failures in retry terms (the mapping from libcurl results is in docs).
public enum TransportErrorKind: String, Sendable, CaseIterable {
    case refused, dns, timeout, reset, tls
    /// Anything else (certificate verification, protocol errors): never retried.
    case other
}

/// Decides whether a failed try is tried again (Alamofire's `RequestRetrier`). `attempt` is
/// the number of retries already made (0 after the first try).
///
/// Like `adapt`, `retry` runs on the request's worker thread; the engine acts on an answer
/// given synchronously (an answer that comes later counts as `.doNotRetry`).
public protocol RequestRetrier: Sendable {
    var name: String { get }
    func retry(
        _ request: ProxyRequest, dueTo failure: TryFailure, attempt: Int,
        completion: @escaping (RetryResult) -> Void)
    /// The form the engine calls: with the exchange's random source, for retriers that draw
    /// random numbers (backoff jitter), so that a test can make them deterministic. By default
    /// it calls the plain form.
    func retry(
        _ request: ProxyRequest, dueTo failure: TryFailure, attempt: Int,
        using random: inout any RandomNumberGenerator, completion: @escaping (RetryResult) -> Void)
}

extension RequestRetrier {
    public func retry(
        _ request: ProxyRequest, dueTo failure: TryFailure, attempt: Int,
        using random: inout any RandomNumberGenerator, completion: @escaping (RetryResult) -> Void
    ) {
        retry(request, dueTo: failure, attempt: attempt, completion: completion)
    }
}

/// Both roles in one value (Alamofire's `RequestInterceptor`); either half may be a no-op.
public protocol RequestInterceptor: RequestAdapter, RequestRetrier {}

extension RequestInterceptor {
    public func adapt(_ request: ProxyRequest, completion: @escaping (Result<ProxyRequest, AdaptationError>) -> Void) {
        completion(.success(request))
    }
    public func retry(
        _ request: ProxyRequest, dueTo failure: TryFailure, attempt: Int,
        completion: @escaping (RetryResult) -> Void
    ) {
        completion(.doNotRetry)
    }
}

/// Composes adapters and retriers with Alamofire's order rules: adapters run in sequence,
/// each seeing the previous one's output, and the first failure stops the chain; retriers are
/// asked in order until one answers something other than `.doNotRetry`.
public struct Interceptor: RequestInterceptor {
    public let adapters: [any RequestAdapter]
    public let retriers: [any RequestRetrier]
    public var name: String { "interceptor" }

    public init(adapters: [any RequestAdapter] = [], retriers: [any RequestRetrier] = []) {
        self.adapters = adapters
        self.retriers = retriers
    }

    public func adapt(_ request: ProxyRequest, completion: @escaping (Result<ProxyRequest, AdaptationError>) -> Void) {
        adapt(request, session: nil, from: adapters[...], completion: completion)
    }

    public func adapt(
        _ request: ProxyRequest, for session: any SessionContext,
        completion: @escaping (Result<ProxyRequest, AdaptationError>) -> Void
    ) {
        adapt(request, session: session, from: adapters[...], completion: completion)
    }

    private func adapt(
        _ request: ProxyRequest, session: (any SessionContext)?, from pending: ArraySlice<any RequestAdapter>,
        completion: @escaping (Result<ProxyRequest, AdaptationError>) -> Void
    ) {
        // Synchronous adapters edit one copy in place; the first that must wait continues
        // through the completion form.
        var current = request
        var pending = pending
        while let next = pending.first {
            do throws(AdaptationError) {
                guard try next.adaptInPlace(&current) else { break }
            } catch {
                return completion(.failure(error))
            }
            pending = pending.dropFirst()
        }
        let request = current
        guard let next = pending.first else { return completion(.success(request)) }
        let proceed: (Result<ProxyRequest, AdaptationError>) -> Void = { result in
            switch result {
            case .success(let adapted): self.adapt(adapted, session: session, from: pending.dropFirst(), completion: completion)
            case .failure: completion(result)
            }
        }
        if let session {
            next.adapt(request, for: session, completion: proceed)
        } else {
            next.adapt(request, completion: proceed)
        }
    }

    public func retry(
        _ request: ProxyRequest, dueTo failure: TryFailure, attempt: Int,
        completion: @escaping (RetryResult) -> Void
    ) {
        retry(request, dueTo: failure, attempt: attempt, from: retriers[...], completion: completion)
    }

    /// The same order rule, handing `random` to each retrier asked while they answer
    /// synchronously; past a retrier that answers later, the chain goes on in the plain form.
    public func retry(
        _ request: ProxyRequest, dueTo failure: TryFailure, attempt: Int,
        using random: inout any RandomNumberGenerator, completion: @escaping (RetryResult) -> Void
    ) {
        var pending = retriers[...]
        while let next = pending.first {
            pending = pending.dropFirst()
            var answer: RetryResult?
            var waiting = false
            let rest = pending
            next.retry(request, dueTo: failure, attempt: attempt, using: &random) { result in
                guard waiting else {
                    answer = result
                    return
                }
                if result == .doNotRetry {
                    self.retry(request, dueTo: failure, attempt: attempt, from: rest, completion: completion)
                } else {
                    completion(result)
                }
            }
            guard let answer else {
                waiting = true
                return
            }
            if answer != .doNotRetry { return completion(answer) }
        }
        completion(.doNotRetry)
    }

    private func retry(
        _ request: ProxyRequest, dueTo failure: TryFailure, attempt: Int,
        from pending: ArraySlice<any RequestRetrier>, completion: @escaping (RetryResult) -> Void
    ) {
        guard let next = pending.first else { return completion(.doNotRetry) }
        next.retry(request, dueTo: failure, attempt: attempt) { result in
            if result == .doNotRetry {
                self.retry(request, dueTo: failure, attempt: attempt, from: pending.dropFirst(), completion: completion)
            } else {
                completion(result)
            }
        }
    }
}
