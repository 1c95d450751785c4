/// `fleet.cache:` (docs/fleet.md, "One cache across the fleet"): how the instances of a fleet
/// share one cache. Each URL has one owner among the members (`RendezvousOwners`); a miss on
/// another member asks the owner instead of the origin.
///
/// An immutable value, read once at start and shared read-only by every worker.
public struct FleetCacheSettings: Sendable, Equatable {
    /// A member of the static list (`peers:`): the address its peers reach it on and its weight.
    public struct Peer: Sendable, Equatable {
        /// `IP:port` or `[IPv6]:port`, numeric: the member's `advertise` address.
        public var address: String
        /// Its share of the keys relative to the others' (a bigger disk: a bigger weight).
        public var weight: Double

        public init(address: String, weight: Double = FleetCacheSettings.defaultWeight) {
            self.address = address
            self.weight = weight
        }
    }

    /// A member's weight when none is given: `1`.
    public static let defaultWeight = 1.0
    /// The largest weight: `1000` (the scores stay far from a double's limits).
    public static let maximumWeight = 1000.0

    /// The address this instance's peers reach it on (`IP:port`): its identity in the owner
    /// order, stable across restarts (a restarted instance owns the same keys again).
    public var advertise: String
    /// The fleet's shared secret: the key of the HMAC every peer request carries.
    public var secret: Secret
    /// A listener of its own for peer traffic (on a private address); nil (the default): peers
    /// reach this instance on its main listener.
    public var listen: String?
    /// This instance's weight (default `1`).
    public var weight = FleetCacheSettings.defaultWeight
    /// The members when there is no Redis to learn them from: every instance of the fleet
    /// (the same list on each; this instance's own entry is recognised by its `advertise`
    /// address, and added when missing). Empty (the default): the members come from Redis.
    public var peers: [Peer] = []

    public init(advertise: String, secret: Secret) {
        self.advertise = advertise
        self.secret = secret
    }

    /// The static members, this instance included: what `RendezvousOwners` ranks without Redis.
    public var staticMembers: [RendezvousOwners.Member] {
        var members = peers.filter { $0.address != advertise }.map {
            RendezvousOwners.Member(address: $0.address, weight: $0.weight)
        }
        members.append(RendezvousOwners.Member(address: advertise, weight: weight))
        return members
    }
}
