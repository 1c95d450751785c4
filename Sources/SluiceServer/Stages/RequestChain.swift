import SluiceCore

/// A request's way through Sluice, in order: the one place the order is written
/// (docs/architecture.md draws it; docs/configuration.md describes the keys in this order).
///
/// 1. `Admission` decides whether the request may enter and where it goes, and makes its
///    `Exchange` with the policy of that host.
/// 2. `request`: the stages every request passes once. Each answers go on, answer the client,
///    wait for an event (the chain resumes at the next stage), or leave the chain (a CONNECT's
///    tunnel, a try handed to a transport).
/// 3. `attempt`: the stages every try passes — the first, each retry the `ExchangeMachine`
///    decides (`retry`) and each redirect it follows (`redirects`). The last hands the try to
///    a transport; the response's way back is `ResponseChain`'s (the try stages' other halves,
///    in reverse).
///
/// Threading: stateless; run on the exchange's worker thread.
enum RequestChain {
    static let request: [any RequestStage.Type] = [
        PeerStage.self,  // fleet.cache: a peer's signature
        ProxyAuthStage.self,  // access.proxy_auth
        TunnelStage.self,  // CONNECT, intercept, upgrades
        CacheStage.self,  // cache, cache_store
        UpstreamSlotStage.self,  // limits.max_in_flight_upstream
        AdaptersStage.self,  // adapters
        RequestBodyStage.self,  // the request body a try needs
    ]

    static let attempt: [any TryStage.Type] = [
        TrustStage.self,  // trust, upstream_proxy, client_certificate
        CircuitStage.self,  // health
        QuotaStage.self,  // rate_limit
        TryAdaptersStage.self,  // adapters that run on every try (signers)
        UpstreamStage.self,  // upstream, upstream.engine
    ]

    /// Where a trial that waited for the fleet's trial lock resumes.
    static let afterCircuit = attempt.firstIndex { ObjectIdentifier($0) == ObjectIdentifier(CircuitStage.self) }! + 1

    /// Where a try that waited for its rate-limit turn resumes.
    static let afterQuota = attempt.firstIndex { ObjectIdentifier($0) == ObjectIdentifier(QuotaStage.self) }! + 1

    /// Runs `request` from the stage at `index` until one answers anything but `.proceed`
    /// (`exchange.stage` then names it); `.proceed` when the request passed them all.
    static func run(_ exchange: Exchange, from index: Int, _ services: any StageServices) -> StageVerdict {
        var index = index
        while index < request.count {
            exchange.stage = index
            let verdict = request[index].enter(exchange, services)
            if case .proceed = verdict {
                index += 1
                continue
            }
            return verdict
        }
        exchange.stage = request.count
        return .proceed
    }

    /// Runs the policy's adapters on `request` — the first try's (`StageWait.adaptation`), or a
    /// retry's that adapts again — for the stage that waits for them; their answer goes to the
    /// exchange's owner (`ExchangeOwner.adaptationAnswered`).
    static func adapt(_ request: ProxyRequest, _ exchange: Exchange, _ services: any StageServices) {
        AdaptersStage.run(request, exchange, services)
    }

    /// Runs `attempt` for `request`: ends in `.send`, or in the answer of the stage that
    /// stopped the try.
    static func runTry(
        _ request: inout UpstreamRequest, _ exchange: Exchange, _ services: any StageServices, from index: Int = 0
    ) -> TryVerdict {
        var index = index
        while index < attempt.count {
            let verdict = attempt[index].enter(&request, exchange, services)
            guard case .proceed = verdict else { return verdict }
            index += 1
        }
        return .respond(.malformedRequest("no transport took the request"))
    }
}
