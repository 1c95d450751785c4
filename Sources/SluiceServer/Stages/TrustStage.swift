import SluiceCore

/// `trust` and the per-host transport settings of one try (docs/trust.md): the policy of the
/// host the try goes to (a followed redirect may have changed it) gives its parent proxy
/// (`upstream_proxy`), its HTTP/2 mode, and for an https origin its trust — a host whose
/// trust cannot be met is refused before any connection — its client certificate and whether
/// TLS connections opened before a reload may carry it.
enum TrustStage: TryStage {
    static var name: String { "trust" }

    static func enter(_ request: inout UpstreamRequest, _ exchange: Exchange, _ services: any StageServices) -> TryVerdict {
        let target = request.target
        exchange.target = target
        let policy =
            target.host == exchange.policyHost ? exchange.policy : exchange.pipeline.policies.match(host: target.host)
        exchange.tryPolicy = policy
        // Most policies have none: the nil is set, not copied from the policy (a value
        // witness's copy of the optional, some 90 instructions).
        if case .some = policy.upstreamProxy {
            request.parentProxy = policy.upstreamProxy
        } else {
            request.parentProxy = nil
        }
        request.http2 = policy.http2
        if target.scheme == .https {
            guard policy.trust.isAllowed else {
                return .failTry(policy.trust.refusal(authority: target.authority), kind: .other)
            }
            request.trust = policy.trust
            request.clientCertificate = policy.clientCertificate
            request.reuse = UpstreamTLS.reuse(current: services.pipeline, exchangeSnapshot: exchange.pipeline)
            if policy.trust.requirements.insecure { exchange.summary.insecure = true }
        }
        return .proceed
    }
}
