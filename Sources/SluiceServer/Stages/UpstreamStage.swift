import SluiceCore

/// `upstream` and `upstream.engine` (docs/configuration.md): the try is completed — the `Host`
/// an `upstream:` override keeps, the stored response's validators a revalidation sends —
/// and, once the `ExchangeMachine` agrees (the retry deadline has not passed), handed to a
/// transport: an upgrade handshake, Sluice's own HTTP/1.1 client or libcurl
/// (`UpstreamEngine.choose`). What follows — the response head's decisions, a retry after a
/// failure, a redirect — comes back to the machine as events, and every new try runs the try
/// stages (`RequestChain.attempt`) again.
enum UpstreamStage: TryStage {
    static var name: String { "upstream" }

    static func enter(_ request: inout UpstreamRequest, _ exchange: Exchange, _ services: any StageServices) -> TryVerdict {
        // A resume goes by its broken try's route with that try's header list (its `Host`
        // included) and no validators: it asks for the rest of the same representation.
        if let route = request.resumes { return .send(route) }
        // `request.target` read in place: a local copy kept its strings retained to the end.
        if let host = exchange.hostHeader, request.target == host.target {
            request.headers = request.headers.appending(name: "Host", value: host.value)
        }
        if exchange.cache != nil { CacheStage.applyValidators(&request, exchange) }
        let answer = exchange.machine.tryStarting(.init(request.target))
        exchange.report(answer.reports)
        let perTryTimeout: Int
        switch answer.command {
        case .beginTry(let timeout)?:
            perTryTimeout = timeout
        case .fail(let error)?:
            CircuitStage.reportOutcome(.abandoned, exchange, services.health)
            return .respond(error)
        case nil:
            CircuitStage.reportOutcome(.abandoned, exchange, services.health)
            return .respond(.upstreamTimeout(host: request.target.authority, phase: .retryDeadlinePassed))
        }
        if let upgrade = exchange.upgrade { return .send(.upgrade(upgrade, perTryTimeout: perTryTimeout)) }
        let policy = exchange.tryPolicy ?? exchange.policy
        let https = request.target.scheme == .https
        let engine = UpstreamEngine.choose(
            https: https, http2: policy.http2,
            forced: policy.upstreamEngine, credentials: request.credentials != nil,
            parentProxy: request.parentProxy != nil, upgrade: false,
            requiresOCSP: https && request.trust.requirements.requireOCSP,
            originChoseHTTP1: https && policy.http2 != .off && services.originChoseHTTP1(request.target)
        ).engine
        switch engine {
        case .native: return .send(.native(perTryTimeout: perTryTimeout))
        case .curl: return .send(.curl(perTryTimeout: perTryTimeout))
        }
    }
}
