import SluiceCore

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// One problem in a configuration file, located at `file:line:column`.
public struct ConfigIssue: Sendable, Equatable, CustomStringConvertible {
    public var file: String
    public var line: Int
    public var column: Int
    public var message: String
    public var description: String { "\(file):\(line):\(column): error: \(message)" }
}

/// Every problem found in one file; loading reports them all at once rather than one per run.
public struct ConfigError: Error, Sendable, CustomStringConvertible {
    public var issues: [ConfigIssue]
    public var description: String { issues.map(\.description).joined(separator: "\n") }
}

/// Reads Sluice's YAML into a validated `ServerConfiguration`.
///
/// Provision, then validate, as Caddy does: every key is looked up in a table of known keys
/// (unknown ones are errors with a did-you-mean), every value is parsed with its unit, and
/// every error carries the file, line and column of the offending node.
public enum ConfigLoader {
    /// The configuration `sluice run` uses without `--config` (`config/default.yaml`).
    public static let embeddedDefault = String(decoding: PackageResources.default_yaml, as: UTF8.self)
    public static let embeddedDefaultName = "<embedded default>"

    /// `kinds`: the interceptor kinds `adapters:` may name (an embedding program adds its own,
    /// docs/library.md).
    public static func load(path: String, kinds: InterceptorRegistry = .builtIn) throws -> SluiceConfiguration {
        guard let data = FileContents.bytes(atPath: path) else {
            throw ConfigError(issues: [
                ConfigIssue(
                    file: path, line: 0, column: 0,
                    message: "cannot read file: \(String(cString: strerror(errno)))")
            ])
        }
        guard let text = String(validating: data, as: UTF8.self) else {
            throw ConfigError(issues: [ConfigIssue(file: path, line: 0, column: 0, message: "file is not UTF-8")])
        }
        return try parse(yaml: text, file: path, kinds: kinds)
    }

    public static func parse(yaml: String, file: String, kinds: InterceptorRegistry = .builtIn) throws -> SluiceConfiguration {
        try parse(yaml: yaml, file: file, logSinks: .open, kinds: kinds)
    }

    /// Whether loading opens the monitors' log files.
    enum LogSinkOpening {
        /// Opens (creates) each file and starts its writer: a configuration about to run.
        case open
        /// Checks the monitors but opens nothing, so loading creates no file and starts no
        /// thread (the fuzz target, which loads millions of inputs).
        case skip
    }

    static func parse(
        yaml: String, file: String, logSinks: LogSinkOpening, kinds: InterceptorRegistry = .builtIn
    ) throws -> SluiceConfiguration {
        var reader = NodeReader(file: file, logSinks: logSinks, kinds: kinds)
        let root: YAMLNode?
        do {
            root = try YAMLReader.read(yaml)
        } catch {
            throw ConfigError(issues: [reader.issue(for: error)])
        }
        var config = SluiceConfiguration()
        guard let root else { return config }  // an empty file means all defaults
        reader.readRoot(root, into: &config)
        if !reader.issues.isEmpty { throw ConfigError(issues: reader.issues) }
        return config
    }
}

/// Walks the composed YAML tree, collecting issues instead of stopping at the first.
///
/// An interceptor kind (`InterceptorKind`) reads its settings with the public methods below:
/// each reports a problem at the node it is about (file, line, column) and answers nil, so
/// that loading goes on and reports every problem at once.
public struct NodeReader {
    let file: String
    var logSinks: ConfigLoader.LogSinkOpening = .open
    /// The kinds `adapters:` may name.
    var kinds: InterceptorRegistry = .builtIn
    var issues: [ConfigIssue] = []
    /// Query parameters whose values are redacted in logs (`redact_query`, and those a kind
    /// puts its secrets in).
    var redactedQueryParameters: Set<String> = []
    /// Every secret read so far, for the redactor.
    var secrets: [Secret] = []
    /// Every listen address (forward and routes) with its node, to refuse duplicates.
    var listenNodes: [(String, YAMLNode)] = []
    /// `access.proxy_auth`, with its users file read (ProxyAuthReader).
    var proxyAuthentication: ProxyAuthentication?
    /// `fleet.cache.advertise`'s node, for the check that needs every listener read first.
    var fleetAdvertiseNode: YAMLNode?

    /// Values of the query parameter `name` are secrets: logs show them redacted (an
    /// adapter that puts a key in the query, as `api_key` can).
    public mutating func redactQueryParameter(_ name: String) {
        redactedQueryParameters.insert(name)
    }

    public mutating func fail(_ node: YAMLNode?, _ message: String) {
        let mark = node?.mark
        issues.append(ConfigIssue(file: file, line: mark?.line ?? 0, column: mark?.column ?? 0, message: message))
    }

    func issue(for error: YAMLError) -> ConfigIssue {
        ConfigIssue(file: file, line: error.mark.line, column: error.mark.column, message: "invalid YAML: \(error.problem)")
    }

    /// Iterates a mapping's entries, reporting keys that are not in `known` (with the closest
    /// known key as a suggestion) and keys that are not plain strings.
    public mutating func entries(
        _ node: YAMLNode, in section: String, known: [String],
        _ body: (inout NodeReader, String, YAMLNode) -> Void
    ) {
        guard case .mapping(let mapping) = node else {
            fail(node, "\(section) must be a mapping")
            return
        }
        for (keyNode, value) in mapping {
            guard let key = keyNode.scalar?.string else {
                fail(keyNode, "keys in \(section) must be strings")
                continue
            }
            guard known.contains(key) else {
                var message = "unknown key '\(key)' in \(section)"
                if let suggestion = DidYouMean.closest(to: key, among: known) {
                    message += "; did you mean '\(suggestion)'?"
                } else {
                    message += " (known keys: \(known.joined(separator: ", ")))"
                }
                fail(keyNode, message)
                continue
            }
            body(&self, key, value)
        }
    }

    // MARK: sections

    mutating func readRoot(_ root: YAMLNode, into config: inout SluiceConfiguration) {
        let known = [
            "listen", "workers", "limits", "timeouts", "access", "tls", "policies", "routes",
            "monitors", "redact_query", "admin", "log_format", "log_level", "upstream", "cache_store", "fleet",
        ]
        var policyEntries: [PolicyEntry] = []
        var monitorSpecs: [(MonitorSpec, YAMLNode)] = []
        entries(root, in: "the top level", known: known) { r, key, value in
            switch key {
            case "listen": r.readListen(value, into: &config.server.listen)
            case "workers": r.readWorkers(value, into: &config.server.workers)
            case "limits": r.readLimits(value, into: &config.server.limits)
            case "timeouts": r.readTimeouts(value, into: &config.server.timeouts)
            case "access": r.readAccess(value, into: &config.server.access)
            case "tls": r.readTLS(value, into: &config.server.tls)
            case "routes": r.readRoutes(value, into: &config.server.routes)
            case "admin": r.readAdmin(value, into: &config.server.admin)
            case "upstream": r.readUpstreamPool(value, into: &config.server.upstream)
            case "log_format": r.readLogFormat(value, into: &config.server.logFormat)
            case "log_level": r.readLogLevel(value, into: &config.server.logLevel)
            case "policies": policyEntries = r.readPolicies(value)
            case "monitors": monitorSpecs = r.readMonitors(value)
            case "cache_store": config.server.cacheStore = r.readCacheStore(value)
            case "fleet": config.server.fleet = r.readFleet(value, cache: &config.server.fleetCache)
            default:
                for (name, _) in r.strings(value, what: key) ?? [] { r.redactedQueryParameters.insert(name) }
            }
        }
        var seen: Set<String> = []
        for (address, node) in listenNodes where !seen.insert(address).inserted {
            fail(node, "listen address \(address) is used twice (listen and routes each need their own)")
        }
        checkExposedListeners(config.server)
        checkFleetAdvertise(config.server)
        let redactor = Redactor(secretValues: secrets.map(\.value), queryParameters: redactedQueryParameters)
        var monitors: [any EventMonitorFactory] = []
        for (spec, node) in monitorSpecs {
            if spec.kind == .metrics {
                monitors.append(MetricsMonitorFactory())
                continue
            }
            guard logSinks == .open else { continue }
            do {
                let sink = try LogSink.shared(path: spec.path)
                switch spec.kind {
                case .accessLog: monitors.append(LogMonitorFactory<AccessLogMonitor>(sink: sink, redactor: redactor))
                case .debug: monitors.append(LogMonitorFactory<DebugMonitor>(sink: sink, redactor: redactor))
                case .metrics: break
                }
            } catch {
                fail(node, "\(error)")
            }
        }
        config.pipeline = Pipeline(
            policies: PolicyTable(entries: policyEntries, allHostsMustBeEvaluated: config.server.tls.allHostsMustBeEvaluated),
            monitors: monitors, redactor: redactor)
        config.pipeline.proxyAuthentication = proxyAuthentication
        let kinds = kinds
        config.pipeline.describeAdapter = { kinds.describe($0) }
    }

    mutating func readListen(_ node: YAMLNode, into listen: inout [String]) {
        let items = strings(node, what: "listen")
        guard let items else { return }
        if items.isEmpty { fail(node, "listen needs at least one address") }
        var out: [String] = []
        for (item, itemNode) in items {
            if ListenAddress.isValid(item) {
                out.append(item)
                listenNodes.append((item, itemNode))
            } else {
                fail(itemNode, "invalid listen address '\(item)': expected IP:port, e.g. 127.0.0.1:3128 or [::1]:3128")
            }
        }
        listen = out
    }

    mutating func readWorkers(_ node: YAMLNode, into workers: inout Int?) {
        guard let text = node.scalar?.string else { return fail(node, "workers must be 'auto' or a number") }
        if text == "auto" {
            workers = nil
        } else if let n = Int(text), n >= 1, n <= 256 {
            workers = n
        } else {
            fail(node, "workers must be 'auto' or a number from 1 to 256, not '\(text)'")
        }
    }

    mutating func readLimits(_ node: YAMLNode, into limits: inout ServerConfiguration.Limits) {
        let known = [
            "request_line", "header_section", "header_count", "request_body", "max_connections",
            "max_connections_per_client", "max_in_flight_upstream", "upstream_queue", "rate_limit_keys",
        ]
        entries(node, in: "limits", known: known) { r, key, value in
            switch key {
            case "max_connections":
                if value.scalar?.string == "auto" {
                    limits.maxConnections = nil
                    return
                }
                if let n = r.count(value, key: key, min: 1, word: "auto") { limits.maxConnections = n }
            case "max_connections_per_client", "max_in_flight_upstream":
                var n: Int?
                if value.scalar?.string != "unlimited" {
                    guard let parsed = r.count(value, key: key, min: 1, word: "unlimited") else { return }
                    n = parsed
                }
                if key == "max_in_flight_upstream" { limits.maxInFlightUpstream = n } else { limits.maxConnectionsPerClient = n }
            case "upstream_queue": if let n = r.count(value, key: key, min: 0) { limits.upstreamQueue = n }
            case "rate_limit_keys": if let n = r.count(value, key: key, min: 1) { limits.rateLimitKeys = n }
            case "request_line": if let n = r.size(value, key: key, min: 64) { limits.requestLine = Int(n) }
            case "header_section": if let n = r.size(value, key: key, min: 256) { limits.headerSection = Int(n) }
            case "header_count":
                if let n = value.scalar.flatMap({ Int($0.string) }), n >= 1, n <= 10_000 {
                    limits.headerCount = n
                } else {
                    r.fail(value, "header_count must be a number from 1 to 10000")
                }
            default:
                if value.scalar?.string == "unlimited" {
                    limits.requestBody = nil
                } else if let n = r.size(value, key: key, min: 0) {
                    limits.requestBody = n
                }
            }
        }
    }

    mutating func readTimeouts(_ node: YAMLNode, into t: inout ServerConfiguration.Timeouts) {
        let known = [
            "client_header", "client_idle", "upstream_connect", "upstream_per_try", "total", "drain",
            "upstream_queue",
        ]
        entries(node, in: "timeouts", known: known) { r, key, value in
            if key == "total" {
                if value.scalar?.string == "unlimited" {
                    t.total = nil
                    return
                }
                if let ms = r.duration(value, key: key) { t.total = ms }
                return
            }
            guard let ms = r.duration(value, key: key) else { return }
            switch key {
            case "client_header": t.clientHeader = ms
            case "client_idle": t.clientIdle = ms
            case "upstream_connect": t.upstreamConnect = ms
            case "upstream_per_try": t.upstreamPerTry = ms
            case "upstream_queue": t.upstreamQueue = ms
            default: t.drain = ms
            }
        }
    }

    mutating func readAccess(_ node: YAMLNode, into access: inout ServerConfiguration.Access) {
        entries(node, in: "access", known: ["allow_clients", "connect_ports", "deny", "proxy_auth"]) { r, key, value in
            switch key {
            case "proxy_auth":
                r.readProxyAuth(value)
            case "connect_ports":
                guard let items = r.strings(value, what: key) else { return }
                var ports: [Int] = []
                for (text, itemNode) in items {
                    if let p = Int(text), p >= 1, p <= 65535 {
                        ports.append(p)
                    } else {
                        r.fail(itemNode, "invalid port '\(text)' in connect_ports")
                    }
                }
                access.connectPorts = ports
            default:
                guard let networks = r.networks(value, key: key) else { return }
                if key == "allow_clients" { access.allowClients = networks } else { access.deny = networks }
            }
        }
    }

    mutating func readTLS(_ node: YAMLNode, into tls: inout ServerConfiguration.TLS) {
        entries(node, in: "tls", known: ["ca_file", "all_hosts_must_be_evaluated", "ca_dir"]) { r, key, value in
            switch key {
            case "all_hosts_must_be_evaluated":
                tls.allHostsMustBeEvaluated = r.bool(value, key: key) ?? false
            case "ca_dir":
                guard let path = value.scalar?.string, path.hasPrefix("/") else {
                    return r.fail(value, "ca_dir must be an absolute path")
                }
                tls.caDir = path
            default:
                guard let path = value.scalar?.string, !path.isEmpty else { return r.fail(value, "ca_file must be a path") }
                if !FileContents.isReadable(atPath: path) {
                    r.fail(value, "ca_file '\(path)' is not a readable file")
                }
                tls.caFile = path
            }
        }
    }

    // MARK: values

    /// A scalar or a sequence of scalars, with each item's node for error locations.
    /// A list of CIDR networks (or one); each bad entry is an error at its own node.
    mutating func networks(_ node: YAMLNode, key: String) -> [IPNetwork]? {
        guard let items = strings(node, what: key) else { return nil }
        var networks: [IPNetwork] = []
        for (text, itemNode) in items {
            if let network = IPNetwork(text) {
                networks.append(network)
            } else {
                fail(itemNode, "invalid network '\(text)' in \(key): expected CIDR such as 10.0.0.0/8 or ::1/128")
            }
        }
        return networks
    }

    public mutating func strings(_ node: YAMLNode, what: String) -> [(String, YAMLNode)]? {
        switch node {
        case .scalar(let s): return [(s.string, node)]
        case .sequence(let seq):
            var out: [(String, YAMLNode)] = []
            for item in seq {
                guard let s = item.scalar?.string else {
                    fail(item, "items of \(what) must be scalars")
                    continue
                }
                out.append((s, item))
            }
            return out
        default:
            fail(node, "\(what) must be a list")
            return nil
        }
    }

    /// A whole number from `min` to 10,000,000 (or the `word` that stands for no number, named
    /// in the error); anything else is an error at the node.
    public mutating func count(_ node: YAMLNode, key: String, min: Int, word: String? = nil) -> Int? {
        if let n = node.scalar.flatMap({ Int($0.string) }), n >= min, n <= 10_000_000 { return n }
        fail(node, "\(key) must be \(word.map { "'\($0)' or " } ?? "")a number from \(min) to 10000000")
        return nil
    }

    /// `true` or `false`; anything else is an error at the node.
    public mutating func bool(_ node: YAMLNode, key: String) -> Bool? {
        switch node.scalar?.string {
        case "true": return true
        case "false": return false
        default:
            fail(node, "\(key) must be true or false")
            return nil
        }
    }

    public mutating func size(_ node: YAMLNode, key: String, min: Int64) -> Int64? {
        guard let text = node.scalar?.string, let n = Units.bytes(text) else {
            fail(node, "\(key) must be a size such as 8KiB, 10MiB or 1048576")
            return nil
        }
        guard n >= min else {
            fail(node, "\(key) must be at least \(min) bytes")
            return nil
        }
        return n
    }

    public mutating func duration(_ node: YAMLNode, key: String) -> Int? {
        guard let text = node.scalar?.string, let ms = Units.milliseconds(text) else {
            fail(node, "\(key) must be a duration such as 500ms, 30s or 5m")
            return nil
        }
        guard ms > 0 else {
            fail(node, "\(key) must be longer than 0")
            return nil
        }
        return ms
    }
}

/// `IP:port` listen addresses, numeric only: a listener never depends on DNS.
enum ListenAddress {
    static func isValid(_ text: String) -> Bool {
        let host: Substring
        let port: Substring
        if text.hasPrefix("[") {
            guard let close = text.firstIndex(of: "]"), text[text.index(after: close)...].hasPrefix(":") else { return false }
            host = text[text.index(after: text.startIndex)..<close]
            port = text[text.index(close, offsetBy: 2)...]
            guard IPNetwork.parseAddress(String(host))?.count == 16 else { return false }
        } else {
            guard let colon = text.lastIndex(of: ":") else { return false }
            host = text[..<colon]
            port = text[text.index(after: colon)...]
            guard IPNetwork.parseAddress(String(host))?.count == 4 else { return false }
        }
        guard let p = Int(port), p >= 1, p <= 65535 else { return false }
        return true
    }

    /// A valid address in 127.0.0.0/8 or ::1.
    static func isLoopback(_ text: String) -> Bool {
        guard isValid(text) else { return false }
        let host = text.hasPrefix("[") ? String(text.dropFirst().prefix { $0 != "]" }) : String(text[..<text.lastIndex(of: ":")!])
        guard let bytes = IPNetwork.parseAddress(host) else { return false }
        if bytes.count == 4 { return bytes[0] == 127 }
        return bytes.dropLast().allSatisfy { $0 == 0 } && bytes.last == 1
    }
}
