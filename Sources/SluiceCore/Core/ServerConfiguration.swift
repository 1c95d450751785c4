import Logging

/// The server-level settings of one Sluice process: where it listens, how many event loops
/// it runs, the limits and timeouts every connection obeys, and who may use it.
///
/// An immutable value: parsed and validated once (by `SluiceConfig` from YAML, or built in
/// Swift by a library user), then shared read-only by every worker thread.
public struct ServerConfiguration: Sendable, Equatable {
    /// Listen addresses as `host:port` (`[::1]:3128` for IPv6). `127.0.0.1:3128` by default:
    /// Sluice is never reachable from other machines unless told so.
    public var listen: [String]
    /// Number of event-loop threads; `nil` means one per core (`workers: auto`).
    public var workers: Int?
    public var limits: Limits
    public var timeouts: Timeouts
    public var access: Access
    public var tls: TLS
    /// Gateway listeners: origin-form requests mapped onto an upstream base URL.
    public var routes: [Route]
    /// The admin listener (`admin:`); nil (the default) means none.
    public var admin: Admin?
    /// Each worker's origin connection pool (`upstream:`: Features/HTTP2.swift).
    public var upstream = UpstreamPoolLimits()
    /// Diagnostics on standard error: `text` (the default) or `json` (`log_format`).
    public var logFormat: DiagnosticLogHandler.Format = .text
    /// The lowest diagnostic level written (`log_level`, default `info`; `SLUICE_LOG` overrides).
    public var logLevel: Logger.Level = .info
    /// The shared cache's store (`cache_store`); nil (the default): nothing is cached.
    public var cacheStore: CacheStoreSettings?
    /// `fleet:`: the Redis that a fleet of instances shares its limits through (nil: none).
    public var fleet: FleetSettings?
    /// `fleet.cache:`: one cache across the fleet's instances (nil, the default: each its own).
    public var fleetCache: FleetCacheSettings?

    public static let defaultListen = ["127.0.0.1:3128"]

    public init(
        listen: [String] = ServerConfiguration.defaultListen, workers: Int? = nil,
        limits: Limits = Limits(), timeouts: Timeouts = Timeouts(),
        access: Access = Access(), tls: TLS = TLS(), routes: [Route] = [], admin: Admin? = nil
    ) {
        self.listen = listen
        self.workers = workers
        self.limits = limits
        self.timeouts = timeouts
        self.access = access
        self.tls = tls
        self.routes = routes
        self.admin = admin
    }

    /// The admin listener (`docs/operations.md`, "Admin API"): health, readiness, in-flight
    /// requests and their cancellation, the effective configuration, reload, metrics.
    public struct Admin: Sendable, Equatable {
        /// `host:port`; a loopback address unless `token` is set.
        public var listen: String
        /// When set, every request must carry `Authorization: Bearer <token>`.
        public var token: Secret?
        public init(listen: String, token: Secret? = nil) {
            self.listen = listen
            self.token = token
        }
    }

    /// A gateway listener (Alamofire's Router, as a listener): `GET /x` on `listen` goes to
    /// `upstream` + `/x`.
    public struct Route: Sendable, Equatable {
        /// `routes[].forwarded`: how the route tells its upstream who the client was
        /// (Sources/SluiceServer/HTTP/Forwarded.swift).
        public enum Forwarded: String, Sendable, Equatable, CaseIterable {
            /// RFC 7239 `Forwarded: for=…;proto=…;host=…`.
            case rfc7239
            /// `X-Forwarded-For`, `X-Forwarded-Proto`, `X-Forwarded-Host`. The default.
            case xForwarded = "x_forwarded"
            /// Nothing added (untrusted clients' own forwarding fields are still removed).
            case none
        }

        public var listen: String
        /// An absolute http(s) URL, without a trailing slash.
        public var upstream: String
        public var forwarded: Forwarded
        /// `routes[].trusted_clients`: clients whose own forwarding fields travel on (another
        /// proxy in front of Sluice). Default: none.
        public var trustedClients: [IPNetwork]
        public init(listen: String, upstream: String, forwarded: Forwarded = .xForwarded, trustedClients: [IPNetwork] = []) {
            self.listen = listen
            self.upstream = upstream
            self.forwarded = forwarded
            self.trustedClients = trustedClients
        }
    }

    /// Sizes a client request may not exceed (each maps to one status: 414, 431, 431, 413),
    /// and the load Sluice takes on: client connections (`ConnectionLimits`) and requests
    /// upstream per worker (`UpstreamAdmission`); beyond those, 503 with `Retry-After`.
    public struct Limits: Sendable, Equatable {
        /// `8 KiB` by default, like nginx's `large_client_header_buffers`.
        public static let defaultRequestLine = 8 * 1024
        /// `64 KiB` by default.
        public static let defaultHeaderSection = 64 * 1024
        /// `100` by default.
        public static let defaultHeaderCount = 100

        public var requestLine: Int
        public var headerSection: Int
        public var headerCount: Int
        /// `nil` (unlimited) by default: a proxy streams bodies and need not bound them.
        public var requestBody: Int64?
        /// Client connections open at once, all workers together; `nil` (`auto`, the default)
        /// derives it from the open-file limit (`ConnectionLimits.automaticMaximum`).
        public var maxConnections: Int?
        /// Client connections open at once from one IP address; `nil` (unlimited) by default.
        public var maxConnectionsPerClient: Int?
        /// Forwarded requests upstream at once per worker; `nil` means unlimited.
        public var maxInFlightUpstream: Int? = Limits.defaultMaxInFlightUpstream
        /// Requests that may wait for an upstream slot per worker (0: refuse at once).
        public var upstreamQueue: Int = Limits.defaultUpstreamQueue
        /// Keys each rate-limit table keeps (`rate_limit`; the least recently used is forgotten
        /// first); also the bound of the origins' holds. A change needs a restart.
        public var rateLimitKeys: Int = RateLimitTable.defaultCapacity
        /// `1000` per worker by default.
        public static let defaultMaxInFlightUpstream = 1000
        /// `1000` per worker by default.
        public static let defaultUpstreamQueue = 1000

        public init(
            requestLine: Int = Limits.defaultRequestLine, headerSection: Int = Limits.defaultHeaderSection,
            headerCount: Int = Limits.defaultHeaderCount, requestBody: Int64? = nil
        ) {
            self.requestLine = requestLine
            self.headerSection = headerSection
            self.headerCount = headerCount
            self.requestBody = requestBody
        }
    }

    /// Timeouts in milliseconds. `nil` means no limit.
    public struct Timeouts: Sendable, Equatable {
        /// `30 s` by default: from the first byte of a request to the end of its head (→ 408).
        public static let defaultClientHeader = 30_000
        /// `60 s` by default: an idle keep-alive client connection is closed after this.
        public static let defaultClientIdle = 60_000
        /// `10 s` by default: TCP and TLS connect to the origin (→ 504).
        public static let defaultUpstreamConnect = 10_000
        /// `60 s` by default: from the start of a try to the upstream's response head (→ 504).
        public static let defaultUpstreamPerTry = 60_000
        /// `30 s` by default: how long in-flight requests may finish after SIGTERM.
        public static let defaultDrain = 30_000

        public var clientHeader: Int
        public var clientIdle: Int
        public var upstreamConnect: Int
        public var upstreamPerTry: Int
        /// The whole exchange, body included; `nil` (unlimited) by default so that long
        /// downloads are not cut.
        public var total: Int?
        public var drain: Int
        /// `10 s` by default: how long a request waits for an upstream slot (→ 503).
        public var upstreamQueue: Int = Timeouts.defaultUpstreamQueue
        public static let defaultUpstreamQueue = 10_000

        public init(
            clientHeader: Int = Timeouts.defaultClientHeader, clientIdle: Int = Timeouts.defaultClientIdle,
            upstreamConnect: Int = Timeouts.defaultUpstreamConnect,
            upstreamPerTry: Int = Timeouts.defaultUpstreamPerTry, total: Int? = nil,
            drain: Int = Timeouts.defaultDrain
        ) {
            self.clientHeader = clientHeader
            self.clientIdle = clientIdle
            self.upstreamConnect = upstreamConnect
            self.upstreamPerTry = upstreamPerTry
            self.total = total
            self.drain = drain
        }
    }

    /// Who may use the proxy and where it may connect.
    public struct Access: Sendable, Equatable {
        /// Loopback only by default (`127.0.0.0/8`, `::1/128`): never an open relay by accident.
        public static let defaultAllowClients = [IPNetwork("127.0.0.0/8")!, IPNetwork("::1/128")!]
        /// `[443]` by default: CONNECT is for TLS, not for tunnelling SMTP or SSH.
        public static let defaultConnectPorts = [443]
        /// Link-local networks and the cloud instance-metadata addresses outside them, so a
        /// client cannot read the host's cloud credentials through the proxy (SSRF):
        /// `169.254.0.0/16` (AWS, GCP, Azure, OCI, DigitalOcean, OpenStack at 169.254.169.254;
        /// ECS task metadata at 169.254.170.2), `fe80::/10`, `fd00:ec2::254/128` (AWS IMDS over
        /// IPv6), `100.100.100.200/32` (Alibaba Cloud), `192.0.0.192/32` (Oracle Cloud Classic)
        /// and `168.63.129.16/32` (Azure WireServer).
        public static let defaultDeny = [
            "169.254.0.0/16", "fe80::/10", "fd00:ec2::254/128", "100.100.100.200/32",
            "192.0.0.192/32", "168.63.129.16/32",
        ].map { IPNetwork($0)! }

        public var allowClients: [IPNetwork]
        public var connectPorts: [Int]
        /// Destinations refused after DNS resolution, on every connection Sluice opens upstream:
        /// forwarded requests, followed redirects, routes, tunnels and token fetches.
        public var deny: [IPNetwork]

        public init(
            allowClients: [IPNetwork] = Access.defaultAllowClients,
            connectPorts: [Int] = Access.defaultConnectPorts, deny: [IPNetwork] = Access.defaultDeny
        ) {
            self.allowClients = allowClients
            self.connectPorts = connectPorts
            self.deny = deny
        }
    }

    /// Process-wide TLS settings. Per-host trust evaluators live in policies (`trust:`).
    public struct TLS: Sendable, Equatable {
        /// A PEM bundle of CAs to trust instead of the system store; `nil` by default. Used by
        /// every evaluator that validates the chain and names no `ca_file` of its own.
        public var caFile: String?
        /// Alamofire's ServerTrustManager flag. `false` by default: a host whose policy names
        /// no `trust` is still verified, by the built-in `default` evaluator. `true` refuses
        /// such hosts, for gateways that want every upstream's trust spelled out.
        public var allHostsMustBeEvaluated: Bool
        /// The interception CA's directory (`ca.pem`, `ca.key`); nil means `defaultCADirectory()`.
        public var caDir: String?

        public init(caFile: String? = nil, allHostsMustBeEvaluated: Bool = false, caDir: String? = nil) {
            self.caFile = caFile
            self.allHostsMustBeEvaluated = allHostsMustBeEvaluated
            self.caDir = caDir
        }

        /// `$STATE_DIRECTORY/ca` under systemd (`StateDirectory=sluice`), else `/var/lib/sluice/ca`.
        public static func defaultCADirectory(environment: [String: String]) -> String {
            if let state = environment["STATE_DIRECTORY"]?.split(separator: ":").first, !state.isEmpty {
                return "\(state)/ca"
            }
            return "/var/lib/sluice/ca"
        }
    }
}
