import SluiceConfig
import SluiceCore

/// `GET /config`: the configuration running now (after the last reload that took), as the
/// admin API shows it. Secrets never appear: a secret setting shows `<redacted>` and where
/// the value came from (`${NAME}`, `file:…`, `inline`); policy descriptions are those of
/// `sluice check --host`, scrubbed of every secret value.
struct ConfigurationView: Encodable {
    struct Server: Encodable {
        let listen: [String]
        let workers: String
        let limits: [String: Int64?]
        let timeouts: [String: Int?]
        let access: Access
        let tls: TLS
        let routes: [Route]
        let admin: [String: String]?
        /// `upstream:` (per worker): max_connections_per_host (0: no limit), max_streams.
        let upstream: [String: Int]
        /// `cache_store` in bytes; null: no cache.
        let cacheStore: CacheStoreView?
        enum CodingKeys: String, CodingKey {
            case listen, workers, limits, timeouts, access, tls, routes, admin, upstream
            case cacheStore = "cache_store"
        }
    }

    /// `cache_store`: sizes in bytes; `disk` only with a disk tier.
    struct CacheStoreView: Encodable {
        let memory: Int64
        let maxObjectSize: Int64
        let disk: Disk?
        struct Disk: Encodable {
            let path: String
            let size: Int64
        }
        enum CodingKeys: String, CodingKey {
            case memory, disk
            case maxObjectSize = "max_object_size"
        }
    }

    struct Access: Encodable {
        let allowClients: [String]
        let connectPorts: [Int]
        let deny: [String]
        enum CodingKeys: String, CodingKey {
            case allowClients = "allow_clients"
            case connectPorts = "connect_ports"
            case deny
        }
    }

    struct Route: Encodable {
        let listen: String
        let upstream: String
        let forwarded: String
        let trustedClients: [String]
        enum CodingKeys: String, CodingKey {
            case listen, upstream, forwarded
            case trustedClients = "trusted_clients"
        }
    }

    struct TLS: Encodable {
        let caFile: String?
        let caDir: String?
        let allHostsMustBeEvaluated: Bool
        enum CodingKeys: String, CodingKey {
            case caFile = "ca_file"
            case caDir = "ca_dir"
            case allHostsMustBeEvaluated = "all_hosts_must_be_evaluated"
        }
    }

    struct Policy: Encodable {
        let name: String
        let description: [String]
    }

    let configurationGeneration: Int
    let source: String
    let server: Server
    let policies: [Policy]
    let monitors: [String]

    enum CodingKeys: String, CodingKey {
        case configurationGeneration = "configuration_generation"
        case source, server, policies, monitors
    }

    init(_ configuration: SluiceConfiguration, generation: Int, source: String?) {
        configurationGeneration = generation
        self.source = source ?? "the embedded default"
        let s = configuration.server
        server = Server(
            listen: s.listen,
            workers: s.workers.map(String.init) ?? "auto",
            limits: [
                "request_line": Int64(s.limits.requestLine), "header_section": Int64(s.limits.headerSection),
                "header_count": Int64(s.limits.headerCount), "request_body": s.limits.requestBody,
                // max_connections: the number in force (auto resolved); null: unlimited
                "max_connections": Int64(ConnectionLimits.effectiveMaximum(s.limits)),
                "max_connections_per_client": s.limits.maxConnectionsPerClient.map(Int64.init),
                "max_in_flight_upstream": s.limits.maxInFlightUpstream.map(Int64.init),
                "upstream_queue": Int64(s.limits.upstreamQueue),
                "rate_limit_keys": Int64(s.limits.rateLimitKeys),
            ],
            timeouts: [
                "client_header": s.timeouts.clientHeader, "client_idle": s.timeouts.clientIdle,
                "upstream_connect": s.timeouts.upstreamConnect, "upstream_per_try": s.timeouts.upstreamPerTry,
                "total": s.timeouts.total, "drain": s.timeouts.drain, "upstream_queue": s.timeouts.upstreamQueue,
            ],
            access: Access(
                allowClients: s.access.allowClients.map(\.description), connectPorts: s.access.connectPorts,
                deny: s.access.deny.map(\.description)),
            tls: TLS(caFile: s.tls.caFile, caDir: s.tls.caDir, allHostsMustBeEvaluated: s.tls.allHostsMustBeEvaluated),
            routes: s.routes.map {
                Route(
                    listen: $0.listen, upstream: $0.upstream, forwarded: $0.forwarded.rawValue,
                    trustedClients: $0.trustedClients.map(\.description))
            },
            admin: s.admin.map { admin in
                var view = ["listen": admin.listen]
                if let token = admin.token { view["token"] = "\(token) (\(token.source))" }
                return view
            },
            upstream: [
                "max_connections_per_host": s.upstream.maxConnectionsPerHost,
                "max_streams": s.upstream.maxStreams,
            ],
            cacheStore: s.cacheStore.map {
                CacheStoreView(
                    memory: $0.memory, maxObjectSize: $0.maxObjectSize, disk: $0.disk.map { .init(path: $0.path, size: $0.size) })
            })
        let pipeline = configuration.pipeline
        policies = pipeline.policies.names.map { name in
            let text = PolicyDescription.describe(pipeline, host: name)
            // The first line names the host asked about; the rest describe the policy.
            return Policy(
                name: name,
                description: text.split(separator: "\n").dropFirst().map {
                    String($0.drop { $0 == " " })
                })
        }
        monitors = pipeline.monitors.map(\.summary)
    }
}
