/// What the machine decides about a response head and a failed try: validation, retries
/// (retriers in order, then what only the engine knows: a replayable body, the deadline, the
/// budget), redirects, and the per-try timeout. Everything here happens before the first
/// response byte reaches the client (DESIGN §2): a response that is retried or followed is
/// drained, never forwarded.
extension ExchangeMachine {
    /// The response fields `responseHead` needs for `status`: `Retry-After` for a status the
    /// retry policy retries, `Content-Type` when the policy validates, `Location` for a 3xx
    /// the policy may follow. None for a plain request (no header lookups on that path).
    public func responseFields(for status: Int) -> ResponseFields {
        var fields: ResponseFields = []
        if let retry = policy.retryPolicy, retry.statuses.contains(status) { fields.insert(.retryAfter) }
        if policy.validator != nil { fields.insert(.contentType) }
        if (300..<400).contains(status), policy.redirector.follows, model != nil { fields.insert(.location) }
        return fields
    }

    /// The per-try timeout: the policy's, else the server's, cut to what is left of the retry
    /// deadline. nil when the deadline has passed.
    func perTryTimeout() -> Int? {
        let retry = policy.retryPolicy
        var timeout = retry?.perTryTimeout ?? defaultPerTryTimeout
        if let deadline = retry?.deadline {
            let left = deadline - elapsed
            guard left > 0 else { return nil }
            timeout = min(timeout, left)
        }
        return timeout
    }

    /// A response head: retried (a status the policy retries, an OAuth `refresh_on` status, a
    /// validation failure, a script's `res:retry()`), followed (a 3xx the policy follows), or passed on unchanged.
    /// A `101` (an upgrade the policy carries, `upgrades:`) is its handshake's success: it is
    /// passed on, never validated or retried.
    mutating func decide(
        _ head: ResponseHead, canResendBody: Bool, scriptRetry: Bool = false, reporting reports: inout Reports
    ) -> ResponseHeadAction {
        let status = head.status
        if status == 101 {
            state = .streaming
            return .sendResponse
        }
        var failure: TryFailure?
        if let retry = policy.retryPolicy, retry.statuses.contains(status) {
            failure = .status(status, retryAfterMilliseconds: retryAfterMilliseconds(head.retryAfter))
        }
        if failure == nil, policy.refreshStatuses.contains(status) {
            failure = .status(status, retryAfterMilliseconds: nil)
        }
        if let validator = policy.validator {
            let why = validator.validate(status: status, contentType: head.contentType)
            summary.validation = why
            if let why, failure == nil { failure = .validation(status: status, reason: why) }
        }
        if failure == nil, scriptRetry { failure = .script(status: status) }
        if let failure, decideRetry(failure, canResendBody: canResendBody, reporting: &reports) {
            state = .drainingDiscarded
            return .discardResponse
        }
        if (300..<400).contains(status), let location = head.location,
            let next = redirect(status: status, location: location, canResendBody: canResendBody)
        {
            state = .checkingRedirect(next: next, status: status)
            return .checkRedirect(next)
        }
        state = .streaming
        return .sendResponse
    }

    private func retryAfterMilliseconds(_ value: String?) -> Int? {
        guard let value, let after = RetryAfter(value) else { return nil }
        return after.milliseconds(wallClockNow: after.isDate ? clock.wallClockMilliseconds() : 0)
    }

    // MARK: redirects

    /// The next request for a redirect the policy follows, or nil to pass the 3xx on (not
    /// followed, past the hop limit, not http(s), or a body that cannot be sent again).
    private func redirect(status: Int, location: String, canResendBody: Bool) -> ProxyRequest? {
        guard let model, policy.redirector.follows else { return nil }
        let resolved = Redirector.resolve(location, against: target.url)
        guard let next = policy.redirector.redirect(model, status: status, location: resolved, hops: summary.redirects)
        else { return nil }
        if next.body != .none && !canResendBody { return nil }
        return next
    }

    /// The answer to `checkRedirect`: whether its target can be requested.
    public mutating func redirectTarget(usable: Bool) -> Answer<RedirectTargetAction> {
        guard case .checkingRedirect(let next, let status) = state else { return Answer() }
        guard usable else {
            state = .streaming
            return Answer(reports: Reports(), command: .sendResponse)
        }
        // Credentials go only to the host they were configured for.
        let keepCredentials = URLParts(next.url).host == target.host
        summary.redirects += 1
        model = next
        state = .drainingRedirect
        var reports = Reports()
        if wants(.redirectFollowed) {
            reports.append(.redirectFollowed(id: id, status: status, location: next.url, hop: summary.redirects))
        }
        return Answer(reports: reports, command: .followRedirect(keepCredentials: keepCredentials))
    }

    // MARK: retries

    /// Asks the retriers about `failure` (Alamofire's order: until one answers other than
    /// `.doNotRetry`), then checks what only the engine knows: the body can be sent again,
    /// the delay ends before the deadline, the host's budget has a retry left. On yes, the
    /// retry is recorded (`summary.retries`, `.retrying`) and its delay kept for the backoff.
    mutating func decideRetry(_ failure: TryFailure, canResendBody: Bool, reporting reports: inout Reports) -> Bool {
        guard !policy.interceptor.retriers.isEmpty else { return false }
        let request = model ?? ProxyRequest(id: id, method: summary.method, url: target.url, headerFields: [:], body: .none)
        var answer: RetryResult?
        policy.interceptor.retry(request, dueTo: failure, attempt: summary.retries.count, using: &random) { answer = $0 }
        let delay: Int
        switch answer {
        case .retry?: delay = 0
        case .retryWithDelay(let ms)?: delay = ms
        case .doNotRetryWithError(let reason)?:
            stopRetrying(reason, reporting: &reports)
            return false
        case .doNotRetry?, nil:
            return false
        }
        guard canResendBody else {
            stopRetrying(.bufferLimit, reporting: &reports)
            return false
        }
        if let deadline = policy.retryPolicy?.deadline, elapsed + delay >= deadline {
            stopRetrying(.deadline, reporting: &reports)
            return false
        }
        if let budgets = policy.retryBudgets,
            !budgets.budget(for: target.host).tryAcquireRetry(now: clock.monotonicMilliseconds())
        {
            stopRetrying(.budget, reporting: &reports)
            return false
        }
        let record = RetryRecord(attempt: summary.retries.count + 1, delayMilliseconds: delay, reason: failure.reason)
        summary.retries.append(record)
        pendingDelay = delay
        if wants(.retrying) { reports.append(.retrying(id: id, record: record)) }
        return true
    }

    /// The origin answered 429 (or 503, for a method that may be repeated) and asked for a
    /// pause the policy's `rate_limit` learned and waits for (`heldByOrigin`): the request is
    /// tried again (its next try waits in `QuotaStage` for the hold to end), so the client
    /// never sees that answer — at most `maxLearnedRetries` times, when the body can be sent
    /// again. Not a failure: no retrier is asked and no budget is spent.
    mutating func retryAfterLearnedHold(status: Int, canResendBody: Bool, reporting reports: inout Reports) -> Bool {
        guard canResendBody, status == 429 || Self.repeatable(summary.method) else { return false }
        let reason = "rate_limit \(status)"
        let earlier = summary.retries.lazy.filter { $0.reason.hasPrefix("rate_limit ") }.count
        guard earlier < Self.maxLearnedRetries else { return false }
        let record = RetryRecord(attempt: summary.retries.count + 1, delayMilliseconds: 0, reason: reason)
        summary.retries.append(record)
        pendingDelay = 0
        if wants(.retrying) { reports.append(.retrying(id: id, record: record)) }
        return true
    }

    /// Tries sent again after an origin's learned 429 or 503, per exchange.
    static let maxLearnedRetries = 3

    /// Methods a 503 may repeat (RFC 9110 §9.2.2: idempotent).
    static func repeatable(_ method: String) -> Bool {
        ["GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"].contains(method)
    }

    private mutating func stopRetrying(_ reason: RetryStopReason, reporting reports: inout Reports) {
        summary.retryStopped = reason
        if wants(.retryStopped) { reports.append(.retryStopped(id: id, reason: reason)) }
    }
}
