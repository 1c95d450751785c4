import CCurl
import CLibEvent
import SluiceCore

#if canImport(Glibc)
    import Glibc
#endif

/// The client side of a forwarded exchange, as its `UpstreamTransfer` sees it: the request
/// body read on curl's demand, the response's progress, and how the try ends — each handed to
/// the exchange's `ExchangeMachine`, whose answers (send, retry, follow, fail) are performed here.
extension ClientConnection {
    /// A response that starts before the request body was read to its end promises to close:
    /// the rest of that body cannot be told apart from a next request without reading it.
    var keepsAliveAfterResponse: Bool { wantsKeepAlive && !worker.isDraining && requestBodyDone }

    func readRequestBody(into buffer: UnsafeMutableRawPointer, capacity: Int) throws(ProxyError) -> Int? {
        guard let exchange else { return 0 }
        return try exchange.body.read(into: buffer, capacity: capacity) { (dest, max) throws(ProxyError) -> Int? in
            let n = try self.readClientBody(into: dest, capacity: max)
            if let n { _ = exchange.machine.handle(.requestBodyRead(bytes: n)) }
            return n
        }
    }

    /// Decodes client body bytes straight from the input buffer into `buffer`.
    private func readClientBody(into buffer: UnsafeMutableRawPointer, capacity: Int) throws(ProxyError) -> Int? {
        if requestBodyDone { return 0 }
        let input = clientInput
        var written = 0
        while written < capacity {
            var iov = iovec()
            let segments = evbuffer_peek(input, -1, nil, &iov, 1)
            let available = segments > 0 ? min(iov.iov_len, capacity - written) : 0
            // An empty input still lets the parser report the end of a finished body.
            let (consumed, event) = try parser.parse(UnsafeRawBufferPointer(start: iov.iov_base, count: available))
            if case .body(let range)? = event {
                (buffer + written).copyMemory(from: iov.iov_base! + range.lowerBound, byteCount: range.count)
                written += range.count
            }
            evbuffer_drain(input, consumed)
            inputConsumed()
            if case .end? = event {
                requestBodyDone = true
                return written
            }
            if consumed == 0 && event == nil { break }
        }
        return written > 0 ? written : nil
    }

    func responseStarted(status: Int) {
        scheduleFlush()
        guard let exchange else { return }
        exchange.report(exchange.machine.handle(.responseHeadSent(status: status)))
    }

    func responseBodySent(bytes: Int) {
        scheduleFlush()
        _ = exchange?.machine.handle(.responseBodySent(bytes: bytes))
    }

    func tryEnded(timings: TryTimings) {
        guard let exchange else { return }
        exchange.report(exchange.machine.handle(.tryEnded(timings)))
    }

    /// Sends the head (the plain path), drains it for a retry, or follows a redirect, as the
    /// machine decides (the answer goes to `transfer`); the machine asks only for the fields
    /// its decision needs.
    func responseHeadArrived(_ response: UpstreamResponseHead, on transfer: any UpstreamTransfer) {
        guard let exchange else { return transfer.forward(keepAlive: keepsAliveAfterResponse) }
        if exchange.circuitTry != nil { reportTryOutcome(HealthOutcome(status: response.status)) }
        let fields = exchange.inspect { $0.responseFields(for: response.status) }
        let head = ExchangeMachine.ResponseHead(
            status: response.status,
            retryAfter: fields.contains(.retryAfter) ? response.value("retry-after") : nil,
            contentType: fields.contains(.contentType) ? response.value("content-type") : nil,
            location: fields.contains(.location) ? response.value("location") : nil)
        let actions = exchange.machine.handle(.responseHead(head, canResendBody: canResendBody(exchange)))
        exchange.report(actions)
        switch actions.command {
        case .discardResponse?: transfer.discard()
        case .checkRedirect(let next)?: follow(next, exchange, transfer)
        default:
            if let cache = exchange.cache, cacheResponseHead(response, transfer, exchange, cache) { return }
            transfer.forward(keepAlive: keepsAliveAfterResponse)
        }
    }

    /// Follows a redirect the machine accepts, or forwards the 3xx to the client when its
    /// target cannot be requested.
    private func follow(_ next: ProxyRequest, _ exchange: Exchange, _ transfer: any UpstreamTransfer) {
        guard var request = try? upstreamRequest(for: next) else {
            exchange.report(exchange.machine.handle(.redirectTarget(usable: false)))
            return transfer.forward(keepAlive: keepsAliveAfterResponse)
        }
        let actions = exchange.machine.handle(.redirectTarget(usable: true))
        exchange.report(actions)
        if case .followRedirect(keepCredentials: true)? = actions.command { request.credentials = exchange.policy.credentials }
        exchange.cache?.redirected = true
        transfer.follow(request)
    }

    func transferRedirected(to next: UpstreamRequest) {
        guard let exchange else { return }
        if next.body != .none { exchange.body.rewindForReplay() }
        startTry(next, exchange)
    }

    func transferDiscarded() {
        guard let exchange else { return }
        state = .awaitingHead
        feed(.discardedDrained, exchange)
    }

    func rewindRequestBody() -> Bool {
        guard let exchange, exchange.body.canReplay(clientBodyDone: requestBodyDone) else { return false }
        exchange.body.rewindForReplay()
        return true
    }

    func transferFinished(reusable: Bool) {
        scheduleFlush()
        if exchange?.circuitTry != nil { reportTryOutcome(.abandoned) }
        if let exchange, exchange.cache != nil { cacheResponseFinished(exchange) }
        exchange?.end(.ok)
        if reusable && requestBodyDone && wantsKeepAlive {
            exchangeEnded()
        } else {
            closeAfterFlush()
        }
    }

    func transferFailed(_ error: ProxyError, kind: TransportErrorKind) {
        state = .awaitingHead
        guard let exchange else { return respondError(error) }
        if exchange.circuitTry != nil { reportTryOutcome(HealthOutcome(error: error)) }
        feed(.tryFailed(error, kind: kind, canResendBody: canResendBody(exchange)), exchange)
    }

    func transferAborted() {
        // A body framed by the connection's end would read as complete after a FIN: the
        // client is reset instead, so that a cut is never mistaken for the end.
        if case .forwarding(let transfer) = state, transfer.framedByClose { abortiveClose = true }
        scheduleFlush()
        if exchange?.circuitTry != nil { reportTryOutcome(.abandoned) }
        exchange?.end(.upstreamAborted, error: "upstream failed after the response started")
        closeAfterFlush()
    }
}
