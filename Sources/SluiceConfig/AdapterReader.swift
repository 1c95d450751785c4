import Foundation
import HTTPTypes
import SluiceCore
import Yams

/// Reading of a policy's `adapters:` list: each one-key map (or bare name) becomes a
/// `RequestAdapter`, with its secrets registered for redaction.
extension NodeReader {
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

    mutating func readAdapter(_ name: String, options: Node?, at node: Node) -> (any RequestAdapter)? {
        switch name {
        case "headers":
            guard let options else {
                fail(node, "headers needs set, add or remove")
                return nil
            }
            var set: [(HTTPField.Name, String)] = []
            var add: [(HTTPField.Name, String)] = []
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
            guard let options else {
                fail(node, "basic needs username and password")
                return nil
            }
            var username: String?
            var password: Secret?
            entries(options, in: "basic", known: ["username", "password"]) { r, key, value in
                if key == "username" {
                    username = r.secretOrString(value, what: "username")
                } else {
                    password = r.secret(value, what: "password")
                }
            }
            guard let username, let password else {
                fail(options, "basic needs both username and password")
                return nil
            }
            return BasicAuthAdapter(username: username, password: password)
        case "api_key":
            guard let options else {
                fail(node, "api_key needs header or query, and value")
                return nil
            }
            var placement: APIKeyAdapter.Placement?
            var value: Secret?
            var placements = 0
            entries(options, in: "api_key", known: ["header", "query", "value"]) { r, key, v in
                if key != "value" { placements += 1 }
                switch key {
                case "header":
                    if let text = v.scalar?.string, r.fieldName(text, at: v) != nil { placement = .header(text) }
                case "query":
                    if let text = v.scalar?.string, !text.isEmpty {
                        placement = .query(text)
                    } else {
                        r.fail(v, "query must be a parameter name")
                    }
                default:
                    value = r.secret(v, what: "api_key value")
                }
            }
            guard let placement, let value, placements == 1 else {
                fail(options, "api_key needs exactly one of header or query, and a value")
                return nil
            }
            return APIKeyAdapter(placement: placement, value: value)
        case "oauth2":
            return readOAuth2(options, at: node)
        default:  // deflate
            var minBytes = DeflateRequestCompressor.defaultMinBytes
            var behavior = DeflateRequestCompressor.defaultDuplicateHeaderBehavior
            if let options, !(options.scalar.map { $0.string.isEmpty } ?? false) {
                entries(options, in: "deflate", known: ["min_bytes", "duplicate_header"]) { r, key, value in
                    if key == "min_bytes" {
                        if let n = r.size(value, key: key, min: 0) { minBytes = n }
                    } else if let text = value.scalar?.string,
                        let b = DeflateRequestCompressor.DuplicateHeaderBehavior(rawValue: text)
                    {
                        behavior = b
                    } else {
                        r.fail(value, "duplicate_header must be error, replace or skip")
                    }
                }
            }
            return DeflateRequestCompressor(minBytes: minBytes, duplicateHeaderBehavior: behavior)
        }
    }

    mutating func readOAuth2(_ options: Node?, at node: Node) -> (any RequestAdapter)? {
        guard let options else {
            fail(node, "oauth2 needs grant, token_url and client_id")
            return nil
        }
        var grant: OAuth2Authenticator.Grant?
        var tokenURL: String?
        var clientID: String?
        var secret: Secret?
        var refresh: Secret?
        var scope: String?
        var audience: String?
        var clientAuth = OAuth2Authenticator.ClientAuthentication.basic
        var before = 30_000
        var windowMax = 5
        var windowMs = 30_000
        var refreshOn: Set<Int> = [401]
        let known = [
            "grant", "token_url", "client_id", "client_secret", "refresh_token", "scope", "audience",
            "client_auth", "refresh_before_expiry", "refresh_window", "refresh_on", "share",
        ]
        var share = true
        entries(options, in: "oauth2", known: known) { r, key, v in
            switch key {
            case "grant":
                grant = v.scalar.flatMap { OAuth2Authenticator.Grant(rawValue: $0.string) }
                if grant == nil { r.fail(v, "grant must be client_credentials or refresh_token") }
            case "token_url":
                let text = r.secretOrString(v, what: key) ?? ""
                if text.lowercased().hasPrefix("http://") || text.lowercased().hasPrefix("https://") {
                    tokenURL = text
                } else {
                    r.fail(v, "token_url must be an http(s) URL")
                }
            case "client_id": clientID = r.secretOrString(v, what: key)
            case "client_secret": secret = r.secret(v, what: key)
            case "refresh_token": refresh = r.secret(v, what: key)
            case "scope": scope = r.secretOrString(v, what: key)
            case "audience": audience = r.secretOrString(v, what: key)
            case "client_auth":
                if let a = v.scalar.flatMap({ OAuth2Authenticator.ClientAuthentication(rawValue: $0.string) }) {
                    clientAuth = a
                } else {
                    r.fail(v, "client_auth must be basic or body")
                }
            case "share":
                if let on = r.bool(v, key: key) { share = on }
            case "refresh_before_expiry":
                if v.scalar?.string == "0" { before = 0 } else if let ms = r.duration(v, key: key) { before = ms }
            case "refresh_window":
                r.entries(v, in: "refresh_window", known: ["max", "per"]) { r, k, w in
                    if k == "max" {
                        if let n = w.scalar.flatMap({ Int($0.string) }), n >= 1 {
                            windowMax = n
                        } else {
                            r.fail(w, "max must be at least 1")
                        }
                    } else if let ms = r.duration(w, key: k) {
                        windowMs = ms
                    }
                }
            default:
                var codes: Set<Int> = []
                for (text, n) in r.strings(v, what: key) ?? [] {
                    if let c = Int(text), (400...599).contains(c) {
                        codes.insert(c)
                    } else {
                        r.fail(n, "refresh_on takes 4xx/5xx statuses")
                    }
                }
                refreshOn = codes
            }
        }
        guard let grant, let tokenURL, let clientID else {
            fail(options, "oauth2 needs grant, token_url and client_id")
            return nil
        }
        if grant == .refreshToken && refresh == nil {
            fail(options, "the refresh_token grant needs refresh_token")
            return nil
        }
        var settings = OAuth2Authenticator.Settings(
            grant: grant, tokenURL: tokenURL, clientID: clientID, clientSecret: secret, refreshToken: refresh, scope: scope,
            audience: audience, clientAuthentication: clientAuth, refreshBeforeExpiry: before, windowMax: windowMax,
            windowMilliseconds: windowMs, refreshOn: refreshOn)
        settings.share = share
        return OAuth2Authenticator(settings: settings)
    }
}
