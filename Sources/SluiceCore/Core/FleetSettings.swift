/// `fleet:` (docs/fleet.md): the Redis that several Sluice instances share their limits
/// through, how long a command may take, and what a limit does while Redis cannot answer.
public struct FleetSettings: Sendable, Equatable {
    /// Where Redis listens: an IP address and port, or a Unix socket. Never a host name:
    /// hiredis 0.14 resolves names with a blocking call, which a worker's loop must not make.
    public enum Address: Sendable, Equatable, CustomStringConvertible {
        case tcp(host: String, port: Int)
        case unix(path: String)

        public var description: String {
            switch self {
            case .tcp(let host, let port): return host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)"
            case .unix(let path): return "unix:\(path)"
            }
        }
    }

    /// What a fleet-wide limit does while Redis does not answer in time.
    public enum OnRedisDown: String, Sendable, CaseIterable {
        /// Each instance applies the limit locally, divided by the instances last seen alive.
        case localShare = "local_share"
        /// No limit applies.
        case allow
        /// What a fleet limit covers is refused with 503.
        case deny
    }

    public var redis: Address
    public var database = 0
    public var username: String?
    public var password: Secret?
    public var keyPrefix = "sluice:"
    /// Milliseconds a command may take before it counts as failed.
    public var timeout = 20
    public var onRedisDown = OnRedisDown.localShare
    /// Milliseconds between an instance's heartbeats (it counts as alive for three).
    public var heartbeat = 2000

    public init(redis: Address) { self.redis = redis }
}
