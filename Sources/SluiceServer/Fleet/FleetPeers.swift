import SluiceCore
import Synchronization

/// This process's part of the fleet's shared cache (`fleet.cache`; docs/fleet.md, "One cache
/// across the fleet"): its own address among the members, the members and their owner order,
/// the key that signs and verifies peer requests, and the nonces of the peer requests
/// accepted lately.
///
/// Threading: made once by `ProxyServer` and shared by every worker. `settings`, `signature`
/// and `source` never change. The members change when worker 0's heartbeat hears them from
/// Redis (`heard`, `missed`) or a reload reweighs them (`reload`): each change builds a new
/// `RendezvousOwners` and swaps it in under `view`'s lock, so `owners` is a short lock and a
/// copy of an immutable value — a request ranks its key with the owners it read, even if the
/// members change meanwhile. The replay guard, the down marks and the request counts each have
/// their own lock.
final class FleetPeers: Sendable {
    /// As started: `advertise`, `secret` and `listen` keep these values until a restart; the
    /// members and weights are in `membership`.
    let settings: FleetCacheSettings
    let signature: PeerSignature
    let replays = PeerReplayGuard()
    /// Where the members come from (fixed at start).
    let source: FleetMembership.Source
    /// The peers that did not answer lately: skipped for a few seconds (`PeerDownMarks`).
    let downMarks = PeerDownMarks()
    /// `sluice_peer_requests_total` and its latency, and their counts for `GET /fleet`.
    let requestMetrics = PeerRequestMetrics()

    private struct View {
        var membership: FleetMembership
        var owners: RendezvousOwners
    }
    private let view: Mutex<View>

    /// `redis`: whether `fleet.redis` is configured (without static `peers`, the members come
    /// from its heartbeat).
    init(_ settings: FleetCacheSettings, redis: Bool) {
        self.settings = settings
        signature = PeerSignature(secret: settings.secret)
        let membership = FleetMembership(settings, redis: redis)
        source = membership.source
        view = Mutex(View(membership: membership, owners: RendezvousOwners(membership.owners)))
    }

    /// Who owns which key now, this instance included.
    var owners: RendezvousOwners { view.withLock { $0.owners } }

    /// The members as last learned (`GET /fleet`).
    var membership: FleetMembership { view.withLock { $0.membership } }

    /// Whether the heartbeat publishes this instance and answers the members.
    var learnsFromRedis: Bool { source == .redis }

    /// What a request's `Sluice-Peer` field (`value`; nil: none) proves for `method url` now
    /// (`PeerStage` refuses a valid one that names this instance: it never asks itself).
    func verify(_ value: String?, method: String, url: String, now: Int64) -> PeerSignature.Verdict {
        signature.verify(value, method: method, url: url, now: now, replays: replays)
    }

    /// The heartbeat's answer: the members alive (worker 0's thread).
    func heard(_ beats: [FleetMembership.Beat], now: Int64) {
        change { $0.heard(beats, now: now) }
    }

    /// A heartbeat that Redis did not answer (worker 0's thread).
    func missed() {
        change { $0.missed() }
    }

    /// A reload's `fleet.cache` (the reloading thread): the new weight and static list apply to
    /// the requests that start from now on.
    func reload(_ settings: FleetCacheSettings) {
        change { $0.reload(settings) }
    }

    /// Applies `update` and, when the owners changed, swaps in the new ones; a change of state
    /// (Redis answering or not) and a change of members are logged once each.
    private func change(_ update: (inout FleetMembership) -> Bool) {
        let (changed, before, after) = view.withLock { view -> (Bool, FleetMembership.State, FleetMembership) in
            let before = view.membership.state
            let changed = update(&view.membership)
            if changed { view.owners = RendezvousOwners(view.membership.owners) }
            return (changed, before, view.membership)
        }
        if after.state != before {
            switch after.state {
            case .alone:
                Log.warning(
                    "fleet.cache: Redis has not answered \(FleetMembership.missesBeforeAlone) heartbeats: "
                        + "this instance caches alone (no peer is asked) until it answers again")
            case .heartbeat where before == .alone:
                Log.info("fleet.cache: Redis answers again; the members come from its heartbeat")
            default: break
            }
        }
        if changed {
            let list = after.members.map { "\($0.address) (weight \(FleetMembership.weightText($0.weight)))" }
            Log.info(
                "fleet.cache: \(after.members.count) member(s): \(list.joined(separator: ", ")); "
                    + "this instance owns \(Int((after.share(of: settings.advertise) * 100).rounded())) % of the keys")
        }
    }
}
