import SluiceCore

/// The admin API's view of a connection's exchange (`GET /requests`, `POST /requests/cancel`),
/// the driver's side.
///
/// Threading: a view of its driver, made when used (it stores nothing of its own), on the
/// worker's thread (the admin API's requests reach it through `Worker`'s admin event).
struct ExchangeAdmin {
    unowned(unsafe) let driver: ExchangeDriver

    /// The exchange in flight, as `GET /requests` lists it; nil when there is none.
    func snapshot(worker index: Int) -> AdminExchange? {
        guard let exchange = driver.exchange, !exchange.ended else { return nil }
        let state: String
        switch driver.phase {
        case .dialing: state = "connecting"
        case .tunnel: state = "tunnel"
        case .awaitingBody, .bufferingBody: state = "reading_body"
        case .holding(let hold) where hold.quotaWait != nil: state = "rate_limited"
        case .resuming: state = "resuming"
        default: state = exchange.inspect { $0.state.name }
        }
        return AdminExchange(exchange, state: state, worker: index)
    }

    /// `POST /requests/cancel`: the client is told (503 `request cancelled by the proxy's
    /// operator`, then the connection closes) and the upstream transfer stops. A response
    /// that already started is cut off by closing the connection (the client sees a
    /// truncated message); a tunnel is closed.
    func cancel() {
        guard let exchange = driver.exchange, !exchange.ended else { return }
        let connection = driver.connection
        switch driver.phase {
        case .forwarding(let transfer):
            if transfer.responseStarted {
                exchange.end(.error, error: "cancelled by the proxy's operator after the response started")
                return connection.close()
            }
            transfer.cancel()
        case .dialing(let dialer):
            dialer.cancel()
        case .waitingToRetry(let timer):
            timer.stop()
        case .queued(let ticket):
            driver.worker.upstreamGate.leave(ticket)
        case .holding(let hold):
            hold.leave()
            driver.endTry(.abandoned)
            if hold.request.resumes != nil {
                // A resume waiting for its turn: the response started.
                if driver.resume?.framing == .close { connection.abortiveClose = true }
                exchange.end(.error, error: "cancelled by the proxy's operator after the response started")
                return connection.close()
            }
        case .tunnel:
            exchange.end(.tunnel, error: "cancelled by the proxy's operator")
            return connection.close()
        case .upgrading(let transfer):
            if transfer.phase != .awaitingAnswer && transfer.phase != .connecting {
                exchange.end(exchange.summary.status == 101 ? .tunnel : .error, error: "cancelled by the proxy's operator")
                return connection.close()
            }
            transfer.cancel()
        case .servingDisk, .resuming, .readingFill:
            if case .resuming(let resume) = driver.phase, resume.framing == .close { connection.abortiveClose = true }
            exchange.end(.error, error: "cancelled by the proxy's operator after the response started")
            return connection.close()
        case .idle:
            return
        case .adapting, .awaitingBody, .bufferingBody, .awaitingCollapsed:
            break
        }
        driver.phase = .idle
        connection.respondError(.cancelledByOperator)
    }
}
