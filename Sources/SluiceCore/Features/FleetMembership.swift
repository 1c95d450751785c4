/// Who the members of the fleet's shared cache are (`fleet.cache`; docs/fleet.md, "One cache
/// across the fleet"): the static `peers:` list, or the members the fleet's heartbeat in Redis
/// answers with, and what becomes of them when Redis stops answering.
///
/// With Redis, each instance's heartbeat adds `ADDRESS WEIGHT` (its `advertise` address and its
/// weight) to a sorted set scored by the time of the beat, removes the entries older than three
/// heartbeats, and answers the rest (`heard`): the members alive. This instance is always one
/// of its own members. A heartbeat that Redis does not answer changes nothing at first (the
/// members last heard still count as alive for three heartbeats, as the others count this
/// one); after three in a row (`missed`) the members are this instance alone, so each instance
/// caches for itself and nothing is lost, until Redis answers again.
///
/// Threading: a value. `FleetPeers` keeps the process's one behind its lock; worker 0's
/// heartbeat changes it, reloads reweigh it.
public struct FleetMembership: Sendable, Equatable {
    /// Where the members come from.
    public enum Source: String, Sendable {
        /// `fleet.cache.peers`: fixed by the configuration.
        case `static`
        /// The fleet's heartbeat in Redis.
        case redis
    }

    /// How the members were last learned (`GET /fleet`'s `state`).
    public enum State: String, Sendable {
        /// The static list.
        case `static`
        /// Redis has not answered a heartbeat yet: this instance alone.
        case waiting
        /// As Redis answered the last heartbeat.
        case heartbeat
        /// Redis has not answered for three heartbeats: this instance alone.
        case alone
    }

    /// A member as `GET /fleet` shows it.
    public struct Member: Sendable, Equatable {
        public let address: String
        public let weight: Double
        /// The first of its heartbeats this instance heard, in the run of heartbeats that still
        /// counts it alive (Unix ms, Redis's clock); nil for static members.
        public let aliveSince: Int64?
        /// Its last heartbeat (Unix ms, Redis's clock); nil for static members.
        public let lastSeen: Int64?
    }

    /// One entry of the heartbeat's answer: a member's address, weight and last beat.
    public struct Beat: Sendable, Equatable {
        public let address: String
        public let weight: Double
        public let at: Int64
    }

    /// Heartbeats in a row without an answer before the members are this instance alone: `3`
    /// (as long as a member counts as alive).
    public static let missesBeforeAlone = 3

    public let source: Source
    /// This instance's `advertise` address.
    public let advertise: String
    /// This instance's weight (`fleet.cache.weight`; a reload may change it).
    public private(set) var weight: Double
    public private(set) var state: State
    /// The members in address order, this instance included.
    public private(set) var members: [Member]
    private var misses = 0

    public init(_ settings: FleetCacheSettings, redis: Bool) {
        advertise = settings.advertise
        weight = settings.weight
        if settings.peers.isEmpty && redis {
            source = .redis
            state = .waiting
            members = [Member(address: settings.advertise, weight: settings.weight, aliveSince: nil, lastSeen: nil)]
        } else {
            source = .static
            state = .static
            members = Self.fixed(settings)
        }
    }

    /// What `RendezvousOwners` ranks: the members' addresses and weights.
    public var owners: [RendezvousOwners.Member] {
        members.map { RendezvousOwners.Member(address: $0.address, weight: $0.weight) }
    }

    /// The heartbeat's answer (`beats`, at `now`, Unix ms of Redis's clock). Returns whether
    /// the owners (the addresses and weights) changed.
    public mutating func heard(_ beats: [Beat], now: Int64) -> Bool {
        guard source == .redis else { return false }
        let before = owners
        let previous = state == .heartbeat ? Dictionary(members.map { ($0.address, $0) }, uniquingKeysWith: { a, _ in a }) : [:]
        var seen = Set([advertise])
        var next = [me(since: previous[advertise]?.aliveSince ?? now, lastSeen: now)]
        for beat in beats where seen.insert(beat.address).inserted {
            next.append(
                Member(
                    address: beat.address, weight: beat.weight, aliveSince: previous[beat.address]?.aliveSince ?? beat.at,
                    lastSeen: beat.at))
        }
        members = Self.sorted(next)
        state = .heartbeat
        misses = 0
        return owners != before
    }

    /// A heartbeat Redis did not answer (or could not be sent). Returns whether the owners
    /// changed: on the third in a row, to this instance alone.
    public mutating func missed() -> Bool {
        guard source == .redis else { return false }
        misses += 1
        guard state == .heartbeat, misses >= Self.missesBeforeAlone else { return false }
        let before = owners
        state = .alone
        members = [me(since: nil)]
        return owners != before
    }

    /// A reload's `fleet.cache`: this instance's weight, and for a static source the list.
    /// (The source itself, `advertise`, `secret` and `listen` stay as started.) Returns whether
    /// the owners changed.
    public mutating func reload(_ settings: FleetCacheSettings) -> Bool {
        let before = owners
        weight = settings.weight
        switch source {
        case .static:
            members = Self.fixed(settings)
        case .redis:
            // The others learn the new weight from the next heartbeat; this instance at once.
            let own = members.first { $0.address == advertise }
            members = Self.sorted(
                members.filter { $0.address != advertise } + [me(since: own?.aliveSince, lastSeen: own?.lastSeen)])
        }
        return owners != before
    }

    /// The share of the keys `address` owns: its weight over the members' total.
    public func share(of address: String) -> Double {
        let total = members.reduce(0) { $0 + $1.weight }
        guard total > 0, let member = members.first(where: { $0.address == address }) else { return 0 }
        return member.weight / total
    }

    /// `ADDRESS WEIGHT`: this instance's entry in the heartbeat's sorted set.
    public var heartbeatEntry: String { Self.entry(address: advertise, weight: weight) }

    static func entry(address: String, weight: Double) -> String { address + " " + weightText(weight) }

    /// A weight as written in the heartbeat and the logs: a whole one without its ".0".
    public static func weightText(_ weight: Double) -> String {
        weight == weight.rounded() ? String(Int(weight)) : String(weight)
    }

    /// The heartbeat's answer as Redis sends it: `ADDRESS WEIGHT`, then its score (ms), for
    /// each member. Entries that do not parse are left out.
    public static func beats(_ flat: [String]) -> [Beat] {
        var out: [Beat] = []
        var i = 0
        while i + 1 < flat.count {
            defer { i += 2 }
            let parts = flat[i].split(separator: " ")
            guard parts.count == 2, !parts[0].isEmpty, let weight = Double(parts[1]), weight > 0,
                weight <= FleetCacheSettings.maximumWeight, let at = Double(flat[i + 1]), at.isFinite
            else { continue }
            out.append(Beat(address: String(parts[0]), weight: weight, at: Int64(at)))
        }
        return out
    }

    private func me(since: Int64?, lastSeen: Int64? = nil) -> Member {
        Member(address: advertise, weight: weight, aliveSince: since, lastSeen: lastSeen)
    }

    /// The static list, this instance included.
    private static func fixed(_ settings: FleetCacheSettings) -> [Member] {
        sorted(settings.staticMembers.map { Member(address: $0.address, weight: $0.weight, aliveSince: nil, lastSeen: nil) })
    }

    private static func sorted(_ members: [Member]) -> [Member] { members.sorted { $0.address < $1.address } }
}
