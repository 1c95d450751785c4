import SluiceCore

/// Upgrades (`upgrades:`), the driver's side: the handshake is an exchange like any other —
/// adapters, the machine's decisions on the answer's head (a retry, a redirect that is not
/// followed), circuit breaking (the answer's status or the failure is the try's outcome), the
/// access-log line — whose `101` turns the client connection into a byte tunnel; its line is
/// written when the tunnel ends, with status 101 and the bytes both ways. `UpgradeTransfer`
/// reports here (`connection.driver.upgrades`).
///
/// Threading: a view of its driver, made when used (it stores nothing of its own), on the
/// worker's thread.
struct UpgradeExchange {
    unowned(unsafe) let driver: ExchangeDriver

    /// The machine's view of an upgrade's answer: false when it asks for a retry (the transfer
    /// is then cancelled and the exchange goes on), else true: relay it.
    private func decide(_ head: ResponseHeadCollector, _ transfer: UpgradeTransfer, _ exchange: Exchange) -> Bool {
        driver.endTry(.answered(status: head.status))
        let answer = exchange.machine.responseHead(
            ResponseDecisionStage.machineHead(head, exchange), canResendBody: true)
        exchange.report(answer.reports)
        switch answer.command {
        case .discardResponse?:
            let timings = transfer.timings()
            transfer.cancel()
            exchange.report(exchange.machine.tryEnded(timings))
            driver.phase = .idle
            driver.discardedDrained(exchange)
            return false
        case .checkRedirect?:
            // An upgrade's redirect is the client's to follow.
            exchange.report(exchange.machine.redirectTarget(usable: false).reports)
            return true
        case .sendResponse?, nil:
            return true
        }
    }

    /// `101`: its head goes to the client and the tunnel opens. False when the try ended instead.
    func switched(_ head: ResponseHeadCollector, on transfer: UpgradeTransfer) -> Bool {
        guard let exchange = driver.exchange else { return false }
        guard decide(head, transfer, exchange) else { return false }
        do {
            try ResponseEncoder.switchingProtocols(head, viaLine: driver.worker.viaLine, into: driver.connection.clientOutput)
        } catch {
            failed(
                .upstreamProtocol(host: transfer.target.authority, reason: "invalid 101: \(error.reason)"),
                kind: .other, timings: transfer.timings(), cancelling: transfer)
            return false
        }
        exchange.report(exchange.machine.tryEnded(transfer.timings()))
        exchange.report(exchange.machine.responseHeadSent(status: 101))
        exchange.monitor?.handle(
            .tunnelOpened(id: exchange.id, client: driver.connection.peer, authority: transfer.target.authority))
        driver.connection.wantsKeepAlive = false
        // A tunnel holds no upstream slot (`limits.max_in_flight_upstream`), as a CONNECT's
        // does not: a long-lived WebSocket must not starve the requests.
        driver.releaseUpstreamSlot()
        driver.connection.scheduleFlush()
        driver.connection.setReading(true)
        return true
    }

    /// A final answer other than `101`: its head goes to the client (which the connection
    /// closes after the answer), with the framing chosen for it; nil when the try ended instead.
    func answered(_ head: ResponseHeadCollector, on transfer: UpgradeTransfer) -> ResponseEncoder.Framing? {
        guard let exchange = driver.exchange else { return nil }
        guard decide(head, transfer, exchange) else { return nil }
        let framing: ResponseEncoder.Framing
        do {
            framing = try ResponseEncoder.forwardedHead(
                head, isHeadRequest: false, clientMinorVersion: 1, keepAlive: false,
                viaLine: driver.worker.viaLine, into: driver.connection.clientOutput)
        } catch {
            failed(
                .upstreamProtocol(host: transfer.target.authority, reason: "invalid response head: \(error.reason)"),
                kind: .other, timings: transfer.timings(), cancelling: transfer)
            return nil
        }
        exchange.report(exchange.machine.tryEnded(transfer.timings()))
        exchange.report(exchange.machine.responseHeadSent(status: head.status))
        driver.connection.wantsKeepAlive = false
        driver.connection.scheduleFlush()
        return framing
    }

    /// The non-101 answer was relayed whole.
    func answerFinished() {
        driver.exchange?.end(.ok)
        driver.connection.closeAfterFlush()
    }

    /// The non-101 answer broke off after its head reached the client.
    func aborted(reason: String) {
        driver.exchange?.end(.upstreamAborted, error: reason)
        driver.connection.closeAfterFlush()
    }

    /// The tunnel ended: the origin closed (`error` nil), failed, or sat idle.
    func ended(error: String?) {
        driver.exchange?.end(.tunnel, error: error)
        driver.connection.closeAfterFlush()
    }

    /// The try failed before any byte reached the client: the machine decides (a retry, or
    /// Sluice's error response).
    func failed(
        _ error: ProxyError, kind: TransportErrorKind, timings: TryTimings,
        cancelling transfer: UpgradeTransfer? = nil
    ) {
        transfer?.cancel()
        driver.phase = .idle
        guard let exchange = driver.exchange else { return driver.connection.respondError(error) }
        driver.endTry(.failed(error))
        exchange.report(exchange.machine.tryEnded(timings))
        driver.tryFailed(error, kind: kind, canResendBody: true, exchange)
    }
}

/// A CONNECT's tunnel, the driver's side: the dialler's and the tunnel's reports
/// (`TunnelDialer`, `Tunnel`, and an upgrade's tunnel for its byte counts).
///
/// Threading: a view of its driver, made when used, on the worker's thread.
struct TunnelExchange {
    unowned(unsafe) let driver: ExchangeDriver

    /// The CONNECT destination answered: tell the client and start relaying.
    func established(fd: Int32) {
        let tunnel = Tunnel(connection: driver.connection, upstreamFD: fd)
        driver.phase = .tunnel(tunnel)
        if let exchange = driver.exchange {
            exchange.summary.status = 200
            exchange.summary.attempts = 1
            exchange.monitor?.handle(
                .tunnelOpened(id: exchange.id, client: driver.connection.peer, authority: exchange.target.authority))
        }
        ResponseEncoder.connectEstablished(into: driver.connection.clientOutput)
        driver.connection.scheduleFlush()
        driver.connection.setReading(true)
        tunnel.clientReadable()  // bytes the client sent early (a TLS ClientHello) go first
    }

    /// Byte accounting for the access log's tunnel line (a CONNECT's or an upgrade's).
    func moved(up: Int, down: Int) {
        guard let exchange = driver.exchange else { return }
        exchange.summary.bytesIn += Int64(up)
        exchange.summary.bytesOut += Int64(down)
    }

    func failed(_ error: ProxyError) {
        driver.phase = .idle
        driver.connection.respondError(error)
    }
}
