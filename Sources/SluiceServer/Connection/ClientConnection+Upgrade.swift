import CLibEvent
import SluiceCore

/// Upgrades (`upgrades:`): the connection's side of an `UpgradeTransfer`. The handshake is an
/// exchange like any other — adapters, the machine's decisions on the answer's head (a
/// retry, a redirect that is not followed), circuit breaking (`health:`: the answer's status
/// or the failure is the try's outcome), the access-log line — whose `101` turns the
/// client connection into a byte tunnel; its line is written when the tunnel ends, with
/// status 101 and the bytes both ways.
extension ClientConnection {
    /// The `Upgrade` value to forward for `head` under `policy`, when the request asks for an
    /// upgrade the policy allows: HTTP/1.1, `Connection: upgrade`, no body.
    func allowedUpgrade(_ head: HTTPRequestHead, _ policy: HostPolicy) -> String? {
        guard !head.connectionTokens.isEmpty, head.minorVersion == 1, !head.hasBody else { return nil }
        let offered = head.upgradeValues
        guard !offered.isEmpty else { return nil }
        return policy.upgrades.forwardedValue(offering: offered)
    }

    /// Starts a try of an upgrade (called by `startTry` once the machine began it).
    func startUpgrade(_ request: UpstreamRequest, upgrade: String, perTryTimeout: Int, _ exchange: Exchange) {
        let transfer = UpgradeTransfer(
            connection: self, request: request, upgrade: upgrade,
            idleTimeout: exchange.policy.upgrades.idleTimeout, config: worker.config)
        state = .upgrading(transfer)
        transfer.start(perTryTimeout: perTryTimeout)
    }

    /// The machine's view of the answer's head: nil when it asks for a retry (the transfer is
    /// then cancelled and the exchange goes on), else whether to relay it.
    private func decide(_ head: ResponseHeadCollector, _ transfer: UpgradeTransfer, _ exchange: Exchange) -> Bool {
        if exchange.circuitTry != nil { reportTryOutcome(HealthOutcome(status: head.status)) }
        let fields = exchange.inspect { $0.responseFields(for: head.status) }
        let response = ExchangeMachine.ResponseHead(
            status: head.status,
            retryAfter: fields.contains(.retryAfter) ? head.value("retry-after") : nil,
            contentType: fields.contains(.contentType) ? head.value("content-type") : nil,
            location: fields.contains(.location) ? head.value("location") : nil)
        let actions = exchange.machine.handle(.responseHead(response, canResendBody: true))
        exchange.report(actions)
        switch actions.command {
        case .discardResponse?:
            let timings = transfer.timings()
            transfer.cancel()
            exchange.report(exchange.machine.handle(.tryEnded(timings)))
            state = .awaitingHead
            feed(.discardedDrained, exchange)
            return false
        case .checkRedirect?:
            // An upgrade's redirect is the client's to follow.
            exchange.report(exchange.machine.handle(.redirectTarget(usable: false)))
            return true
        default:
            return true
        }
    }

    /// `101`: its head goes to the client and the tunnel opens. False when the try ended instead.
    func upgradeSwitched(_ head: ResponseHeadCollector, on transfer: UpgradeTransfer) -> Bool {
        guard let exchange else { return false }
        guard decide(head, transfer, exchange) else { return false }
        do {
            try ResponseEncoder.switchingProtocols(head, viaLine: worker.viaLine, into: clientOutput)
        } catch {
            upgradeFailed(
                .upstreamProtocol(host: transfer.target.authority, reason: "invalid 101: \(error.reason)"),
                kind: .other, timings: transfer.timings(), cancelling: transfer)
            return false
        }
        exchange.report(exchange.machine.handle(.tryEnded(transfer.timings())))
        exchange.report(exchange.machine.handle(.responseHeadSent(status: 101)))
        exchange.monitor?.handle(.tunnelOpened(id: exchange.id, client: peer, authority: transfer.target.authority))
        wantsKeepAlive = false
        // A tunnel holds no upstream slot (`limits.max_in_flight_upstream`), as a CONNECT's
        // does not: a long-lived WebSocket must not starve the requests.
        releaseUpstreamSlot()
        scheduleFlush()
        setReading(true)
        return true
    }

    /// A final answer other than `101`: its head goes to the client (which the connection
    /// closes after the answer), with the framing chosen for it; nil when the try ended instead.
    func upgradeAnswered(_ head: ResponseHeadCollector, on transfer: UpgradeTransfer) -> ResponseEncoder.Framing? {
        guard let exchange else { return nil }
        guard decide(head, transfer, exchange) else { return nil }
        let framing: ResponseEncoder.Framing
        do {
            framing = try ResponseEncoder.forwardedHead(
                head, isHeadRequest: false, clientMinorVersion: 1, keepAlive: false,
                viaLine: worker.viaLine, into: clientOutput)
        } catch {
            upgradeFailed(
                .upstreamProtocol(host: transfer.target.authority, reason: "invalid response head: \(error.reason)"),
                kind: .other, timings: transfer.timings(), cancelling: transfer)
            return nil
        }
        exchange.report(exchange.machine.handle(.tryEnded(transfer.timings())))
        exchange.report(exchange.machine.handle(.responseHeadSent(status: head.status)))
        wantsKeepAlive = false
        scheduleFlush()
        return framing
    }

    /// The non-101 answer was relayed whole.
    func upgradeAnswerFinished() {
        exchange?.end(.ok)
        closeAfterFlush()
    }

    /// The non-101 answer broke off after its head reached the client.
    func upgradeAborted(reason: String) {
        exchange?.end(.upstreamAborted, error: reason)
        closeAfterFlush()
    }

    /// The tunnel ended: the origin closed (`error` nil), failed, or sat idle.
    func upgradeEnded(error: String?) {
        exchange?.end(.tunnel, error: error)
        closeAfterFlush()
    }

    /// The try failed before any byte reached the client: the machine decides (a retry, or
    /// Sluice's error response).
    func upgradeFailed(
        _ error: ProxyError, kind: TransportErrorKind, timings: TryTimings,
        cancelling transfer: UpgradeTransfer? = nil
    ) {
        transfer?.cancel()
        state = .awaitingHead
        guard let exchange else { return respondError(error) }
        if exchange.circuitTry != nil { reportTryOutcome(HealthOutcome(error: error)) }
        exchange.report(exchange.machine.handle(.tryEnded(timings)))
        feed(.tryFailed(error, kind: kind, canResendBody: true), exchange)
    }
}
