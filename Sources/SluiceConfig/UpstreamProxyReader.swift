import SluiceCore

extension NodeReader {
    /// `upstream_proxy:` in a policy: `{ url: http://host:port, no_proxy: [...], auth: { username,
    /// password } }`, or `none` (reach the origin directly, for a host under a default that
    /// names a parent). Behaviour: Sources/SluiceCore/Features/UpstreamProxy.swift.
    mutating func readUpstreamProxy(_ node: YAMLNode) -> PolicyEntry.Section<UpstreamProxy> {
        if node.scalar?.string == "none" { return .off }
        guard case .mapping = node else {
            fail(node, "upstream_proxy must be none or a map, e.g. { url: http://proxy.example:3128 }")
            return .inherit
        }
        var url: String?
        var noProxy: [String] = []
        var auth: UpstreamProxy.Auth?
        var sawURL = false
        entries(node, in: "upstream_proxy", known: ["url", "no_proxy", "auth"]) { r, key, value in
            switch key {
            case "url":
                sawURL = true
                url = r.parentProxyURL(value)
            case "no_proxy":
                guard let items = r.strings(value, what: key) else { return }
                for (text, itemNode) in items {
                    let badCharacter = text.contains { $0 == "," || $0.isWhitespace }
                    if text.isEmpty || badCharacter || (text.contains("/") && IPNetwork(text) == nil) {
                        r.fail(
                            itemNode,
                            "invalid no_proxy entry '\(text)': expected a host name, a .domain, an IP address or a CIDR network")
                    } else {
                        noProxy.append(text)
                    }
                }
            default:
                var username: String?
                var password: Secret?
                r.entries(value, in: "upstream_proxy.auth", known: ["username", "password"]) { r, key, value in
                    if key == "username" {
                        username = r.secretOrString(value, what: "username")
                    } else {
                        password = r.secret(value, what: "password")
                    }
                }
                if let username, let password {
                    if username.contains(":") {
                        r.fail(value, "upstream_proxy.auth username may not contain ':' (Basic credentials)")
                    }
                    auth = UpstreamProxy.Auth(username: username, password: password)
                } else if case .mapping = value {
                    r.fail(value, "upstream_proxy.auth needs username and password")
                }
            }
        }
        guard let url else {
            if !sawURL { fail(node, "upstream_proxy needs url, e.g. { url: http://proxy.example:3128 }") }
            return .inherit
        }
        return .on(UpstreamProxy(url: url, noProxy: noProxy, auth: auth))
    }

    /// `http://host:port`, nothing else: no path, query, credentials (they go in `auth`, so
    /// they are redacted) or other scheme.
    private mutating func parentProxyURL(_ node: YAMLNode) -> String? {
        guard let text = node.scalar?.string else {
            fail(node, "url must be a string such as http://proxy.example:3128")
            return nil
        }
        let parts = URLParts(text)
        let lower = text.lowercased()
        let rest = lower.hasPrefix("http://") ? String(text.dropFirst(7)) : nil
        let authority = rest.map { $0.hasSuffix("/") ? String($0.dropLast()) : $0 }
        guard let authority, !authority.isEmpty, !authority.contains("/"), !authority.contains("?"),
            !authority.contains("#"), !authority.contains("@"), !parts.host.isEmpty,
            let colon = authority.lastIndex(of: ":"), let port = Int(authority[authority.index(after: colon)...]),
            (1...65535).contains(port), !authority.hasSuffix("]")
        else {
            fail(
                node,
                "upstream_proxy url must be http://host:port (an explicit port; credentials go in auth), e.g. http://proxy.example:3128"
            )
            return nil
        }
        return "http://" + authority
    }
}
