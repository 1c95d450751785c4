import SluiceCore

/// Where a request stops being one request: a CONNECT becomes a byte tunnel to its authority
/// (or, with the policy's `intercept`, Sluice's TLS server, whose requests start the chain
/// again), and an upgrade the policy allows (`upgrades:`, a WebSocket) is marked so that each
/// try is an upgrade handshake — never answered from or stored in the cache.
enum TunnelStage: RequestStage {
    static var name: String { "tunnel" }

    static func enter(_ exchange: Exchange, _ services: any StageServices) -> StageVerdict {
        let head = exchange.head
        if head.methodIs("CONNECT") { return .tunnel(exchange.target, intercept: exchange.policy.intercept) }
        if !head.connectionTokens.isEmpty { exchange.upgrade = Self.allowedUpgrade(head, exchange.policy) }
        return .proceed
    }

    /// The `Upgrade` value to forward for `head` under `policy`, when the request asks for an
    /// upgrade the policy allows: HTTP/1.1, `Connection: upgrade`, no body.
    static func allowedUpgrade(_ head: HTTPRequestHead, _ policy: HostPolicy) -> String? {
        guard !head.connectionTokens.isEmpty, head.minorVersion == 1, !head.hasBody else { return nil }
        let offered = head.upgradeValues
        guard !offered.isEmpty else { return nil }
        return policy.upgrades.forwardedValue(offering: offered)
    }
}
