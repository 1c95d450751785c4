import SluiceCore

/// The response stages' verdicts on a try's response, performed: on its head as it arrives
/// (`responseHeadArrived`), and on its body when a script reads it (`read_response_body`,
/// docs/scripting.md): `LuaResponseStage` then had the transfer keep the body
/// (`UpstreamTransfer.collect`), and the stages from the scripts on run again once it is kept
/// (`ResponseChain.runBody`).
///
/// A whole kept body is answered here, the try having ended: a retry (`res:retry()`, or a
/// status the policy retries) waits for its backoff, a redirect is followed, a script's failed
/// call fails the try, and otherwise the client gets the head (the scripts' edits kept) with
/// the body — the script's replacement, or the body as it came — framed by its own
/// `Content-Length` (`ResponseEncoder.keptBodyAnswer`). A body over the limit is decided on
/// mid-body, as a head: the transfer forwards it after all (the body kept so far, then the
/// rest), drains it, or refuses it.
///
/// Threading: as `ExchangeDriver`: the connection's worker thread.
extension ExchangeDriver {
    /// Performs a response stage's verdict about the head `transfer` asked about.
    @inline(__always)
    func perform(_ verdict: ResponseVerdict, on transfer: any UpstreamTransfer, _ exchange: Exchange) {
        switch verdict {
        case .proceed: transfer.forward(keepAlive: connection.keepsAliveAfterResponse)
        case .discard: transfer.discard()
        case .follow(let next):
            if let request = redirect(to: next, exchange) {
                transfer.follow(request)
            } else {
                transfer.forward(keepAlive: connection.keepsAliveAfterResponse)
            }
        case .handled: return
        }
    }

    /// The request a redirect the machine accepts goes on with; nil when the 3xx goes to the
    /// client instead (its target cannot be requested, or the machine says so).
    private func redirect(to next: ProxyRequest, _ exchange: Exchange) -> UpstreamRequest? {
        guard var request = try? tries.request(for: next) else {
            exchange.report(exchange.machine.redirectTarget(usable: false).reports)
            return nil
        }
        let answer = exchange.machine.redirectTarget(usable: true)
        exchange.report(answer.reports)
        guard case .followRedirect(let keepCredentials)? = answer.command else { return nil }
        if keepCredentials { request.credentials = exchange.policy.credentials }
        exchange.cache?.redirected = true
        return request
    }

    func transferCollected(_ head: UpstreamResponseHead, body: [UInt8]) {
        guard let exchange, case .forwarding(let transfer) = phase else { return }
        phase = .idle
        var context = ResponseHeadContext(response: head, transfer: transfer, canResendBody: canResendBody(exchange))
        context.heldByOrigin = exchange.keptHeldByOrigin
        let kept = KeptBody(.whole(body))
        context.kept = kept
        switch ResponseChain.runBody(&context, exchange, worker) {
        case .proceed:
            answer(context, kept, exchange)
        case .discard:
            discardedDrained(exchange)
        case .follow(let next):
            if let request = redirect(to: next, exchange) {
                transferRedirected(to: request)
            } else {
                answer(context, kept, exchange)
            }
        case .handled:
            if let error = kept.refusal { transferFailed(error, kind: .other) }
        }
    }

    func collectionOverflowed(_ head: UpstreamResponseHead, on transfer: any UpstreamTransfer) {
        guard let exchange else { return transfer.forward(keepAlive: connection.keepsAliveAfterResponse) }
        var context = ResponseHeadContext(response: head, transfer: transfer, canResendBody: canResendBody(exchange))
        context.heldByOrigin = exchange.keptHeldByOrigin
        context.kept = KeptBody(.overLimit)
        perform(ResponseChain.runBody(&context, exchange, worker), on: transfer, exchange)
    }

    /// Answers the client with a whole kept body's response: its head as the scripts left it,
    /// re-framed for the body they left. The exchange then ends as a forwarded one does.
    private func answer(_ context: ResponseHeadContext, _ kept: KeptBody, _ exchange: Exchange) {
        guard case .whole(let body) = kept.content else { return }
        let keepAlive = connection.keepsAliveAfterResponse
        do {
            try ResponseEncoder.keptBodyAnswer(
                context.response.collected, body: body, replacedBody: kept.replaced,
                isHeadRequest: exchange.head.method == "HEAD",
                clientMinorVersion: exchange.head.minorVersion, keepAlive: keepAlive, viaLine: worker.viaLine,
                into: connection.clientOutput)
        } catch {
            let host = context.transfer.target.authority
            return transferFailed(.upstreamProtocol(host: host, reason: "invalid response head: \(error.reason)"), kind: .other)
        }
        responseStarted(status: context.response.status)
        responseBodySent(bytes: body.count)
        transferFinished(reusable: keepAlive)
    }
}
