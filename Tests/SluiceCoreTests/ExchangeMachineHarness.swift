import HTTPTypes
import SluiceCore
import Testing

// What ExchangeMachineTests drive the exchange state machine with, without sockets: a fake
// clock, a seeded random source, and the I/O played by `Harness`.

/// Time by hand: monotonic milliseconds for deadlines, delays and budget windows, and a wall
/// clock for HTTP-date `Retry-After`s.
final class FakeClock: ExchangeClock {
    var now: Int
    var wall: Int
    init(now: Int = 10_000, wall: Int = 1_700_000_000_000) {
        self.now = now
        self.wall = wall
    }
    func advance(_ ms: Int) {
        now += ms
        wall += ms
    }
    func monotonicMilliseconds() -> Int { now }
    func wallClockMilliseconds() -> Int { wall }
}

/// SplitMix64: deterministic jitter.
struct SeededRandom: RandomNumberGenerator {
    var state: UInt64
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

/// The events the harness feeds, one case per method of the machine, so that a test row reads
/// as a sequence; `ExchangeMachine.handle` calls the method and flattens its typed answer.
extension ExchangeMachine {
    enum Event {
        case received
        case prepare(model: ProxyRequest?)
        case adapted(Result<ProxyRequest, AdaptationError>)
        case adaptationSuspended
        case tryStarting(Target)
        case responseHead(ResponseHead, canResendBody: Bool)
        case heldByOrigin(ResponseHead, canResendBody: Bool)
        case redirectTarget(usable: Bool)
        case responseHeadSent(status: Int)
        case requestBodyRead(bytes: Int)
        case responseBodySent(bytes: Int)
        case tryEnded(TryTimings)
        case tryFailed(ProxyError, kind: TransportErrorKind, canResendBody: Bool)
        case discardedDrained
        case retryTimerFired
        case ended(Outcome, error: String?)
    }

    /// Every command any event answers, and the reports, as one list per event.
    enum Action {
        case report(ProxyEvent)
        case adapt(ProxyRequest)
        case forward(headerEdits: HeaderEditPlan?)
        case buildRetry
        case beginTry(perTryTimeout: Int)
        case sendResponse
        case discardResponse
        case checkRedirect(ProxyRequest)
        case followRedirect(keepCredentials: Bool)
        case scheduleRetry(after: Int)
        case fail(ProxyError)

        var isReport: Bool {
            if case .report = self { return true } else { return false }
        }
    }

    struct Actions: RandomAccessCollection {
        /// The most one event answers: its reports and its command.
        static let capacity = Reports.capacity + 1
        var items: [Action] = []
        var startIndex: Int { 0 }
        var endIndex: Int { items.count }
        subscript(position: Int) -> Action { items[position] }
        /// The action other than a report, if any (it comes after the reports).
        var command: Action? { items.last.flatMap { $0.isReport ? nil : $0 } }

        init(_ reports: Reports = Reports(), _ command: Action? = nil) {
            items = reports.map { .report($0) }
            if let command { items.append(command) }
        }
    }

    /// Calls the event's method and flattens its answer.
    mutating func handle(_ event: Event) -> Actions {
        switch event {
        case .received:
            return Actions(received())
        case .prepare(let model):
            let a = prepare(model: model)
            switch a.command {
            case .adapt(let request)?: return Actions(a.reports, .adapt(request))
            case .forward(let edits)?: return Actions(a.reports, .forward(headerEdits: edits))
            case nil: return Actions(a.reports)
            }
        case .adapted(let result):
            let a = adapted(result)
            switch a.command {
            case .forward?: return Actions(a.reports, .forward(headerEdits: nil))
            case .buildRetry?: return Actions(a.reports, .buildRetry)
            case .fail(let error)?: return Actions(a.reports, .fail(error))
            case nil: return Actions(a.reports)
            }
        case .adaptationSuspended:
            adaptationSuspended()
            return Actions()
        case .tryStarting(let target):
            let a = tryStarting(target)
            switch a.command {
            case .beginTry(let timeout)?: return Actions(a.reports, .beginTry(perTryTimeout: timeout))
            case .fail(let error)?: return Actions(a.reports, .fail(error))
            case nil: return Actions(a.reports)
            }
        case .responseHead(let head, let canResendBody):
            return Self.flatten(responseHead(head, canResendBody: canResendBody))
        case .heldByOrigin(let head, let canResendBody):
            return Self.flatten(heldByOrigin(head, canResendBody: canResendBody))
        case .redirectTarget(let usable):
            let a = redirectTarget(usable: usable)
            switch a.command {
            case .sendResponse?: return Actions(a.reports, .sendResponse)
            case .followRedirect(let keep)?: return Actions(a.reports, .followRedirect(keepCredentials: keep))
            case nil: return Actions(a.reports)
            }
        case .responseHeadSent(let status):
            return Actions(responseHeadSent(status: status))
        case .requestBodyRead(let bytes):
            requestBodyRead(bytes: bytes)
            return Actions()
        case .responseBodySent(let bytes):
            responseBodySent(bytes: bytes)
            return Actions()
        case .tryEnded(let timings):
            return Actions(tryEnded(timings))
        case .tryFailed(let error, let kind, let canResendBody):
            let a = tryFailed(error, kind: kind, canResendBody: canResendBody)
            switch a.command {
            case .scheduleRetry(let after)?: return Actions(a.reports, .scheduleRetry(after: after))
            case .fail(let error)?: return Actions(a.reports, .fail(error))
            case nil: return Actions(a.reports)
            }
        case .discardedDrained:
            return Actions(Reports(), discardedDrained().map { .scheduleRetry(after: $0.after) })
        case .retryTimerFired:
            switch retryTimerFired() {
            case .adapt(let request)?: return Actions(Reports(), .adapt(request))
            case .buildRetry?: return Actions(Reports(), .buildRetry)
            case nil: return Actions()
            }
        case .ended(let outcome, let error):
            return Actions(ended(outcome, error: error))
        }
    }

    private static func flatten(_ a: Answer<ResponseHeadAction>) -> Actions {
        switch a.command {
        case .sendResponse?: return Actions(a.reports, .sendResponse)
        case .discardResponse?: return Actions(a.reports, .discardResponse)
        case .checkRedirect(let next)?: return Actions(a.reports, .checkRedirect(next))
        case nil: return Actions(a.reports)
        }
    }
}

/// One line per action, so a test compares whole sequences.
func describe(_ action: ExchangeMachine.Action) -> String {
    switch action {
    case .report(let event): return describe(event)
    case .adapt(let request): return "adapt \(request.method) \(request.url)"
    case .forward(let edits): return edits == nil ? "forward" : "forward with header edits"
    case .buildRetry: return "build retry"
    case .beginTry(let timeout): return "begin try, \(timeout) ms for a head"
    case .sendResponse: return "send"
    case .discardResponse: return "discard"
    case .checkRedirect(let next): return "check redirect \(next.method) \(next.url)"
    case .followRedirect(let keep): return keep ? "follow, credentials kept" : "follow, credentials dropped"
    case .scheduleRetry(let after): return "retry after \(after)"
    case .fail(let error): return "fail \(error.status) \(error.message)"
    }
}

func describe(_ event: ProxyEvent) -> String {
    switch event {
    case .requestReceived(_, _, let method, let url, let policy): return "event received \(method) \(url) \(policy)"
    case .requestAdapted(_, let adapters): return "event adapted \(adapters.joined(separator: ","))"
    case .adaptationFailed(_, let error): return "event adaptation failed \(error.adapter): \(error.reason)"
    case .tryStarted(_, let attempt, let request):
        return "event try \(attempt) \(request.method) \(request.url)"
            + (request.headerFields[.authorization].map { " [\($0)]" } ?? "")
    case .metricsCollected(_, let attempt, _): return "event metrics \(attempt)"
    case .responseReceived(_, let attempt, let status): return "event response \(status) on try \(attempt)"
    case .redirectFollowed(_, let status, let location, let hop): return "event redirect \(status) to \(location) hop \(hop)"
    case .retrying(_, let record):
        return "event retrying \(record.attempt) after \(record.delayMilliseconds) (\(record.reason))"
    case .retryStopped(_, let reason): return "event retry stopped: \(reason.rawValue)"
    case .credentialRefreshed: return "event credential refreshed"
    case .credentialRefreshFailed: return "event credential refresh failed"
    case .finished(let s): return "event finished \(s.status) \(s.outcome.rawValue) attempts \(s.attempts)"
    case .trustFailed(_, _, let evaluator, let reason): return "event trust failed \(evaluator): \(reason)"
    case .tunnelOpened: return "event tunnel opened"
    case .tunnelClosed: return "event tunnel closed"
    case .configReloaded: return "event config reloaded"
    case .cache(_, let event): return "event cache \(event)"
    }
}

let origin = ExchangeMachine.Target(host: "api.test", port: 80, url: "http://api.test/x")

func policy(
    retry: RetryPolicy? = nil, validate: ResponseValidator? = nil, redirect: Redirector = .doNotFollow,
    adapters: [any RequestAdapter] = [], credentials: Credentials? = nil
) -> HostPolicy {
    HostPolicy(
        merging: nil,
        over: PolicyEntry(
            name: "default", adapters: adapters, redirect: redirect,
            retry: retry.map { .on($0) } ?? .inherit,
            validate: validate.map { .on($0) } ?? .inherit,
            credentials: credentials.map { .on($0) } ?? .inherit))
}

/// No budget (unless a test gives one), so that rows about other rules are not cut by it.
func retry(
    limit: Int = 2, base: Int = 2, scale: Int = 100, maxDelay: Int = 30_000, jitter: RetryPolicy.Jitter = .none,
    methods: Set<String> = RetryPolicy.defaultRetryableMethods, statuses: Set<Int> = RetryPolicy.defaultRetryableStatusCodes,
    errors: Set<TransportErrorKind> = RetryPolicy.defaultRetryableErrors, retryAfter: Bool = true,
    perTryTimeout: Int? = nil, deadline: Int? = nil, budget: RetryBudget.Limits? = nil
) -> RetryPolicy {
    RetryPolicy(
        limit: limit, base: base, scale: scale, maxDelay: maxDelay, jitter: jitter, methods: methods,
        statuses: statuses, errors: errors, retryAfter: retryAfter, perTryTimeout: perTryTimeout,
        deadline: deadline, budget: budget)
}

/// What one try does, as the upstream of an e2e test would.
enum Upstream {
    case answer(ExchangeMachine.ResponseHead)
    case fail(TransportErrorKind, ProxyError)
    /// No head within the per-try timeout (the transfer's own timer fails the try).
    case stall

    static func status(_ code: Int, retryAfter: String? = nil, contentType: String? = nil, location: String? = nil) -> Upstream {
        .answer(.init(status: code, retryAfter: retryAfter, contentType: contentType, location: location))
    }
    static let refused = Upstream.fail(.refused, .upstreamRefused(host: "api.test:80"))
    static let reset = Upstream.fail(.reset, .upstreamProtocol(host: "api.test:80", reason: "Recv failure"))
}

/// Plays the I/O around one machine: feeds the events `ClientConnection` and
/// `UpstreamTransfer` would, in their order, and performs the commands.
struct Harness {
    var machine: ExchangeMachine
    let clock: FakeClock
    /// Every action so far, described.
    var log: [String] = []
    /// Each try's per-try timeout, in order.
    var tryTimeouts: [Int] = []
    /// Each retry's delay, in order.
    var delays: [Int] = []
    var canResendBody = true
    /// Milliseconds from a try's start to its head (or failure).
    var tryDuration = 0
    /// Milliseconds a retry timer fires late (event-loop lag).
    var timerLag = 0

    init(
        _ policy: HostPolicy, method: String = "GET", url: String = "http://api.test/x", target: ExchangeMachine.Target = origin,
        monitoring: ExchangeMachine.Monitoring = .events, events: ProxyEvent.Kinds = .all, clock: FakeClock = FakeClock(),
        seed: UInt64 = 1, perTryTimeout: Int = 60_000
    ) {
        self.clock = clock
        let summary = ExchangeSummary(id: 7, client: "127.0.0.1", method: method, url: url, policy: policy.name)
        machine = ExchangeMachine(
            summary: summary, policy: policy, target: target, defaultPerTryTimeout: perTryTimeout,
            monitoring: monitoring, events: events, clock: clock, random: SeededRandom(state: seed))
    }

    @discardableResult
    mutating func feed(_ event: ExchangeMachine.Event) -> ExchangeMachine.Actions {
        let actions = machine.handle(event)
        log += actions.map(describe)
        return actions
    }

    /// The head arrived; the pipeline runs with `model` (built when the machine needs it).
    mutating func begin(model: ProxyRequest? = nil, adapt: ((ProxyRequest) -> Result<ProxyRequest, AdaptationError>)? = nil) {
        feed(.received)
        let actions = feed(.prepare(model: model))
        if case .adapt(let request)? = actions.command, let adapt {
            feed(.adapted(adapt(request)))
        }
    }

    /// Runs tries against `upstream` (one entry per try, the last repeated) until the exchange
    /// ends; returns the finished summary.
    @discardableResult
    mutating func run(
        _ upstream: [Upstream], adapt: ((ProxyRequest) -> Result<ProxyRequest, AdaptationError>)? = nil
    )
        -> ExchangeSummary
    {
        var tryIndex = 0
        while !machine.isFinished {
            switch machine.state {
            case .startingTry, .drainingRedirect:
                let actions = feed(.tryStarting(nextTarget))
                switch actions.command {
                case .beginTry(let timeout)?:
                    tryTimeouts.append(timeout)
                    runTry(upstream[min(tryIndex, upstream.count - 1)], timeout: timeout)
                    tryIndex += 1
                case .fail(let error)?:
                    end(error)
                default:
                    Issue.record("no try started: \(actions.map(describe))")
                    return machine.summary
                }
            case .backingOff(let until):
                clock.now = until + timerLag
                let actions = feed(.retryTimerFired)
                if case .adapt(let request)? = actions.command {
                    guard let adapt else {
                        Issue.record("adapt without an adapter")
                        return machine.summary
                    }
                    if case .fail(let error)? = feed(.adapted(adapt(request))).command { end(error) }
                }
            default:
                Issue.record("stuck in \(machine.state)")
                return machine.summary
            }
        }
        return machine.summary
    }

    private mutating func runTry(_ upstream: Upstream, timeout: Int) {
        switch upstream {
        case .stall:
            clock.advance(timeout)
            feed(.tryEnded(TryTimings()))
            failed(.upstreamTimeout(host: "api.test:80", phase: .noResponseHead), kind: .timeout)
        case .fail(let kind, let error):
            clock.advance(tryDuration)
            feed(.tryEnded(TryTimings()))
            failed(error, kind: kind)
        case .answer(let head):
            clock.advance(tryDuration)
            let actions = feed(.responseHead(head, canResendBody: canResendBody))
            switch actions.command {
            case .sendResponse?:
                feed(.responseHeadSent(status: head.status))
                feed(.responseBodySent(bytes: 10))
                feed(.tryEnded(TryTimings()))
                feed(.ended(.ok, error: nil))
            case .discardResponse?:
                feed(.tryEnded(TryTimings()))
                if case .scheduleRetry(let after)? = feed(.discardedDrained).command { delays.append(after) }
            case .checkRedirect?:
                if case .sendResponse? = feed(.redirectTarget(usable: true)).command {
                    Issue.record("a checked redirect was not followed")
                }
                feed(.tryEnded(TryTimings()))
            default:
                Issue.record("no disposition for \(head.status): \(actions.map(describe))")
            }
        }
    }

    private mutating func failed(_ error: ProxyError, kind: TransportErrorKind) {
        let actions = feed(.tryFailed(error, kind: kind, canResendBody: canResendBody))
        switch actions.command {
        case .scheduleRetry(let after)?: delays.append(after)
        case .fail(let error)?: end(error)
        default: Issue.record("no answer to a failed try: \(actions.map(describe))")
        }
    }

    /// What `ClientConnection.respondError` does after writing the error.
    mutating func end(_ error: ProxyError) {
        machine.summary.status = error.status
        feed(.ended(.error, error: error.message))
    }

    var events: [String] { log.filter { $0.hasPrefix("event ") } }

    /// Where the next try goes, as the I/O would parse it: the request model's URL (a followed
    /// redirect changes it), else the last target.
    var nextTarget: ExchangeMachine.Target {
        guard let url = machine.model?.url else { return machine.target }
        return ExchangeMachine.Target(host: URLParts(url).host, port: 80, url: url)
    }
}

func get(
    _ url: String = "http://api.test/x", method: String = "GET", body: ProxyRequest.Body = .none,
    fields: HTTPFields = [:]
) -> ProxyRequest {
    ProxyRequest(id: 7, method: method, url: url, headerFields: fields, body: body)
}

/// An adapter that stamps a token, as the oauth2 adapter does once its fetch is done.
func stamp(_ token: String) -> (ProxyRequest) -> Result<ProxyRequest, AdaptationError> {
    { request in
        var request = request
        request.headerFields[.authorization] = "Bearer " + token
        return .success(request)
    }
}
