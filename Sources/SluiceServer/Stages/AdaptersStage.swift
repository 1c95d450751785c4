import SluiceCore

/// `adapters` (docs/configuration.md, "Adapters"): the policy's interceptor adapts the request
/// — headers, bearer and API keys, OAuth 2 tokens, deflate — on a request model built only
/// when one is needed; adapters that only edit header fields are applied as the upstream
/// header list is built, with no model at all. Whether they run is the `ExchangeMachine`'s to
/// decide. An adapter that must wait (a token fetch) answers later on this thread; the
/// request waits meanwhile (`StageWait.adaptation`).
enum AdaptersStage: RequestStage {
    static var name: String { "adapters" }

    static func enter(_ exchange: Exchange, _ services: any StageServices) -> StageVerdict {
        var model: ProxyRequest?
        if exchange.inspect({ $0.needsRequestModel }) {
            let head = exchange.head
            var fields = ForwardedHeaders.forwardedFields(of: head, forwarding: exchange.client.forwarding)
            if let generated = exchange.generatedRequestId { fields[ForwardedHeaders.requestIdName] = generated }
            model = ProxyRequest(
                id: exchange.id, method: head.method, url: exchange.target.url,
                headerFields: fields, body: Self.bodyMode(head))
        }
        let actions = exchange.machine.handle(.prepare(model: model))
        exchange.report(actions)
        var command = actions.command
        if case .adapt(let request)? = command {
            guard let answer = Self.adapt(request, exchange, services) else { return .wait(.adaptation) }
            command = answer
        }
        return Self.verdict(for: command, exchange)
    }

    /// What the machine's answer to the adapters means for the chain.
    static func verdict(for command: ExchangeMachine.Action?, _ exchange: Exchange) -> StageVerdict {
        switch command {
        case .forward(let edits)?:
            if let edits { exchange.headerEdits = edits }
            return .proceed
        case .fail(let error)?:
            return .respond(error)
        default:
            return .respond(.malformedRequest("the request's adaptation ended without an answer"))
        }
    }

    /// Runs the policy's adapters on `request` (the first try's, or a retry's that adapts
    /// again). Returns the machine's answer when they answered before returning; nil when one
    /// must wait: its answer then goes to the exchange's owner (`adaptationAnswered`).
    static func adapt(_ request: ProxyRequest, _ exchange: Exchange, _ services: any StageServices) -> ExchangeMachine.Action? {
        exchange.adaptingInline = true
        exchange.adaptedAnswer = nil
        exchange.policy.interceptor.adapt(request, for: services.adapterSession) { result in
            let actions = exchange.machine.handle(.adapted(result))
            exchange.report(actions)
            if exchange.adaptingInline {
                exchange.adaptedAnswer = actions.command
            } else {
                exchange.owner?.adaptationAnswered(exchange, actions.command)
            }
        }
        exchange.adaptingInline = false
        if case .adapting = exchange.inspect({ $0.state }) {
            exchange.report(exchange.machine.handle(.adaptationSuspended))
            return nil
        }
        defer { exchange.adaptedAnswer = nil }
        return exchange.adaptedAnswer
    }

    static func bodyMode(_ head: HTTPRequestHead) -> ProxyRequest.Body {
        switch head.framing {
        case .none: return .none
        case .length(let n): return .length(n)
        case .chunked: return .streamed
        }
    }
}
