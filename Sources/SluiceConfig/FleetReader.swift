import SluiceCore

extension NodeReader {
    /// `fleet: { redis: "127.0.0.1:6379" | "unix:/run/redis/redis.sock", database: 0, username:,
    /// password: ${REDIS_PASSWORD}, key_prefix: "sluice:", timeout: 20ms, on_redis_down:
    /// local_share | allow | deny, heartbeat: 2s, cache: {…} }` (docs/fleet.md). Behaviour:
    /// Sources/SluiceServer/Fleet/. `cache:` (`FleetCacheReader.swift`) goes to `cache`; with
    /// it, `redis` may be left out (the members are then its static `peers`).
    mutating func readFleet(_ node: YAMLNode, cache: inout FleetCacheSettings?) -> FleetSettings? {
        var address: FleetSettings.Address?
        var hasAddress = false
        var cacheNode: YAMLNode?
        var rest: [(String, YAMLNode)] = []
        let known = [
            "redis", "database", "username", "password", "key_prefix", "timeout", "on_redis_down", "heartbeat", "cache",
        ]
        entries(node, in: "fleet", known: known) { r, key, value in
            if key == "redis" {
                hasAddress = true
                address = r.redisAddress(value)
            } else if key == "cache" {
                cacheNode = value
            } else {
                rest.append((key, value))
            }
        }
        if let cacheNode { cache = readFleetCache(cacheNode, hasRedis: hasAddress) }
        if !hasAddress, cacheNode == nil, case .mapping = node {
            fail(node, "fleet needs redis: an IP:port such as 127.0.0.1:6379, or unix:/path")
        }
        if !hasAddress, let (key, value) = rest.first {
            fail(value, "fleet.\(key) needs fleet.redis")
        }
        // The other keys are checked even when the address is wrong (every error at once).
        var settings: FleetSettings? = FleetSettings(redis: address ?? .unix(path: "/"))
        for (key, value) in rest {
            switch key {
            case "database":
                if let n = value.scalar.flatMap({ Int($0.string) }), (0...15).contains(n) {
                    settings?.database = n
                } else {
                    fail(value, "database must be 0 to 15")
                }
            case "username":
                settings?.username = secretOrString(value, what: "fleet.username")
            case "password":
                settings?.password = secret(value, what: "fleet.password")
            case "key_prefix":
                if let text = value.scalar?.string, !text.isEmpty, text.count <= 64,
                    !text.contains(where: { $0 == "{" || $0 == "}" || $0.isWhitespace })
                {
                    settings?.keyPrefix = text
                } else {
                    fail(value, "key_prefix must be 1 to 64 characters without spaces, { or }")
                }
            case "timeout":
                if let ms = duration(value, key: key) {
                    if ms >= 1 && ms <= 5000 { settings?.timeout = ms } else { fail(value, "timeout must be 1ms to 5s") }
                }
            case "heartbeat":
                if let ms = duration(value, key: key) {
                    if ms >= 100 && ms <= 60_000 {
                        settings?.heartbeat = ms
                    } else {
                        fail(value, "heartbeat must be 100ms to 60s")
                    }
                }
            default:
                if let word = value.scalar?.string, let mode = FleetSettings.OnRedisDown(rawValue: word) {
                    settings?.onRedisDown = mode
                } else {
                    fail(value, "on_redis_down must be local_share, allow or deny")
                }
            }
        }
        if settings?.username != nil && settings?.password == nil {
            fail(node, "fleet.username needs fleet.password (Redis's AUTH takes both)")
        }
        return address == nil ? nil : settings
    }

    /// `IP:port`, `[v6]:port` or `unix:/absolute/path`; a host name is refused (hiredis 0.14
    /// resolves it with a blocking call, which a worker's loop must never make).
    private mutating func redisAddress(_ node: YAMLNode) -> FleetSettings.Address? {
        guard let text = node.scalar?.string, !text.isEmpty else {
            fail(node, "redis must be an IP:port such as 127.0.0.1:6379, or unix:/path")
            return nil
        }
        if text.hasPrefix("unix:") {
            let path = String(text.dropFirst("unix:".count))
            guard path.hasPrefix("/"), path.utf8.count < 108 else {
                fail(node, "redis unix socket must be an absolute path under 108 bytes, e.g. unix:/run/redis/redis.sock")
                return nil
            }
            return .unix(path: path)
        }
        var host = Substring(text)
        var portText: Substring = ""
        if host.hasPrefix("["), let close = host.firstIndex(of: "]") {
            let rest = host[host.index(after: close)...]
            guard rest.first == ":" else {
                fail(node, "redis must be an IP:port such as [::1]:6379 (a colon after the bracket)")
                return nil
            }
            portText = rest.dropFirst()
            host = host[host.index(after: host.startIndex)..<close]
        } else if let colon = host.lastIndex(of: ":") {
            portText = host[host.index(after: colon)...]
            host = host[..<colon]
            if host.contains(":") {
                fail(node, "redis: write an IPv6 address in brackets, e.g. [::1]:6379")
                return nil
            }
        }
        guard let port = Int(portText), (1...65535).contains(port) else {
            fail(node, "redis must be an IP:port such as 127.0.0.1:6379 (the port is missing or invalid)")
            return nil
        }
        guard IPNetwork.parseAddress(String(host)) != nil else {
            fail(
                node,
                "redis must be an IP address, not the host name '\(host)': hiredis resolves names with a blocking call (use the address, or unix:/path)"
            )
            return nil
        }
        return .tcp(host: String(host), port: port)
    }
}
