import Foundation
import HTTPTypes
import SluiceCore
import Yams

/// A monitor as configured, before its sink is opened.
struct MonitorSpec {
    enum Kind { case accessLog, debug }
    var kind: Kind
    var path: String
}

/// Reading of `policies:`, `monitors:`, `routes:` and secret references.
extension NodeReader {
    /// Policy sections that later parts of the pipeline will add; named so that a config
    /// using them fails loudly instead of being half-applied.
    static let reservedPolicyKeys = ["retry", "validate", "cache", "trust", "upstream", "intercept", "credentials"]
    static let policyKeys = ["adapters", "redirect"] + reservedPolicyKeys
    static let adapterNames = ["headers", "bearer", "basic", "api_key", "deflate"]

    mutating func readPolicies(_ node: Node) -> [PolicyEntry] {
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
            if case .scalar(let s) = value, s.string.isEmpty || s.tag.description.hasSuffix("null") {
                out.append(entry)  // `host:` with nothing: the default policy, named
                continue
            }
            entries(value, in: "policy '\(name)'", known: Self.policyKeys) { r, key, section in
                switch key {
                case "adapters": entry.adapters = r.readAdapters(section, policy: name)
                case "redirect": entry.redirect = r.readRedirect(section)
                default: r.fail(section, "'\(key)' policies are not supported by this version of Sluice yet")
                }
            }
            out.append(entry)
        }
        return out
    }

    mutating func readAdapters(_ node: Node, policy: String) -> [any RequestAdapter] {
        guard case .sequence(let items) = node else {
            fail(node, "adapters must be a list, e.g. [ { bearer: ${TOKEN} } ]")
            return []
        }
        var out: [any RequestAdapter] = []
        for item in items {
            var name: String?
            var options: Node?
            switch item {
            case .scalar(let s):
                name = s.string
            case .mapping(let m) where m.count == 1:
                name = m.first!.key.scalar?.string
                options = m.first!.value
            default:
                fail(item, "each adapter is a one-key map (e.g. '- bearer: ${TOKEN}') or a bare name ('- deflate')")
                continue
            }
            guard let name, Self.adapterNames.contains(name) else {
                var message = "unknown adapter '\(name ?? "?")'"
                if let name, let s = DidYouMean.closest(to: name, among: Self.adapterNames) {
                    message += "; did you mean '\(s)'?"
                } else {
                    message += " (adapters: \(Self.adapterNames.joined(separator: ", ")))"
                }
                fail(item, message)
                continue
            }
            if let adapter = readAdapter(name, options: options, at: item) { out.append(adapter) }
        }
        return out
    }

    private mutating func readAdapter(_ name: String, options: Node?, at node: Node) -> (any RequestAdapter)? {
        switch name {
        case "headers":
            guard let options else { fail(node, "headers needs set, add or remove"); return nil }
            var set: [(HTTPField.Name, String)] = [], add: [(HTTPField.Name, String)] = []
            var remove: [HTTPField.Name] = []
            entries(options, in: "headers", known: ["set", "add", "remove"]) { r, key, value in
                if key == "remove" {
                    for (text, n) in r.strings(value, what: "remove") ?? [] {
                        if let field = r.fieldName(text, at: n) { remove.append(field) }
                    }
                    return
                }
                guard case .mapping(let m) = value else { return r.fail(value, "\(key) must be a map of field: value") }
                for (k, v) in m {
                    guard let text = k.scalar?.string, let field = r.fieldName(text, at: k) else { continue }
                    guard let fieldValue = r.secretOrString(v, what: "value of \(text)") else { continue }
                    if key == "set" { set.append((field, fieldValue)) } else { add.append((field, fieldValue)) }
                }
            }
            return HeaderAdapter(set: set, add: add, remove: remove)
        case "bearer":
            guard let options, let token = secret(options, what: "bearer token") else {
                if options == nil { fail(node, "bearer needs a token, e.g. '- bearer: ${API_TOKEN}'") }
                return nil
            }
            return BearerAdapter(token: token)
        case "basic":
            guard let options else { fail(node, "basic needs username and password"); return nil }
            var username: String?, password: Secret?
            entries(options, in: "basic", known: ["username", "password"]) { r, key, value in
                if key == "username" {
                    username = r.secretOrString(value, what: "username")
                } else {
                    password = r.secret(value, what: "password")
                }
            }
            guard let username, let password else { fail(options, "basic needs both username and password"); return nil }
            return BasicAuthAdapter(username: username, password: password)
        case "api_key":
            guard let options else { fail(node, "api_key needs header or query, and value"); return nil }
            var placement: APIKeyAdapter.Placement?, value: Secret?
            entries(options, in: "api_key", known: ["header", "query", "value"]) { r, key, v in
                switch key {
                case "header":
                    if let text = v.scalar?.string, r.fieldName(text, at: v) != nil { placement = .header(text) }
                case "query":
                    if let text = v.scalar?.string, !text.isEmpty { placement = .query(text) } else { r.fail(v, "query must be a parameter name") }
                default:
                    value = r.secret(v, what: "api_key value")
                }
            }
            guard let placement, let value else {
                fail(options, "api_key needs exactly one of header or query, and a value")
                return nil
            }
            return APIKeyAdapter(placement: placement, value: value)
        default:  // deflate
            var minBytes = DeflateRequestCompressor.defaultMinBytes
            var behavior = DeflateRequestCompressor.defaultDuplicateHeaderBehavior
            if let options, !(options.scalar.map { $0.string.isEmpty } ?? false) {
                entries(options, in: "deflate", known: ["min_bytes", "duplicate_header"]) { r, key, value in
                    if key == "min_bytes" {
                        if let n = r.size(value, key: key, min: 0) { minBytes = n }
                    } else if let text = value.scalar?.string,
                              let b = DeflateRequestCompressor.DuplicateHeaderBehavior(rawValue: text) {
                        behavior = b
                    } else {
                        r.fail(value, "duplicate_header must be error, replace or skip")
                    }
                }
            }
            return DeflateRequestCompressor(minBytes: minBytes, duplicateHeaderBehavior: behavior)
        }
    }

    mutating func readRedirect(_ node: Node) -> Redirector? {
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
                    if let n = v.scalar.flatMap({ Int($0.string) }), n >= 1, n <= 50 { max = n } else { r.fail(v, "max must be 1 to 50") }
                    return
                }
                guard case .sequence(let rules) = v else { return r.fail(v, "rewrite must be a list of { from, to }") }
                for rule in rules {
                    var from: String?, to: String?
                    r.entries(rule, in: "rewrite rule", known: ["from", "to"]) { _, rk, rv in
                        if rk == "from" { from = rv.scalar?.string } else { to = rv.scalar?.string }
                    }
                    if let from, let to, !from.isEmpty { rewrites.append(.init(from: from, to: to)) } else { r.fail(rule, "a rewrite rule needs from and to") }
                }
            }
        default:
            let suggestion = DidYouMean.closest(to: key, among: ["do_not_follow", "follow", "modify"])
            fail(m.first!.key, "unknown redirect behaviour '\(key)'" + (suggestion.map { "; did you mean '\($0)'?" } ?? ""))
            return nil
        }
        return key == "follow" ? Redirector(behavior: .follow(max: max)) : Redirector(behavior: .modify(max: max, rewrites: rewrites))
    }

    mutating func readMonitors(_ node: Node) -> [(MonitorSpec, Node)] {
        guard case .sequence(let items) = node else {
            fail(node, "monitors must be a list, e.g. [ { access_log: { path: stdout } } ]")
            return []
        }
        var out: [(MonitorSpec, Node)] = []
        for item in items {
            guard case .mapping(let m) = item, m.count == 1, let name = m.first!.key.scalar?.string else {
                fail(item, "each monitor is a one-key map such as '- access_log: { path: stdout }'")
                continue
            }
            let kinds: [String: MonitorSpec.Kind] = ["access_log": .accessLog, "debug": .debug]
            guard let kind = kinds[name] else {
                let s = DidYouMean.closest(to: name, among: Array(kinds.keys).sorted())
                fail(m.first!.key, "unknown monitor '\(name)'" + (s.map { "; did you mean '\($0)'?" } ?? " (monitors: access_log, debug)"))
                continue
            }
            var spec = MonitorSpec(kind: kind, path: kind == .accessLog ? "stdout" : "stderr")
            let options = m.first!.value
            if !(options.scalar.map { $0.string.isEmpty } ?? false) {
                let known = kind == .accessLog ? ["path"] : ["path", "curl"]
                entries(options, in: name, known: known) { r, key, value in
                    if key == "path" {
                        if let p = value.scalar?.string, !p.isEmpty { spec.path = p } else { r.fail(value, "path must be a file, stdout or stderr") }
                    } else if value.scalar?.string != "true" {
                        r.fail(value, "curl can only be true (the debug monitor prints curl commands)")
                    }
                }
            }
            out.append((spec, item))
        }
        return out
    }

    mutating func readRoutes(_ node: Node, into routes: inout [ServerConfiguration.Route]) {
        guard case .sequence(let items) = node else { return fail(node, "routes must be a list of { listen, upstream }") }
        var out: [ServerConfiguration.Route] = []
        for item in items {
            var listen: String?, upstream: String?
            entries(item, in: "route", known: ["listen", "upstream"]) { r, key, value in
                guard let text = value.scalar?.string else { return r.fail(value, "\(key) must be a string") }
                if key == "listen" {
                    if ListenAddress.isValid(text) { listen = text } else { r.fail(value, "invalid listen address '\(text)': expected IP:port") }
                } else {
                    let lower = text.lowercased()
                    let parts = URLParts(text)
                    if (lower.hasPrefix("http://") || lower.hasPrefix("https://")) && !parts.host.isEmpty
                        && !text.contains("?") && !text.contains("#") && !parts.authority.contains("@") {
                        upstream = text.hasSuffix("/") ? String(text.dropLast()) : text
                    } else {
                        r.fail(value, "upstream must be an http:// or https:// base URL without query, e.g. https://api.example.com/v1")
                    }
                }
            }
            if let listen, let upstream {
                out.append(.init(listen: listen, upstream: upstream))
            } else if case .mapping = item {
                fail(item, "a route needs listen and upstream")
            }
        }
        routes = out
    }

    // MARK: values

    mutating func fieldName(_ text: String, at node: Node) -> HTTPField.Name? {
        guard let name = HTTPField.Name(text) else {
            fail(node, "invalid header field name '\(text)'")
            return nil
        }
        return name
    }

    /// A plain string, or the value of a secret reference (which is then redacted in logs).
    mutating func secretOrString(_ node: Node, what: String) -> String? {
        guard let text = node.scalar?.string else {
            fail(node, "\(what) must be a string")
            return nil
        }
        if SecretReference.isReference(text) { return secret(node, what: what)?.value }
        return text
    }

    /// A secret: `${ENV}`, `file:/path`, or an inline value (also redacted everywhere).
    mutating func secret(_ node: Node, what: String) -> Secret? {
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
            guard let value = ProcessInfo.processInfo.environment[name], !value.isEmpty else {
                return .failure(Problem(message: "environment variable \(name) is not set"))
            }
            return .success(Secret(value, source: text))
        }
        if text.hasPrefix("file:") {
            let path = String(text.dropFirst(5))
            guard let data = FileManager.default.contents(atPath: path), let raw = String(data: data, encoding: .utf8) else {
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
