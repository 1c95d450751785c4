#if canImport(Glibc)
import Glibc
#endif
import CCurl
import CLibEvent
import SluiceCore

/// Retries, validation, redirects and auth challenges: what happens between a try's result
/// and the client. Everything here runs before the first response byte reaches the client
/// (DESIGN §2): a response that is retried or followed is drained, never forwarded.
extension ClientConnection {
    /// Bodies up to this are kept to follow a 307/308 or answer an auth challenge when the
    /// policy has no `retry.buffer_limit` (1 MiB).
    static let defaultReplayLimit = 1 << 20

    static func replayLimit(_ policy: HostPolicy) -> Int {
        if let retry = policy.retryPolicy { return retry.bufferLimit }
        let mayResend = policy.redirector.follows || policy.credentials != nil || !policy.refreshStatuses.isEmpty
        return mayResend ? defaultReplayLimit : 0
    }

    /// A retryable request with a small body is read whole before its first try, so every
    /// try (and an auth challenge's second round) can send it again.
    func shouldBufferWholeBody(_ head: HTTPRequestHead, _ exchange: Exchange) -> Bool {
        guard case .length(let n) = head.framing, n > 0, n <= Int64(exchange.body.replayLimit) else { return false }
        if let retry = exchange.policy.retryPolicy, retry.methods.contains(exchange.model?.method ?? head.method) {
            return true
        }
        let policy = exchange.policy
        return policy.credentials != nil || !policy.refreshStatuses.isEmpty || policy.redirector.follows
    }

    /// Reads the body into the replay buffer; starts the first try once it is complete.
    func continueBuffering(_ head: HTTPRequestHead, _ exchange: Exchange) {
        var scratch = [UInt8](repeating: 0, count: 64 * 1024)
        while true {
            let n: Int?
            do {
                n = try scratch.withUnsafeMutableBytes { raw in
                    try readRequestBodyOrThrow(into: raw.baseAddress!, capacity: raw.count)
                }
            } catch let error as ProxyError {
                return respondError(error)
            } catch {
                return respondError(.malformedRequest("\(error)"))
            }
            guard let n else {
                state = .bufferingBody(head, exchange)
                return
            }
            if n == 0 { break }
        }
        exchange.body.rewindForReplay()
        do {
            startTry(try upstreamRequest(head, exchange), exchange)
        } catch {
            respondError(error)
        }
    }

    private func readRequestBodyOrThrow(into buffer: UnsafeMutableRawPointer, capacity: Int) throws -> Int? {
        try readRequestBody(into: buffer, capacity: capacity)
    }

    /// The per-try timeout: the policy's, else the server's, cut to what is left of the
    /// retry deadline. nil when the deadline has passed.
    func perTryTimeout(_ exchange: Exchange) -> Int? {
        let retry = exchange.policy.retryPolicy
        var timeout = retry?.perTryTimeout ?? worker.config.timeouts.upstreamPerTry
        if let deadline = retry?.deadline {
            let left = deadline - exchange.elapsedMilliseconds
            guard left > 0 else { return nil }
            timeout = min(timeout, left)
        }
        return timeout
    }

    // MARK: deciding

    /// Asks the retriers about `failure`, then checks what only the engine knows: the body
    /// can be replayed, the deadline leaves room, the budget has a retry left. On yes, the
    /// retry is recorded and its delay kept for `startRetryTimer`.
    func decideRetry(_ failure: TryFailure, _ exchange: Exchange) -> Bool {
        let policy = exchange.policy
        guard !policy.interceptor.retriers.isEmpty, let head = currentHead else { return false }
        let request = exchange.model ?? ProxyRequest(id: exchange.id, method: head.method, url: exchange.target.url,
                                                     headerFields: [:], body: .none)
        var answer: RetryResult?
        policy.interceptor.retry(request, dueTo: failure, attempt: exchange.retryCount) { answer = $0 }
        let delay: Int
        switch answer {
        case .retry?: delay = 0
        case .retryWithDelay(let ms)?: delay = ms
        case .doNotRetryWithError(let why)?:
            stopRetrying(exchange, why)
            return false
        case .doNotRetry?, nil:
            return false
        }
        if head.hasBody && !exchange.body.canReplay(clientBodyDone: requestBodyDone) {
            stopRetrying(exchange, .bufferLimit)
            return false
        }
        if let deadline = policy.retryPolicy?.deadline, exchange.elapsedMilliseconds + delay >= deadline {
            stopRetrying(exchange, .deadline)
            return false
        }
        if let budgets = policy.retryBudgets, !budgets.budget(for: exchange.target.host).tryAcquireRetry() {
            stopRetrying(exchange, .budget)
            return false
        }
        exchange.retryCount += 1
        let record = RetryRecord(attempt: exchange.retryCount, delayMilliseconds: delay, reason: failure.reason)
        exchange.summary.retries.append(record)
        exchange.pendingRetryDelay = delay
        exchange.monitor?.handle(.retrying(id: exchange.id, record: record))
        return true
    }

    private func stopRetrying(_ exchange: Exchange, _ why: RetryStopReason) {
        exchange.summary.retryStopped = why
        exchange.monitor?.handle(.retryStopped(id: exchange.id, reason: why))
    }

    func startRetryTimer(_ exchange: Exchange) {
        let ms = exchange.pendingRetryDelay
        let timer = event_new(worker.base, -1, 0, { _, _, arg in
            Unmanaged<ClientConnection>.fromOpaque(arg!).takeUnretainedValue().retryTimerFired()
        }, Unmanaged.passUnretained(self).toOpaque())!
        state = .waitingToRetry(timer)
        var tv = timeval(tv_sec: ms / 1000, tv_usec: (ms % 1000) * 1000)
        event_add(timer, &tv)
    }

    private func retryTimerFired() {
        guard case .waitingToRetry(let timer) = state, let exchange, let head = currentHead else { return }
        event_free(timer)
        state = .awaitingHead
        if head.hasBody { exchange.body.rewindForReplay() }
        // Like Alamofire, a retried request is adapted again (a refreshed token, a new stamp).
        guard let original = exchange.originalModel else { return startRetry(head, exchange) }
        state = .adapting
        exchange.policy.interceptor.adapt(original, for: worker.sessionContext) { [weak self] result in
            guard let self, self.exchange === exchange, case .adapting = self.state else { return }
            self.state = .awaitingHead
            switch result {
            case .success(let adapted):
                exchange.model = adapted
                self.startRetry(head, exchange)
            case .failure(let error):
                exchange.monitor?.handle(.adaptationFailed(id: exchange.id, error: error))
                self.respondError(.adapterFailed(name: error.adapter, reason: error.reason))
            }
        }
    }

    private func startRetry(_ head: HTTPRequestHead, _ exchange: Exchange) {
        do {
            startTry(try upstreamRequest(head, exchange), exchange)
        } catch {
            respondError(error)
        }
    }

    // MARK: UpstreamTransferDelegate

    func disposition(of response: UpstreamResponseHead) -> UpstreamTransfer.Disposition {
        guard let exchange else { return .send }
        let policy = exchange.policy
        var failure: TryFailure?
        if let retry = policy.retryPolicy, retry.statuses.contains(response.status) {
            failure = .status(response.status, retryAfterMilliseconds: RetryAfter.milliseconds(response.value("retry-after")))
        }
        if failure == nil, policy.refreshStatuses.contains(response.status) {
            failure = .status(response.status, retryAfterMilliseconds: nil)
        }
        if let validator = policy.validator {
            let why = validator.validate(status: response.status, contentType: response.value("content-type"))
            exchange.summary.validation = why
            if let why, failure == nil { failure = .validation(status: response.status, reason: why) }
        }
        if let failure, decideRetry(failure, exchange) { return .discard }
        if (300..<400).contains(response.status), let location = response.value("location"),
           let next = redirect(status: response.status, location: location) {
            return .redirect(next)
        }
        return .send
    }

    /// The next request for a redirect the policy follows, or nil to pass it on.
    private func redirect(status: Int, location: String) -> UpstreamRequest? {
        guard let exchange, let model = exchange.model, exchange.policy.redirector.follows else { return nil }
        let resolved = Redirector.resolve(location, against: exchange.target.url)
        guard let next = exchange.policy.redirector.redirect(model, status: status, location: resolved, hops: exchange.hops)
        else { return nil }
        if next.body != .none && !exchange.body.canReplay(clientBodyDone: requestBodyDone) { return nil }
        guard var request = try? upstreamRequest(for: next) else { return nil }
        // Credentials go only to the host they were configured for.
        if URLParts(next.url).host == exchange.target.host { request.credentials = exchange.policy.credentials }
        exchange.hops += 1
        exchange.summary.redirects = exchange.hops
        exchange.model = next
        exchange.monitor?.handle(.redirectFollowed(id: exchange.id, status: status, location: next.url, hop: exchange.hops))
        return request
    }

    func transferDiscarded() {
        guard let exchange else { return }
        state = .awaitingHead
        startRetryTimer(exchange)
    }

    func rewindRequestBody() -> Bool {
        guard let exchange, exchange.body.canReplay(clientBodyDone: requestBodyDone) else { return false }
        exchange.body.rewindForReplay()
        return true
    }
}

/// `Retry-After` (RFC 9110 §10.2.3): delay-seconds or an HTTP-date.
enum RetryAfter {
    static func milliseconds(_ value: String?) -> Int? {
        guard let value = value?.trimmingCharacters(in: " \t") , !value.isEmpty else { return nil }
        if value.allSatisfy(\.isNumber) {
            guard let seconds = Int(value), seconds <= 86_400 else { return nil }
            return seconds * 1000
        }
        // IMF-fixdate: "Sun, 06 Nov 1994 08:49:37 GMT"
        let parts = value.split(separator: " ")
        let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
        guard parts.count == 6, parts[5] == "GMT", let day = Int(parts[1]),
              let month = months.firstIndex(of: String(parts[2])), let year = Int(parts[3]) else { return nil }
        let clock = parts[4].split(separator: ":").compactMap { Int($0) }
        guard clock.count == 3 else { return nil }
        var tm = Glibc.tm()
        tm.tm_year = Int32(year - 1900)
        tm.tm_mon = Int32(month)
        tm.tm_mday = Int32(day)
        tm.tm_hour = Int32(clock[0])
        tm.tm_min = Int32(clock[1])
        tm.tm_sec = Int32(clock[2])
        let when = timegm(&tm)
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        let deltaMs = (Int(when) - now.tv_sec) * 1000 - now.tv_nsec / 1_000_000
        return max(0, deltaMs)
    }
}

extension String {
    func trimmingCharacters(in set: String) -> String {
        var s = Substring(self)
        while let c = s.first, set.contains(c) { s = s.dropFirst() }
        while let c = s.last, set.contains(c) { s = s.dropLast() }
        return String(s)
    }
}
