import SluiceCore

/// `GET /fleet`'s `cache` (docs/admin-api.yaml; docs/fleet.md, "One cache across the fleet"):
/// this instance, the members it ranks keys over with their weights and shares of the keys,
/// where they come from, and the peer requests' counts.
///
/// Threading: made on the admin thread from `FleetPeers`' snapshot.
struct FleetCacheView: Encodable {
    struct Member: Encodable {
        let address: String
        let weight: Double
        /// Its share of the keys: its weight over the members' total.
        let share: Double
        /// This instance's own entry.
        let me: Bool
        /// Unix ms (Redis's clock); absent for static members.
        let aliveSince: Int64?
        let lastSeen: Int64?
        enum CodingKeys: String, CodingKey {
            case address, weight, share
            case me = "self"
            case aliveSince = "alive_since_ms"
            case lastSeen = "last_seen_ms"
        }
    }

    let advertise: String
    let weight: Double
    let share: Double
    /// The peer listener (`fleet.cache.listen`); absent: peers use the main listener.
    let listen: String?
    let source: String
    let state: String
    let members: [Member]
    /// The misses this instance asked each peer about, by peer then outcome (answered,
    /// failed, skipped_down): `sluice_peer_requests_total` since start.
    let peerRequests: [String: [String: UInt64]]

    enum CodingKeys: String, CodingKey {
        case advertise, weight, share, listen, source, state, members
        case peerRequests = "peer_requests"
    }

    init(_ peers: FleetPeers) {
        let membership = peers.membership
        advertise = membership.advertise
        weight = membership.weight
        share = membership.share(of: membership.advertise)
        listen = peers.settings.listen
        source = membership.source.rawValue
        state = membership.state.rawValue
        members = membership.members.map {
            Member(
                address: $0.address, weight: $0.weight, share: membership.share(of: $0.address),
                me: $0.address == membership.advertise, aliveSince: $0.aliveSince, lastSeen: $0.lastSeen)
        }
        peerRequests = peers.requestMetrics.snapshot()
    }
}
