import CoreMetrics

/// The fleet cache's peer requests (`fleet.cache`; docs/fleet.md, "One cache across the
/// fleet"): a miss on this instance that asked another member. Recorded without the metrics
/// monitor, only with `fleet.cache` (`PeerRequestMetrics`).
extension SluiceMetrics {
    public static let peerRequests = Metric(
        name: "sluice_peer_requests_total", kind: .counter, labels: ["peer", "outcome"],
        help:
            "Cache misses this instance asked another member of the fleet about (`fleet.cache`), by peer and outcome: answered (its response went to the client), failed (no response: the next member or the origin was asked), skipped_down (marked down after a failure moments ago: not asked)"
    )
    public static let peerRequestDuration = Metric(
        name: "sluice_peer_request_duration_seconds", kind: .histogram, labels: ["peer"],
        help: "Time from asking a peer to the end of its answer (or its failure), by peer")

    /// A peer request's `outcome` (`sluice_peer_requests_total`).
    public func recordPeerRequest(peer: String, outcome: String) {
        counter(Self.peerRequests, [("peer", peer), ("outcome", outcome)]).increment()
    }

    /// A peer request to `peer` that took `microseconds`.
    public func recordPeerRequestDuration(peer: String, microseconds: Int64) {
        timer(Self.peerRequestDuration, [("peer", peer)]).recordNanoseconds(microseconds * 1000)
    }
}
