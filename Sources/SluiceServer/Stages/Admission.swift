import SluiceCore

/// The chain's first step, before an exchange exists: whether the request may enter at all
/// (`access.connect_ports`, a loop through this proxy, the request-target form the listener
/// takes) and where it goes; then its exchange, with the policy of that host. Client
/// addresses (`access.allow_clients`) and connection counts (`limits`) were checked when the
/// connection was accepted (`Worker`, `ConnectionLimits`); the upstream slot is a stage of its
/// own (`UpstreamSlotStage`), after the cache, since a hit takes none.
enum Admission {
    /// The request's target, or the refusal.
    static func target(
        of head: HTTPRequestHead, client: RequestClient, connectPorts: [Int], viaPseudonym: String
    ) throws(ProxyError) -> RequestTarget {
        try checkLoop(head, viaPseudonym: viaPseudonym)
        if head.methodIs("CONNECT") {
            if client.interception != nil { throw .badURL("CONNECT inside an intercepted connection") }
            if case .peer = client.mode { throw .peerRequestRefused(reason: "the peer listener takes no CONNECT") }
            guard case .forward = client.mode else { throw .notOriginForm }
            let target = try RequestTarget.authority(head.target)
            guard connectPorts.contains(target.port) else { throw .connectPortNotAllowed(target.port) }
            return target
        }
        if let interception = client.interception { return try interception.target(for: head) }
        switch client.mode {
        case .forward, .peer:
            return try RequestTarget.absolute(head.target)
        case .route(let route):
            guard head.bytes[head.targetRange.lowerBound] == UInt8(ascii: "/") else { throw .notOriginForm }
            return try RequestTarget.absolute(route.upstream + head.target)
        }
    }

    /// A request that already carries this process's `Via` pseudonym has looped back here.
    static func checkLoop(_ head: HTTPRequestHead, viaPseudonym: String) throws(ProxyError) {
        let pseudonym = viaPseudonym.utf8
        for field in head.fields where field.name.count == 3 && head.field(field, isNamed: "via") {
            let value = head.bytes[field.value]
            if value.count >= pseudonym.count,
                (value.startIndex...(value.endIndex - pseudonym.count)).contains(where: {
                    value[$0..<($0 + pseudonym.count)].elementsEqual(pseudonym)
                })
            {
                throw .loopDetected
            }
        }
    }

    /// Creates the exchange, which takes the head: matches the policy, applies its
    /// `upstream:` override, and reports the request to the monitors. `method` is the head's,
    /// read once by the caller, which keeps it for a refusal's log line.
    static func begin(
        _ head: consuming HTTPRequestHead, method: String, _ target: RequestTarget, client: RequestClient,
        services: any StageServices
    ) throws(ProxyError) -> Exchange {
        let pipeline = services.pipeline
        let policy = pipeline.policies.match(host: target.host)
        let id = services.nextRequestID()
        let url = head.methodIs("CONNECT") ? target.authority : target.url
        var target = target
        var hostHeader: Exchange.HostHeader?
        if let override = policy.upstream, !head.methodIs("CONNECT"), target.scheme == .http {
            // Only a plain-HTTP request is redirected (never an https one downgraded).
            let original = target
            target = try target.overridden(by: override)
            if target.port != original.port {
                // The origin is asked for by the name the client used (virtual hosting).
                hostHeader = Exchange.HostHeader(
                    value: original.port != 80
                        ? original.authority
                        : original.host.utf8.contains(0x3A) ? "[\(original.host)]" : original.host,
                    target: target)
            }
        }
        let clientRequestId = ForwardedHeaders.requestId(of: head)
        let generatedRequestId = clientRequestId == nil ? services.makeRequestId(id) : nil
        let monitoring: ExchangeMachine.Monitoring =
            pipeline.monitor.map { $0.wantsRequestDetails ? .detailedEvents : .events } ?? .none
        let replayLimit = head.hasBody ? ExchangeMachine.replayLimit(for: policy) : 0
        // The machine and its summary are built in place, as arguments: a copy of either costs
        // a few hundred bytes and a retain per field (a local `summary` was copied). The head
        // is the exchange's, not copied.
        let exchange = Exchange(
            pipeline: pipeline, head: consume head, client: client,
            machine: ExchangeMachine(
                summary: .starting(
                    id: id, client: client.peer, method: method, url: url, policy: policy.name,
                    requestId: clientRequestId ?? generatedRequestId, host: target.host),
                policy: policy, target: .init(target),
                defaultPerTryTimeout: services.upstreamPerTryTimeout,
                monitoring: monitoring, events: pipeline.monitor?.events ?? []),
            target: target, replayLimit: replayLimit)
        exchange.hostHeader = hostHeader
        exchange.generatedRequestId = generatedRequestId
        exchange.report(exchange.machine.received())
        return exchange
    }
}
