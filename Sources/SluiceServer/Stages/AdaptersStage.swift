import SluiceCore

/// `adapters` (docs/configuration.md, "Adapters"): the policy's interceptor adapts the request
/// — headers, bearer and API keys, OAuth 2 tokens, deflate — on a request model built only
/// when one is needed; adapters that only edit header fields are applied as the upstream
/// header lines are built, with no model at all, or — before `lua` scripts — as the model's
/// fields are built (`HostPolicy.modelHeaderPlan`). Whether they run is the `ExchangeMachine`'s to
/// decide; when they do, the request waits for their answer (`StageWait.adaptation`), which
/// comes at once or — from an adapter that must fetch a token — later on this thread.
enum AdaptersStage: RequestStage {
    static var name: String { "adapters" }

    static func enter(_ exchange: Exchange, _ services: any StageServices) -> StageVerdict {
        if exchange.inspect({ $0.runsScriptsOnLines }) { return runScriptsOnLines(exchange, services) }
        var model: ProxyRequest?
        if exchange.inspect({ $0.needsRequestModel }) {
            let head = exchange.head
            let plan = exchange.policy.modelHeaderPlan
            let planFields = exchange.policy.modelHeaderFields
            // Room for the request id, the plan's fields and a few an adapter adds.
            var fields = ForwardedHeaders.forwardedFields(
                of: head, forwarding: exchange.client.forwarding, edits: plan, reserving: planFields.count + 4)
            if let generated = exchange.generatedRequestId {
                var name = "x-request-id"
                if !(plan.map { plan in name.withUTF8 { plan.replaces($0) } } ?? false) {
                    fields[ForwardedHeaders.requestIdName] = generated
                }
            }
            for field in planFields { fields.append(field) }
            model = ProxyRequest(
                id: exchange.id, method: head.method, url: exchange.target.url,
                headerFields: fields, body: Self.bodyMode(head))
            model?.scriptDepth = ForwardedHeaders.scriptDepth(of: head, fromPeer: exchange.fromPeer)
        }
        let answer = exchange.machine.prepare(model: model)
        exchange.report(answer.reports)
        switch answer.command {
        case .adapt(let request)?:
            return .wait(.adaptation(request))
        case .forward(let edits)?:
            if let edits { exchange.forwardedLines = .edits(edits) }
            return .proceed
        case nil:
            // The pipeline runs once per exchange: a second run is a bug, never a request.
            return .respond(.malformedRequest("the request's pipeline ran twice"))
        }
    }

    /// Runs the policy's adapters on `request` (the first try's, or a retry's that adapts
    /// again). The machine's answer goes to the exchange's owner (`adaptationAnswered`) —
    /// before this returns when every adapter answers at once, later when one must wait
    /// (which the machine is told).
    static func run(_ request: ProxyRequest, _ exchange: Exchange, _ services: any StageServices) {
        exchange.policy.interceptor.adapt(request, for: services.adapterSession) { result in
            if exchange.policy.runsScripts { exchange.takeLuaCall() }
            let answer = exchange.machine.adapted(result)
            exchange.report(answer.reports)
            exchange.owner?.adaptationAnswered(exchange, answer.command)
        }
        if case .adapting = exchange.inspect({ $0.state }) {
            exchange.machine.adaptationSuspended()
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
