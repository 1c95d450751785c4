#if canImport(Glibc)
import Glibc
#endif
import CCurl
import CLibEvent
import SluiceCore

/// The client side of a forwarded exchange, as its `UpstreamTransfer` sees it: the request
/// body read on curl's demand, the response's progress, and how the exchange ends.
/// Redirects, retries and auth challenges are in `ClientConnection+Resilience.swift`.
extension ClientConnection {
    /// A response that starts before the request body was read to its end promises to close:
    /// the rest of that body cannot be told apart from a next request without reading it.
    var keepsAliveAfterResponse: Bool { wantsKeepAlive && !worker.isDraining && requestBodyDone }

    func readRequestBody(into buffer: UnsafeMutableRawPointer, capacity: Int) throws(ProxyError) -> Int? {
        guard let exchange else { return 0 }
        return try exchange.body.read(into: buffer, capacity: capacity) { (dest, max) throws(ProxyError) -> Int? in
            let n = try self.readClientBody(into: dest, capacity: max)
            if let n { exchange.summary.bytesIn += Int64(n) }
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
        exchange.summary.status = status
        exchange.monitor?.handle(.responseReceived(id: exchange.id, attempt: exchange.summary.attempts, status: status))
    }

    func responseBodySent(bytes: Int) {
        scheduleFlush()
        exchange?.summary.bytesOut += Int64(bytes)
    }

    func tryEnded(timings: TryTimings) {
        guard let exchange else { return }
        exchange.summary.timings = timings
        exchange.monitor?.handle(.metricsCollected(id: exchange.id, attempt: exchange.summary.attempts, timings: timings))
    }

    func transferRedirected(to next: UpstreamRequest) {
        guard let exchange else { return curl_slist_free_all(next.headers) }
        if next.body != .none { exchange.body.rewindForReplay() }
        startTry(next, exchange)
    }

    func transferFinished(reusable: Bool) {
        scheduleFlush()
        exchange?.end(.ok)
        if reusable && requestBodyDone && wantsKeepAlive {
            exchangeEnded()
        } else {
            closeAfterFlush()
        }
    }

    func transferFailed(_ error: ProxyError, kind: TransportErrorKind) {
        state = .awaitingHead
        if case .trustFailure(let host, let evaluator, let reason) = error, let exchange {
            exchange.summary.trustFailure = (evaluator, reason)
            exchange.monitor?.handle(.trustFailed(id: exchange.id, host: host, evaluator: evaluator, reason: reason))
        }
        if let exchange, decideRetry(.transport(kind, error), exchange) {
            startRetryTimer(exchange)
            return
        }
        respondError(error)
    }

    func transferAborted() {
        scheduleFlush()
        exchange?.end(.upstreamAborted, error: "upstream failed after the response started")
        closeAfterFlush()
    }
}
