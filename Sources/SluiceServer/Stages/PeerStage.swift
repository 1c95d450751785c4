import SluiceCore

/// `fleet.cache` (docs/fleet.md, "One cache across the fleet"; docs/security.md, "Peers"): a
/// request that carries `Sluice-Peer` says it comes from another instance of the fleet. Its
/// signature is checked before anything else: a forged, stale or replayed one — or one that
/// names this instance itself, a loop — is answered `403` and goes nowhere. A valid one goes
/// on as any request through this instance's policy and cache, marked as a peer's
/// (`Exchange.fromPeer`): its signature authenticates it (`access.proxy_auth` does not
/// apply), and a miss is never passed on to a third instance. On the peer listener
/// (`fleet.cache.listen`) a request without the field is refused too. The field itself never
/// travels upstream (`ForwardedHeaders.isDroppedRequestField`).
///
/// Threading: stateless; run on the exchange's worker thread.
enum PeerStage: RequestStage {
    static var name: String { "peer" }

    static func enter(_ exchange: Exchange, _ services: any StageServices) -> StageVerdict {
        guard let peers = services.peers else { return .proceed }
        let values = exchange.head.values(named: "sluice-peer")
        guard !values.isEmpty else {
            guard case .peer = exchange.client.mode else { return .proceed }
            return .respond(.peerRequestRefused(reason: "the peer listener (fleet.cache.listen) takes signed requests only"))
        }
        guard values.count == 1 else { return .respond(.peerRequestRefused(reason: "more than one Sluice-Peer field")) }
        let verdict = peers.verify(
            values[0], method: exchange.head.method, url: exchange.target.url, now: CacheStage.wallClockSeconds())
        switch verdict {
        case .valid(let sender) where sender == peers.settings.advertise:
            return .respond(.peerRequestRefused(reason: "a loop: the request names this instance as its sender"))
        case .valid:
            exchange.fromPeer = true
            return .proceed
        case .unsigned, .forged:
            return .respond(.peerRequestRefused(reason: "the signature does not match (fleet.cache.secret)"))
        case .stale:
            return .respond(
                .peerRequestRefused(reason: "its time is more than \(PeerSignature.maximumSkew) s from this instance's clock"))
        case .replayed:
            return .respond(.peerRequestRefused(reason: "it was accepted once already (a replay)"))
        }
    }
}
