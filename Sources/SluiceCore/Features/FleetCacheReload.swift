/// What a reload does with `fleet.cache` (docs/fleet.md, "One cache across the fleet"): this
/// instance's `weight` and the static `peers` apply to the requests that start after it (those
/// in flight keep the owners they ranked with); `advertise`, `secret`, `listen` and the
/// members' source (the static list or Redis) stay as started, and each such change is said
/// in the log. Adding or removing `fleet.cache` needs a restart, as every `fleet:` change.
///
/// Threading: a value, made on the reloading thread.
public struct FleetCacheReload: Sendable, Equatable {
    /// What runs after the reload: the running settings with the new weight and list (nil:
    /// no shared cache runs).
    public let applied: FleetCacheSettings?
    /// What the reload compares with the running configuration to tell whether a change needs
    /// a restart: the running settings when both have a shared cache (the changes that need
    /// one are in `restartNeeded`), else the new ones.
    public let comparable: FleetCacheSettings?
    /// One line per change that waits for a restart.
    public let restartNeeded: [String]

    public init(running: FleetCacheSettings?, new: FleetCacheSettings?) {
        guard let running, let new else {
            applied = running
            comparable = new
            restartNeeded = []
            return
        }
        comparable = running
        var applying = running
        var kept: [String] = []
        applying.weight = new.weight
        if new.peers.isEmpty == running.peers.isEmpty {
            applying.peers = new.peers
        } else {
            kept.append(
                "fleet.cache.peers: switching between a static list and Redis's members needs a restart; "
                    + "the members still come from " + (running.peers.isEmpty ? "Redis" : "the static list"))
        }
        if new.listen != running.listen {
            kept.append(
                "fleet.cache.listen: the peer listener stays " + (running.listen.map { "on \($0)" } ?? "closed")
                    + " until a restart (the file says " + (new.listen ?? "none") + ")")
        }
        if new.advertise != running.advertise {
            kept.append("fleet.cache.advertise: this instance stays \(running.advertise) until a restart")
        }
        if new.secret != running.secret {
            kept.append("fleet.cache.secret: a new secret applies after a restart; peer requests are signed with the running one")
        }
        applied = applying
        restartNeeded = kept
    }
}
