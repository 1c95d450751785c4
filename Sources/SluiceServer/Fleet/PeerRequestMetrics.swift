import SluiceCore
import Synchronization

/// What this instance's peer requests came to (`fleet.cache`; docs/fleet.md, "One cache
/// across the fleet"; docs/metrics.md): `sluice_peer_requests_total{peer,outcome}` and
/// `sluice_peer_request_duration_seconds{peer}`, and the same counts kept here for
/// `GET /fleet` (`snapshot`).
///
/// Threading: shared by every worker of the process (held by `FleetPeers`); the counts are
/// behind a `Mutex`, taken once per peer asked.
final class PeerRequestMetrics: Sendable {
    /// How a peer was asked, or why not.
    enum Outcome: String, CaseIterable, Sendable {
        /// Its response (any status) went to the client.
        case answered
        /// No response: refused, unreachable, timed out or broken before its head; the next
        /// member (or the origin) was asked.
        case failed
        /// Marked down by a failure moments ago (`PeerDownMarks`): not asked.
        case skippedDown = "skipped_down"
    }

    private struct Key: Hashable {
        let peer: String
        let outcome: Outcome
    }

    private let counts = Mutex<[Key: UInt64]>([:])
    private let metrics: SluiceMetrics

    init(metrics: SluiceMetrics = .shared) {
        self.metrics = metrics
    }

    func record(_ outcome: Outcome, peer: String) {
        counts.withLock { $0[Key(peer: peer, outcome: outcome), default: 0] += 1 }
        metrics.recordPeerRequest(peer: peer, outcome: outcome.rawValue)
    }

    /// A request to `peer` that took `microseconds` (answered or failed).
    func recordDuration(peer: String, microseconds: Int64) {
        metrics.recordPeerRequestDuration(peer: peer, microseconds: microseconds)
    }

    /// The counts so far: per peer, per outcome (`answered`, `failed`, `skipped_down`); only
    /// the peers asked (or skipped) at least once.
    func snapshot() -> [String: [String: UInt64]] {
        counts.withLock { counts in
            var byPeer: [String: [String: UInt64]] = [:]
            for (key, count) in counts { byPeer[key.peer, default: [:]][key.outcome.rawValue] = count }
            return byPeer
        }
    }
}
