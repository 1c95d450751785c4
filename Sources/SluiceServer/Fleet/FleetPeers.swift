import SluiceCore

/// This process's part of the fleet's shared cache (`fleet.cache`; docs/fleet.md, "One cache
/// across the fleet"): its own address among the members, the members' owner order, the key
/// that signs and verifies peer requests, and the nonces of the peer requests accepted lately.
///
/// Threading: made once by `ProxyServer` and shared read-only by every worker; the replay
/// guard, the down marks and the request counts are its mutable parts (each behind its own
/// lock).
final class FleetPeers: Sendable {
    let settings: FleetCacheSettings
    /// Who owns which key: the static members for now (`peers:`, this instance included).
    let owners: RendezvousOwners
    let signature: PeerSignature
    let replays = PeerReplayGuard()
    /// The peers that did not answer lately: skipped for a few seconds (`PeerDownMarks`).
    let downMarks = PeerDownMarks()
    /// `sluice_peer_requests_total` and its latency, and their counts for `GET /fleet`.
    let requestMetrics = PeerRequestMetrics()

    init(_ settings: FleetCacheSettings) {
        self.settings = settings
        owners = RendezvousOwners(settings.staticMembers)
        signature = PeerSignature(secret: settings.secret)
    }

    /// What a request's `Sluice-Peer` field (`value`; nil: none) proves for `method url` now
    /// (`PeerStage` refuses a valid one that names this instance: it never asks itself).
    func verify(_ value: String?, method: String, url: String, now: Int64) -> PeerSignature.Verdict {
        signature.verify(value, method: method, url: url, now: now, replays: replays)
    }
}
