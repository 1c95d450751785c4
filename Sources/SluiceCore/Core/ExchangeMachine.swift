/// The life of one forwarded exchange as a value-type state machine: events in, actions out.
///
/// It holds every decision between a request head and the end of the exchange — whether the
/// adapters run, when a try starts and for how long it may wait for a response head, what
/// happens to that head (pass it on, retry, follow a redirect, fail validation), the retry
/// rules (retriers in order, `Retry-After`, backoff and jitter, the body that must be
/// replayable, the deadline, the per-host budget), and the exchange's record
/// (`ExchangeSummary`) with the monitor events that describe it. The I/O around it
/// (`ClientConnection`, `UpstreamTransfer`) reads sockets, runs libcurl and the adapters, and
/// performs the actions; it knows the facts the machine cannot (the response's fields, whether
/// the request body can be sent again right now) and passes them in with the events.
///
/// Threading: owned by its exchange, on the exchange's worker thread; not `Sendable`. The
/// clock and the random source are injected (`ExchangeClock`, `RandomNumberGenerator`), so a
/// test drives time and jitter by hand. The only state it shares is the policy's retry
/// budget (`RetryBudgets`, process-wide behind a lock), which it reads at the clock's time.
///
/// ```
///  received
///     │ prepare
///     ├────────────────────────────────► startingTry ◄─────────────────────────────┐
///     └─► adapting ──adapted───────────►     │ tryStarting                          │ retryTimerFired
///          │    ▲                            ▼                                      │ (no adapters)
///  suspended    │ adapted                 trying ──tryFailed──┬─ retry ──► backingOff ──retryTimerFired──► adapting (retry)
///          ▼    │                            │                └─ no retry ─► failing
///   awaitingCredential                       │ responseHead
///                                            ├─ pass (or failed validation, not retried) ─► streaming ─ended(.ok)─► done
///                                            ├─ retry ─► drainingDiscarded ─discardedDrained─► backingOff
///                                            └─ 3xx to follow ─► checkingRedirect ─redirectTarget─┬─ usable ─► drainingRedirect
///                                                                                                 │    ─tryStarting─► trying
///                                                                                                 └─ not ─► streaming
///  an adapter failed, the retry deadline passed at tryStarting ─► failing ─ended(.error)─► done
///  any state ─ended─► done: `.finished` is reported once (`ended(.clientAborted)`: the client
///  went away, so a later timer or try event does nothing)
/// ```
///
/// Each event is a method that returns its own answer: the monitor events it reports (at most
/// `Reports.capacity`, in order), then at most one command of a type that lists only what that
/// event can ask for. Nothing on the path of a plain request allocates: the reports come back
/// in a fixed-size value, and monitor events are built only when a monitor listens.
public struct ExchangeMachine {
    /// What the monitors want: nothing (no events are built), the events, or the events with
    /// the request as sent in `.tryStarted` (a monitor's `wantsRequestDetails`).
    public enum Monitoring: Sendable, Equatable {
        case none, events, detailedEvents
    }

    public enum State {
        /// The head arrived; the pipeline has not run yet.
        case received
        /// The adapters run on the request (`retry`: again before a retry, on the request as it
        /// was before adaptation).
        case adapting(retry: Bool)
        /// An adapter waits for something before it answers (an OAuth token fetch).
        case awaitingCredential(retry: Bool)
        /// The I/O builds the next try: reads what the body needs (the first try), builds the
        /// request, picks its TLS settings. It answers with `.tryStarting`.
        case startingTry
        /// A try is in flight; its final response head has not arrived.
        case trying
        /// The response goes to the client (head, then body): no retry is possible any more.
        case streaming
        /// A 3xx the policy follows, to `next`: the I/O checks the target can be requested.
        case checkingRedirect(next: ProxyRequest, status: Int)
        /// A followed 3xx's body is drained; the next try goes to `model`.
        case drainingRedirect
        /// A response that is retried is drained, never sent.
        case drainingDiscarded
        /// Waiting for the retry timer, due at `until` (monotonic ms).
        case backingOff(until: Int)
        /// Sluice answers the client with its own error; `.ended` follows.
        case failing
        /// The exchange ended (its `.finished` event was reported).
        case done(Outcome)

        /// The state's name as the admin API's `GET /requests` shows it.
        public var name: String {
            switch self {
            case .received: return "received"
            case .adapting: return "adapting"
            case .awaitingCredential: return "awaiting_credential"
            case .startingTry: return "starting_try"
            case .trying: return "trying"
            case .streaming: return "streaming"
            case .checkingRedirect: return "checking_redirect"
            case .drainingRedirect: return "draining_redirect"
            case .drainingDiscarded: return "draining_discarded"
            case .backingOff: return "backing_off"
            case .failing: return "failing"
            case .done: return "done"
            }
        }
    }

    // Each event is a method of its own and returns its own answer (swift-nio's
    // `NIOTypedHTTPServerUpgraderStateMachine`): the monitor events it reports, in order, then
    // at most one command of a type that lists exactly what that event can ask for. An event out
    // of turn answers nothing.

    /// `prepare`'s command: run the adapters, or go on to the first try.
    public enum PrepareAction {
        /// Run the policy's adapters on `request`; answer with `adapted`.
        case adapt(ProxyRequest)
        /// The request is ready: read or check what its body needs, build the first try
        /// (applying `headerEdits` to the header lines when given), then `tryStarting`.
        case forward(headerEdits: HeaderEditPlan?)
    }

    /// `adapted`'s command.
    public enum AdaptedAction {
        /// The first try's adapters answered: build the first try, then `tryStarting`.
        case forward
        /// A retry's adapters answered: build the retry (its body from the first byte), then
        /// `tryStarting`.
        case buildRetry
        /// An adapter failed: answer the client with `error`; then `ended`.
        case fail(ProxyError)
    }

    /// `tryStarting`'s command.
    public enum TryStartingAction {
        /// Start the try just built; `perTryTimeout` ms from its start to a response head.
        case beginTry(perTryTimeout: Int)
        /// The retry deadline passed: answer the client with `error`; then `ended`.
        case fail(ProxyError)
    }

    /// `responseHead`'s and `heldByOrigin`'s command.
    public enum ResponseHeadAction {
        /// Send the response head to the client, then its body.
        case sendResponse
        /// Drain the response without sending it, then `discardedDrained`.
        case discardResponse
        /// Check that `next` can be requested; answer with `redirectTarget`.
        case checkRedirect(ProxyRequest)
    }

    /// `redirectTarget`'s command.
    public enum RedirectTargetAction {
        /// The target cannot be requested: send the 3xx to the client as it is.
        case sendResponse
        /// Drain the 3xx, then start a try of the request just checked; `keepCredentials`:
        /// the policy's `credentials` still apply (same host).
        case followRedirect(keepCredentials: Bool)
    }

    /// `tryFailed`'s command.
    public enum TryFailedAction {
        /// Wait `after` ms, then `retryTimerFired`.
        case scheduleRetry(after: Int)
        /// Answer the client with `error`; then `ended`.
        case fail(ProxyError)
    }

    /// `discardedDrained`'s command: wait this long, then `retryTimerFired`.
    public struct ScheduleRetry: Equatable {
        public let after: Int
    }

    /// `retryTimerFired`'s command.
    public enum RetryTimerAction {
        /// Run the policy's adapters again on the request as it was before adaptation (a
        /// refreshed token); answer with `adapted`.
        case adapt(ProxyRequest)
        /// Build the retry (its body from the first byte), then `tryStarting`.
        case buildRetry
    }

    /// Request bodies up to this are kept to follow a 307/308 or answer an auth challenge
    /// when the policy has no `retry.buffer_limit` (`1 MiB`).
    public static let defaultReplayLimit = 1 << 20

    /// How much of a request body the exchange keeps for sending again (0: none): the retry
    /// policy's `buffer_limit`, else `defaultReplayLimit` when a redirect, a credentials
    /// challenge or an OAuth refresh may resend it.
    public static func replayLimit(for policy: HostPolicy) -> Int {
        // An adapter that reads the body (a signer) is given the copy every try sends.
        if policy.bodyReader != nil { return Int(policy.maxBody) }
        if let retry = policy.retryPolicy { return retry.bufferLimit }
        let mayResend = policy.redirector.follows || policy.credentials != nil || !policy.refreshStatuses.isEmpty
        return mayResend ? defaultReplayLimit : 0
    }

    public let policy: HostPolicy
    public let monitoring: Monitoring
    /// The kinds of events the monitors read (the union of their `events`); no other is built.
    public let events: ProxyEvent.Kinds
    /// `events` when a monitor watches (`monitoring` is not `.none`), else none.
    private let built: ProxyEvent.Kinds
    /// The per-try timeout of a policy without `retry.per_try_timeout` (`timeouts.upstream_per_try`).
    public let defaultPerTryTimeout: Int
    public internal(set) var state: State = .received
    /// The exchange's record so far; the I/O reads it (and a tunnel adds its byte counts).
    public var summary: ExchangeSummary
    /// A script's hook kept a `ctx` open for the exchange's later hooks (set by the stage that
    /// took its call): the exchange's end must close it, even without `on_log` or
    /// `on_response` to run.
    public var keepsScriptContexts = false
    /// The request as the pipeline sees it, when one was built (adapters, redirects, monitors).
    public internal(set) var model: ProxyRequest?
    /// The request before adaptation: a retry adapts it again (a refreshed token). Boxed: few
    /// exchanges build one, and the machine lives inside every `Exchange`, whose size decides
    /// whether malloc serves it from its per-thread cache (1,032 bytes at most).
    private var originalModelBox: Box<ProxyRequest>?
    private var originalModel: ProxyRequest? {
        get { originalModelBox?.value }
        set { originalModelBox = newValue.map(Box.init) }
    }
    /// Where the current (or last) try goes.
    public private(set) var target: Target
    /// The delay of the retry decided last.
    var pendingDelay = 0
    private let startedAt: Int
    /// The exchange's clock (also a try's `TryContext.wallClockMilliseconds`).
    public let clock: any ExchangeClock
    /// Jitter's random numbers (the retriers draw from it).
    var random: any RandomNumberGenerator

    /// `summary` carries the exchange's id, client, method, URL and policy name; `target` is
    /// where the first try goes (after an `upstream:` override).
    public init(
        summary: ExchangeSummary, policy: HostPolicy, target: Target, defaultPerTryTimeout: Int,
        monitoring: Monitoring, events: ProxyEvent.Kinds = .all, clock: any ExchangeClock = SystemClock(),
        random: any RandomNumberGenerator = SystemRandomNumberGenerator()
    ) {
        self.summary = summary
        self.policy = policy
        self.target = target
        self.defaultPerTryTimeout = defaultPerTryTimeout
        self.monitoring = monitoring
        self.events = events
        built = monitoring == .none ? [] : events
        self.clock = clock
        self.random = random
        startedAt = clock.monotonicMilliseconds()
    }

    public var id: UInt64 { summary.id }

    /// Milliseconds since the exchange began.
    public var elapsed: Int { clock.monotonicMilliseconds() - startedAt }

    public var isFinished: Bool {
        if case .done = state { return true } else { return false }
    }

    /// Whether `.prepare` needs the request model: adapters that are not all fixed header
    /// edits, a redirect rule, or a monitor that reads requests. Building it costs allocations,
    /// so the plain path goes without.
    public var needsRequestModel: Bool {
        let details = monitoring == .detailedEvents
        guard !policy.adapters.isEmpty || policy.redirector.follows || details else { return false }
        return !(policy.headerEditPlan != nil && !policy.redirector.follows && !details)
    }

    /// Whether `.prepare` runs the policy's scripts on the forwarded request's header lines
    /// instead of a request model (`HostPolicy.scriptsOnLines`; a monitor that reads requests
    /// needs the model): the I/O runs them and tells `scriptsRan`.
    public var runsScriptsOnLines: Bool {
        policy.scriptsOnLines && monitoring != .detailedEvents
    }

    /// The policy's scripts ran on the header lines (`runsScriptsOnLines`), in place of
    /// `prepare`: `result` is their failure, or the request model when a script changed the
    /// method or the URL (which the lines do not carry; nil when none did). Answers as
    /// `adapted` does for the adapters' answer.
    public mutating func scriptsRan(_ result: Result<ProxyRequest?, AdaptationError>) -> Answer<AdaptedAction> {
        guard case .received = state else { return Answer() }
        switch result {
        case .success(let model?):
            state = .adapting(retry: false)
            return adapted(.success(model))
        case .failure(let error):
            state = .adapting(retry: false)
            return adapted(.failure(error))
        case .success(nil):
            // The request stays without a model: nothing to copy in, as `adapted` would.
            return forwardAdapted(retry: false)
        }
    }

    /// Whether a body of `length` bytes is read whole before the first try, so every try (and
    /// an auth challenge's second round) can send it again: it fits the replay limit and the
    /// policy may resend it.
    public func readsBodyWhole(length: Int64) -> Bool {
        guard length > 0, length <= Int64(Self.replayLimit(for: policy)) else { return false }
        if policy.bodyReader != nil { return true }
        if let retry = policy.retryPolicy, retry.methods.contains(model?.method ?? summary.method) { return true }
        return policy.credentials != nil || !policy.refreshStatuses.isEmpty || policy.redirector.follows
    }

    /// The request head arrived and matched the policy (every exchange, CONNECT included).
    public mutating func received() -> Reports {
        var reports = Reports()
        policy.retryBudgets?.budget(for: target.host).recordRequest(now: clock.monotonicMilliseconds())
        if wants(.requestReceived) {
            reports.append(
                .requestReceived(id: id, client: summary.client, method: summary.method, url: summary.url, policy: summary.policy)
            )
        }
        return reports
    }

    /// The pipeline may run: `model` is the request as adapters see it, built by the I/O when
    /// `needsRequestModel` (nil otherwise).
    public mutating func prepare(model: ProxyRequest?) -> Answer<PrepareAction> {
        guard case .received = state else { return Answer() }
        guard let model else {
            state = .startingTry
            if let plan = policy.headerEditPlan, !policy.redirector.follows, monitoring != .detailedEvents {
                // Adapters that only edit header fields: applied as the header lines are built.
                guard wants(.requestAdapted) else { return Answer(reports: Reports(), command: .forward(headerEdits: plan)) }
                var reports = Reports()
                reports.append(.requestAdapted(id: id, adapters: policy.adapterNames))
                return Answer(reports: reports, command: .forward(headerEdits: plan))
            }
            return Answer(reports: Reports(), command: .forward(headerEdits: nil))
        }
        if policy.interceptor.adapters.isEmpty {
            // None runs once (there may be adapters for every try: they run in the try stages).
            self.model = model
            state = .startingTry
            return Answer(reports: Reports(), command: .forward(headerEdits: nil))
        }
        originalModel = model
        state = .adapting(retry: false)
        return Answer(reports: Reports(), command: .adapt(model))
    }

    /// The adapters answered.
    public mutating func adapted(_ result: Result<ProxyRequest, AdaptationError>) -> Answer<AdaptedAction> {
        let retry: Bool
        switch state {
        case .adapting(let r), .awaitingCredential(let r): retry = r
        default: return Answer()
        }
        switch result {
        case .success(let adapted):
            model = adapted
            return forwardAdapted(retry: retry)
        case .failure(let error):
            state = .failing
            var reports = Reports()
            // A script's own answer (`req:respond`) is no failure.
            if wants(.adaptationFailed), error.answer?.kind != .luaResponded {
                reports.append(.adaptationFailed(id: id, error: error))
            }
            return Answer(reports: reports, command: .fail(error.proxyError))
        }
    }

    /// The request is adapted: a retry is built, or the first try's stages go on.
    @inline(__always)
    private mutating func forwardAdapted(retry: Bool) -> Answer<AdaptedAction> {
        state = .startingTry
        if retry { return Answer(reports: Reports(), command: .buildRetry) }
        guard wants(.requestAdapted) else { return Answer(reports: Reports(), command: .forward) }
        var reports = Reports()
        reports.append(.requestAdapted(id: id, adapters: policy.adapterNames))
        return Answer(reports: reports, command: .forward)
    }

    /// The adapters did not answer synchronously: one waits for a credential.
    public mutating func adaptationSuspended() {
        if case .adapting(let retry) = state { state = .awaitingCredential(retry: retry) }
    }

    /// The I/O built the next try to `target` (its TLS trust allows it).
    public mutating func tryStarting(_ target: Target) -> Answer<TryStartingAction> {
        switch state {
        case .startingTry, .drainingRedirect: break
        default: return Answer()
        }
        self.target = target
        guard let timeout = perTryTimeout() else {
            state = .failing
            return Answer(
                reports: Reports(), command: .fail(.upstreamTimeout(host: target.authority, phase: .retryDeadlinePassed)))
        }
        summary.attempts += 1
        state = .trying
        guard wants(.tryStarted), let model else { return Answer(reports: Reports(), command: .beginTry(perTryTimeout: timeout)) }
        var reports = Reports()
        reports.append(.tryStarted(id: id, attempt: summary.attempts, request: model))
        return Answer(reports: reports, command: .beginTry(perTryTimeout: timeout))
    }

    /// The try's final response head arrived. `canResendBody`: the request has no body, or all
    /// of it is kept for replay.
    public mutating func responseHead(_ head: ResponseHead, canResendBody: Bool) -> Answer<ResponseHeadAction> {
        guard case .trying = state else { return Answer() }
        var reports = Reports()
        let command = decide(head, canResendBody: canResendBody, reporting: &reports)
        return Answer(reports: reports, command: command)
    }

    /// The try's final response head, on which a `lua` script called `res:retry()`: a failed
    /// try (reason `lua`) the retry policy decides about; without a retry left, decided as by
    /// `responseHead` (the response goes on).
    public mutating func scriptRetried(_ head: ResponseHead, canResendBody: Bool) -> Answer<ResponseHeadAction> {
        guard case .trying = state else { return Answer() }
        var reports = Reports()
        let command = decide(head, canResendBody: canResendBody, scriptRetry: true, reporting: &reports)
        return Answer(reports: reports, command: command)
    }

    /// The try's final response head is a 429 (or 503) whose pause the policy's `rate_limit`
    /// learned and will wait for (`rate_limit.learn`, `on_limit: wait`; within `max_wait` and
    /// the retry deadline): the request is tried again after it when it may be, else the head
    /// is decided as by `responseHead`.
    public mutating func heldByOrigin(_ head: ResponseHead, canResendBody: Bool) -> Answer<ResponseHeadAction> {
        guard case .trying = state else { return Answer() }
        var reports = Reports()
        if retryAfterLearnedHold(status: head.status, canResendBody: canResendBody, reporting: &reports) {
            state = .drainingDiscarded
            return Answer(reports: reports, command: .discardResponse)
        }
        let command = decide(head, canResendBody: canResendBody, reporting: &reports)
        return Answer(reports: reports, command: command)
    }

    /// The response head reached the client's output.
    public mutating func responseHeadSent(status: Int) -> Reports {
        var reports = Reports()
        summary.status = status
        if wants(.responseReceived) {
            reports.append(.responseReceived(id: id, attempt: summary.attempts, status: status))
        }
        return reports
    }

    /// Request body bytes read from the client.
    public mutating func requestBodyRead(bytes: Int) {
        summary.bytesIn += Int64(bytes)
    }

    /// Response body bytes sent to the client.
    public mutating func responseBodySent(bytes: Int) {
        summary.bytesOut += Int64(bytes)
    }

    /// A try ended (any way); its timings.
    public mutating func tryEnded(_ timings: TryTimings) -> Reports {
        var reports = Reports()
        summary.timings = timings
        if wants(.metricsCollected) {
            reports.append(.metricsCollected(id: id, attempt: summary.attempts, timings: timings))
        }
        return reports
    }

    /// The try failed before any response byte reached the client (or its TLS trust refused
    /// the origin before it started).
    public mutating func tryFailed(
        _ error: ProxyError, kind: TransportErrorKind, canResendBody: Bool
    ) -> Answer<TryFailedAction> {
        switch state {
        case .startingTry, .trying, .streaming, .checkingRedirect, .drainingRedirect, .drainingDiscarded: break
        default: return Answer()
        }
        var reports = Reports()
        if case .trustFailure(let host, let evaluator, let reason) = error {
            summary.trustFailure = (evaluator, reason)
            if wants(.trustFailed) {
                reports.append(.trustFailed(id: id, host: host, evaluator: evaluator, reason: reason))
            }
        }
        if decideRetry(.transport(kind, error), canResendBody: canResendBody, reporting: &reports) {
            return Answer(reports: reports, command: .scheduleRetry(after: backOff()))
        }
        state = .failing
        return Answer(reports: reports, command: .fail(error))
    }

    /// The body of a response that is retried was drained.
    public mutating func discardedDrained() -> ScheduleRetry? {
        guard case .drainingDiscarded = state else { return nil }
        return ScheduleRetry(after: backOff())
    }

    /// The retry timer fired.
    public mutating func retryTimerFired() -> RetryTimerAction? {
        guard case .backingOff = state else { return nil }
        if let originalModel {
            // Like Alamofire, a retried request is adapted again (a refreshed token, a new stamp).
            state = .adapting(retry: true)
            return .adapt(originalModel)
        }
        state = .startingTry
        return .buildRetry
    }

    /// The exchange is over: the response completed (`.ok`), an error was answered, the
    /// upstream failed mid-body, the client went away (`.clientAborted`), a tunnel closed.
    public mutating func ended(_ outcome: Outcome, error: String?) -> Reports {
        var reports = Reports()
        ended(outcome, error: error) { summary in
            reports.append(.ended(summary))
        }
        return reports
    }

    /// `ended(_:error:)`, with the record lent to `report` instead of copied into an event
    /// (`EventMonitor.exchangeEnded`): called when a monitor reads `.finished` (or
    /// `.tunnelClosed`, for a tunnel).
    public mutating func ended(_ outcome: Outcome, error: String?, report: (ExchangeSummary) -> Void) {
        // Stored fields read directly: through `isFinished` and `wants` the compiler copied
        // the whole machine (700 bytes, a retain per field) to read one of them.
        if case .done = state { return }
        // Scripts with only `on_request`, which kept no `ctx` (most), leave nothing to run or
        // close here: the thread's cache is not even looked up.
        // A tunnel (a CONNECT Sluice does not intercept, or the CONNECT of one it does) is no
        // exchange a script saw: its `on_log` does not run for it (the requests an interception
        // decrypts are exchanges of their own, each with its hooks).
        if outcome != .tunnel,
            policy.runsLogScripts || policy.runsResponseScripts || keepsScriptContexts || summary.lua != nil
        {
            runScriptsAtEnd()
        }
        let reported = built.contains(.ended(outcome))
        summary.outcome = outcome
        if let error { summary.error = error }
        state = .done(outcome)
        if reported { report(summary) }
    }

    /// Enters `backingOff` for the delay the retry decided; returns that delay.
    private mutating func backOff() -> Int {
        state = .backingOff(until: clock.monotonicMilliseconds() + pendingDelay)
        return pendingDelay
    }

    /// Whether a monitor reads events of `kind`: an event is built only then. (A test at the
    /// call site, not an autoclosure: capturing `self` would copy the whole machine per call.)
    @inline(__always)
    func wants(_ kind: ProxyEvent.Kinds) -> Bool {
        built.contains(kind)
    }
}
