import HTTPTypes
import SluiceCore

/// A monitor as configured, before its sink is opened.
struct MonitorSpec {
    enum Kind { case accessLog, debug, metrics }
    var kind: Kind
    var path: String
}

/// Reading of `policies:`, `monitors:`, `routes:` and secret references.
extension NodeReader {
    /// Policy sections that later parts of the pipeline will add; named so that a config
    /// using them fails loudly instead of being half-applied.
    static let reservedPolicyKeys: [String] = []
    /// The plain scalars YAML 1.1 reads as null (`host: ~`, `host: null`).
    static let nullWords: Set<String> = ["~", "null", "Null", "NULL"]
    static let policyKeys =
        [
            "adapters", "redirect", "retry", "validate", "credentials", "trust", "upstream",
            "upstream_proxy", "client_certificate", "health", "intercept", "upgrades", "cache", "resume",
            "rate_limit", "max_body",
        ] + reservedPolicyKeys

    mutating func readPolicies(_ node: YAMLNode) -> [PolicyEntry] {
        guard case .mapping(let mapping) = node else {
            fail(node, "policies must be a mapping of host names to policies")
            return []
        }
        var out: [PolicyEntry] = []
        for (keyNode, value) in mapping {
            guard let name = keyNode.scalar?.string else {
                fail(keyNode, "policy names must be strings")
                continue
            }
            guard PolicyName.isValid(name) else {
                fail(keyNode, "invalid policy name '\(name)': expected 'default', a host name, or '*.suffix'")
                continue
            }
            var entry = PolicyEntry(name: name)
            if case .scalar(let s) = value, s.string.isEmpty || (s.style == .plain && Self.nullWords.contains(s.string)) {
                out.append(entry)  // `host:` with nothing: the default policy, named
                continue
            }
            entries(value, in: "policy '\(name)'", known: Self.policyKeys) { r, key, section in
                switch key {
                case "adapters": entry.adapters = r.readAdapters(section, policy: name)
                case "redirect": entry.redirect = r.readRedirect(section)
                case "retry": entry.retry = r.readRetry(section)
                case "validate": entry.validate = r.readValidate(section)
                case "credentials": entry.credentials = r.readCredentials(section)
                case "trust": entry.trust = r.readTrust(section, policy: name)
                case "upstream": entry.upstream = r.readUpstream(section)
                case "upstream_proxy": entry.upstreamProxy = r.readUpstreamProxy(section)
                case "client_certificate": entry.clientCertificate = r.readClientCertificate(section)
                case "health": entry.health = r.readHealth(section)
                case "intercept": entry.intercept = r.bool(section, key: "intercept")
                case "resume": entry.resume = r.bool(section, key: "resume")
                case "upgrades": entry.upgrades = r.readUpgrades(section)
                case "cache": entry.cache = r.readCache(section)
                case "rate_limit": entry.rateLimit = r.readRateLimit(section)
                case "max_body": entry.maxBody = r.size(section, key: "max_body", min: 1)
                default: r.fail(section, "'\(key)' policies are not supported by this version of Sluice yet")
                }
            }
            out.append(entry)
        }
        return out
    }

    mutating func readRedirect(_ node: YAMLNode) -> Redirector? {
        if let word = node.scalar?.string {
            switch word {
            case "do_not_follow": return .doNotFollow
            case "follow": return .follow
            default:
                fail(node, "redirect must be do_not_follow, follow, { follow: { max: N } } or { modify: { … } }")
                return nil
            }
        }
        guard case .mapping(let m) = node, m.count == 1, let key = m.first!.key.scalar?.string else {
            fail(node, "redirect must be do_not_follow, follow, { follow: { max: N } } or { modify: { … } }")
            return nil
        }
        let options = m.first!.value
        var max = Redirector.defaultMaxHops
        var rewrites: [Redirector.Rewrite] = []
        switch key {
        case "do_not_follow":
            return .doNotFollow
        case "follow", "modify":
            let known = key == "follow" ? ["max"] : ["max", "rewrite"]
            if case .scalar(let s) = options, s.string.isEmpty { break }
            entries(options, in: "redirect.\(key)", known: known) { r, k, v in
                if k == "max" {
                    if let n = v.scalar.flatMap({ Int($0.string) }), n >= 1, n <= 50 {
                        max = n
                    } else {
                        r.fail(v, "max must be 1 to 50")
                    }
                    return
                }
                guard case .sequence(let rules) = v else { return r.fail(v, "rewrite must be a list of { from, to }") }
                for rule in rules {
                    var from: String?
                    var to: String?
                    r.entries(rule, in: "rewrite rule", known: ["from", "to"]) { _, rk, rv in
                        if rk == "from" { from = rv.scalar?.string } else { to = rv.scalar?.string }
                    }
                    if let from, let to, !from.isEmpty {
                        rewrites.append(.init(from: from, to: to))
                    } else {
                        r.fail(rule, "a rewrite rule needs from and to")
                    }
                }
            }
        default:
            let suggestion = DidYouMean.closest(to: key, among: ["do_not_follow", "follow", "modify"])
            fail(m.first!.key, "unknown redirect behaviour '\(key)'" + (suggestion.map { "; did you mean '\($0)'?" } ?? ""))
            return nil
        }
        return key == "follow"
            ? Redirector(behavior: .follow(max: max)) : Redirector(behavior: .modify(max: max, rewrites: rewrites))
    }

    mutating func readRetry(_ node: YAMLNode) -> PolicyEntry.Section<RetryPolicy> {
        if let word = node.scalar?.string {
            if word == "none" || word == "off" { return .off }
            if word.isEmpty { return .on(RetryPolicy()) }
            fail(node, "retry must be a mapping, {} for the defaults, or none")
            return .inherit
        }
        var p = RetryPolicy()
        let known = [
            "limit", "backoff", "methods", "statuses", "errors", "retry_after", "per_try_timeout",
            "deadline", "budget", "buffer_limit",
        ]
        entries(node, in: "retry", known: known) { r, key, value in
            switch key {
            case "limit":
                if let n = value.scalar.flatMap({ Int($0.string) }), n >= 0, n <= 100 {
                    p.limit = n
                } else {
                    r.fail(value, "limit must be 0 to 100")
                }
            case "backoff":
                r.entries(value, in: "retry.backoff", known: ["base", "scale", "max_delay", "jitter"]) { r, k, v in
                    switch k {
                    case "base":
                        if let n = v.scalar.flatMap({ Int($0.string) }), n >= 1, n <= 10 {
                            p.base = n
                        } else {
                            r.fail(v, "base must be 1 to 10")
                        }
                    case "scale": if let ms = r.duration(v, key: k) { p.scale = ms }
                    case "max_delay": if let ms = r.duration(v, key: k) { p.maxDelay = ms }
                    default:
                        if let j = v.scalar.flatMap({ RetryPolicy.Jitter(rawValue: $0.string) }) {
                            p.jitter = j
                        } else {
                            r.fail(v, "jitter must be none, full or equal")
                        }
                    }
                }
            case "methods":
                var methods: Set<String> = []
                for (m, n) in r.strings(value, what: key) ?? [] {
                    if !m.isEmpty, m.allSatisfy({ $0.isUppercase || $0 == "-" }) {
                        methods.insert(m)
                    } else {
                        r.fail(n, "methods are upper-case HTTP methods, not '\(m)'")
                    }
                }
                p.methods = methods
            case "statuses":
                var statuses: Set<Int> = []
                for (text, n) in r.strings(value, what: key) ?? [] {
                    if let code = Int(text), (100...599).contains(code) {
                        statuses.insert(code)
                    } else {
                        r.fail(n, "invalid status '\(text)'")
                    }
                }
                p.statuses = statuses
            case "errors":
                var kinds: Set<TransportErrorKind> = []
                let names = TransportErrorKind.allCases.filter { $0 != .other }.map(\.rawValue)
                for (text, n) in r.strings(value, what: key) ?? [] {
                    if let kind = TransportErrorKind(rawValue: text), kind != .other {
                        kinds.insert(kind)
                    } else {
                        r.fail(n, "unknown error kind '\(text)' (kinds: \(names.joined(separator: ", ")))")
                    }
                }
                p.errors = kinds
            case "retry_after":
                if let b = r.bool(value, key: key) { p.retryAfter = b }
            case "per_try_timeout": p.perTryTimeout = r.duration(value, key: key)
            case "deadline":
                p.deadline = value.scalar?.string == "unlimited" ? nil : r.duration(value, key: key)
            case "budget":
                var ratio = 0.2
                var minimum = 3
                r.entries(value, in: "retry.budget", known: ["ratio", "min_per_second"]) { r, k, v in
                    if k == "ratio" {
                        if let d = v.scalar.flatMap({ Double($0.string) }), d >= 0, d <= 10 {
                            ratio = d
                        } else {
                            r.fail(v, "ratio must be a number from 0 to 10")
                        }
                    } else if let n = v.scalar.flatMap({ Int($0.string) }), n >= 0 {
                        minimum = n
                    } else {
                        r.fail(v, "min_per_second must be a whole number")
                    }
                }
                p.budget = .init(ratio: ratio, minPerSecond: minimum)
            default:
                if let n = r.size(value, key: key, min: 0) { p.bufferLimit = Int(n) }
            }
        }
        return .on(p)
    }

    mutating func readValidate(_ node: YAMLNode) -> PolicyEntry.Section<ResponseValidator> {
        if node.scalar?.string == "none" { return .off }
        var v = ResponseValidator()
        entries(node, in: "validate", known: ["status", "content_type"]) { r, key, value in
            if key == "content_type" {
                v.contentTypes = (r.strings(value, what: key) ?? []).map(\.0)
                return
            }
            var ranges: [ClosedRange<Int>] = []
            for (text, n) in r.strings(value, what: key) ?? [] {
                let bounds = text.split(separator: "-").map { Int(String($0).trimmingWhitespace()) }
                if bounds.count == 1, let a = bounds[0], (100...599).contains(a) {
                    ranges.append(a...a)
                } else if bounds.count == 2, let a = bounds[0], let b = bounds[1], a <= b, (100...599).contains(a),
                    (100...599).contains(b)
                {
                    ranges.append(a...b)
                } else {
                    r.fail(n, "status must be a code or a range like 200-299, not '\(text)'")
                }
            }
            v.statuses = ranges
        }
        return .on(v)
    }

    mutating func readCredentials(_ node: YAMLNode) -> PolicyEntry.Section<Credentials> {
        if node.scalar?.string == "none" { return .off }
        var username: String?
        var password: Secret?
        entries(node, in: "credentials", known: ["username", "password"]) { r, key, value in
            if key == "username" {
                username = r.secretOrString(value, what: "username")
            } else {
                password = r.secret(value, what: "password")
            }
        }
        guard let username, let password else {
            fail(node, "credentials needs username and password")
            return .inherit
        }
        return .on(Credentials(username: username, password: password))
    }

    mutating func readMonitors(_ node: YAMLNode) -> [(MonitorSpec, YAMLNode)] {
        guard case .sequence(let items) = node else {
            fail(node, "monitors must be a list, e.g. [ { access_log: { path: stdout } } ]")
            return []
        }
        var out: [(MonitorSpec, YAMLNode)] = []
        for item in items {
            guard case .mapping(let m) = item, m.count == 1, let name = m.first!.key.scalar?.string else {
                fail(item, "each monitor is a one-key map such as '- access_log: { path: stdout }'")
                continue
            }
            let kinds: [String: MonitorSpec.Kind] = ["access_log": .accessLog, "debug": .debug, "metrics": .metrics]
            guard let kind = kinds[name] else {
                let s = DidYouMean.closest(to: name, among: Array(kinds.keys).sorted())
                fail(
                    m.first!.key,
                    "unknown monitor '\(name)'"
                        + (s.map { "; did you mean '\($0)'?" } ?? " (monitors: access_log, debug, metrics)"))
                continue
            }
            var spec = MonitorSpec(kind: kind, path: kind == .accessLog ? "stdout" : "stderr")
            let options = m.first!.value
            if !(options.scalar.map { $0.string.isEmpty } ?? false) {
                let known = kind == .accessLog ? ["path"] : kind == .metrics ? [] : ["path", "curl"]
                entries(options, in: name, known: known) { r, key, value in
                    if key == "path" {
                        if let p = value.scalar?.string, !p.isEmpty {
                            spec.path = p
                        } else {
                            r.fail(value, "path must be a file, stdout or stderr")
                        }
                    } else if value.scalar?.string != "true" {
                        r.fail(value, "curl can only be true (the debug monitor prints curl commands)")
                    }
                }
            }
            out.append((spec, item))
        }
        return out
    }

    mutating func readRoutes(_ node: YAMLNode, into routes: inout [ServerConfiguration.Route]) {
        guard case .sequence(let items) = node else { return fail(node, "routes must be a list of { listen, upstream }") }
        var out: [ServerConfiguration.Route] = []
        for item in items {
            var listen: String?
            var upstream: String?
            var forwarded = ServerConfiguration.Route.Forwarded.xForwarded
            var trusted: [IPNetwork] = []
            entries(item, in: "route", known: ["listen", "upstream", "forwarded", "trusted_clients"]) { r, key, value in
                if key == "trusted_clients" {
                    if let networks = r.networks(value, key: key) { trusted = networks }
                    return
                }
                guard let text = value.scalar?.string else { return r.fail(value, "\(key) must be a string") }
                if key == "forwarded" {
                    if let style = ServerConfiguration.Route.Forwarded(rawValue: text) {
                        forwarded = style
                    } else {
                        let names = ServerConfiguration.Route.Forwarded.allCases.map(\.rawValue).joined(separator: ", ")
                        r.fail(value, "forwarded must be one of \(names)")
                    }
                } else if key == "listen" {
                    if ListenAddress.isValid(text) {
                        listen = text
                        r.listenNodes.append((text, value))
                    } else {
                        r.fail(value, "invalid listen address '\(text)': expected IP:port")
                    }
                } else {
                    let lower = text.lowercased()
                    let parts = URLParts(text)
                    if (lower.hasPrefix("http://") || lower.hasPrefix("https://")) && !parts.host.isEmpty
                        && !text.contains("?") && !text.contains("#") && !parts.authority.contains("@")
                    {
                        upstream = text.hasSuffix("/") ? String(text.dropLast()) : text
                    } else {
                        r.fail(
                            value,
                            "upstream must be an http:// or https:// base URL without query, e.g. https://api.example.com/v1")
                    }
                }
            }
            if let listen, let upstream {
                out.append(.init(listen: listen, upstream: upstream, forwarded: forwarded, trustedClients: trusted))
            } else if case .mapping = item {
                fail(item, "a route needs listen and upstream")
            }
        }
        routes = out
    }

    // MARK: values

    public mutating func fieldName(_ text: String, at node: YAMLNode) -> HTTPField.Name? {
        guard let name = HTTPField.Name(text) else {
            fail(node, "invalid header field name '\(text)'")
            return nil
        }
        return name
    }

    /// A plain string, or the value of a secret reference (which is then redacted in logs).
    public mutating func secretOrString(_ node: YAMLNode, what: String) -> String? {
        guard let text = node.scalar?.string else {
            fail(node, "\(what) must be a string")
            return nil
        }
        if SecretReference.isReference(text) { return secret(node, what: what)?.value }
        return text
    }

    /// A secret: `${ENV}`, `file:/path`, or an inline value (also redacted everywhere).
    public mutating func secret(_ node: YAMLNode, what: String) -> Secret? {
        guard let text = node.scalar?.string, !text.isEmpty else {
            fail(node, "\(what) must be a string or a secret reference (${ENV_VAR} or file:/path)")
            return nil
        }
        switch SecretReference.resolve(text) {
        case .success(let secret):
            secrets.append(secret)
            return secret
        case .failure(let problem):
            fail(node, "\(what): \(problem.message)")
            return nil
        }
    }
}

enum SecretReference {
    struct Problem: Error { let message: String }

    static func isReference(_ text: String) -> Bool {
        (text.hasPrefix("${") && text.hasSuffix("}")) || text.hasPrefix("file:")
    }

    static func resolve(_ text: String) -> Result<Secret, Problem> {
        if text.hasPrefix("${") && text.hasSuffix("}") {
            let name = String(text.dropFirst(2).dropLast())
            guard !name.isEmpty, name.allSatisfy({ $0.isLetter || $0.isNumber || $0 == "_" }) else {
                return .failure(Problem(message: "invalid environment reference '\(text)'"))
            }
            guard let value = FileContents.environment(name), !value.isEmpty else {
                return .failure(Problem(message: "environment variable \(name) is not set"))
            }
            return .success(Secret(value, source: text))
        }
        if text.hasPrefix("file:") {
            let path = String(text.dropFirst(5))
            guard let raw = FileContents.text(atPath: path) else {
                return .failure(Problem(message: "cannot read secret file \(path)"))
            }
            var value = Substring(raw)
            while value.last == "\n" || value.last == "\r" { value = value.dropLast() }
            guard !value.isEmpty else { return .failure(Problem(message: "secret file \(path) is empty")) }
            return .success(Secret(String(value), source: text))
        }
        return .success(Secret(text, source: "inline"))
    }
}

enum PolicyName {
    static func isValid(_ name: String) -> Bool {
        if name == PolicyTable.defaultName { return true }
        let host = name.hasPrefix("*.") ? String(name.dropFirst(2)) : name
        guard !host.isEmpty, !host.hasPrefix("."), !host.hasSuffix(".") || host.count > 1 else { return false }
        if IPNetwork.parseAddress(host) != nil { return !name.hasPrefix("*.") }
        return host.allSatisfy { $0.isLetter || $0.isNumber || $0 == "-" || $0 == "." || $0 == "_" } && !host.contains("..")
    }
}
