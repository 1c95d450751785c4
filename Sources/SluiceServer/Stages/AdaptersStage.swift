import SluiceCore

/// `adapters` (docs/configuration.md, "Adapters"): the policy's interceptor adapts the request
/// — headers, bearer and API keys, OAuth 2 tokens, deflate — on a request model built only
/// when one is needed; adapters that only edit header fields are applied as the upstream
/// header lines are built, with no model at all. Whether they run is the `ExchangeMachine`'s to
/// decide; when they do, the request waits for their answer (`StageWait.adaptation`), which
/// comes at once or — from an adapter that must fetch a token — later on this thread.
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
        if case .adapt(let request)? = actions.command { return .wait(.adaptation(request)) }
        return verdict(for: actions.command, exchange)
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
    /// again). The machine's answer goes to the exchange's owner (`adaptationAnswered`) —
    /// before this returns when every adapter answers at once, later when one must wait
    /// (which the machine is told).
    static func run(_ request: ProxyRequest, _ exchange: Exchange, _ services: any StageServices) {
        exchange.policy.interceptor.adapt(request, for: services.adapterSession) { result in
            let actions = exchange.machine.handle(.adapted(result))
            exchange.report(actions)
            exchange.owner?.adaptationAnswered(exchange, actions.command)
        }
        if case .adapting = exchange.inspect({ $0.state }) {
            exchange.report(exchange.machine.handle(.adaptationSuspended))
        }
    }

    static func bodyMode(_ head: HTTPRequestHead) -> ProxyRequest.Body {
        switch head.framing {
        case .none: return .none
        case .length(let n): return .length(n)
        case .chunked: return .streamed
        }
    }
}
