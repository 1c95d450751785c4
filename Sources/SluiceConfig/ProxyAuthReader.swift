import SluiceCore

#if canImport(Glibc)
    import Glibc
#endif

/// `access.proxy_auth: { basic: { users_file: PATH } }` (docs/configuration.md, "Proxy
/// authentication"), and the rule that no listener is open to everyone by accident: a
/// listener on an address other than loopback needs `proxy_auth` or an `allow_clients`
/// narrower than everything (routes: the latter, since proxy_auth does not apply to them).
extension NodeReader {
    mutating func readProxyAuth(_ node: YAMLNode) {
        var usersFile: (String, YAMLNode)?
        entries(node, in: "access.proxy_auth", known: ["basic"]) { r, _, basic in
            r.entries(basic, in: "access.proxy_auth.basic", known: ["users_file"]) { r, _, value in
                guard var path = value.scalar?.string, !path.isEmpty else { return r.fail(value, "users_file must be a path") }
                if path.hasPrefix("${") && path.hasSuffix("}") {
                    // A path from the environment (not a secret: it is named in errors).
                    let name = String(path.dropFirst(2).dropLast())
                    guard let fromEnvironment = getenv(name).map({ String(cString: $0) }), !fromEnvironment.isEmpty else {
                        return r.fail(value, "users_file: environment variable \(name) is not set")
                    }
                    path = fromEnvironment
                }
                usersFile = (path, value)
            }
        }
        guard let (path, pathNode) = usersFile else {
            return fail(node, "proxy_auth needs basic: { users_file: PATH }")
        }
        switch ProxyAuthentication.load(path: path) {
        case .success(let authentication):
            proxyAuthentication = authentication
        case .failure(let problems):
            for problem in problems.issues {
                if problem.line == 0 {
                    fail(pathNode, "access.proxy_auth.basic.users_file: \(problem.message)")
                } else {
                    issues.append(
                        ConfigIssue(
                            file: path, line: problem.line, column: problem.column,
                            message: "\(problem.message) (users file of access.proxy_auth)"))
                }
            }
        }
    }

    /// Every listener off loopback is guarded: by `proxy_auth` (forward listeners) or by an
    /// `allow_clients` that does not contain `0.0.0.0/0` or `::/0`. The admin listener has a
    /// rule of its own (`AdminReader`).
    mutating func checkExposedListeners(_ server: ServerConfiguration) {
        let narrowed = server.access.allowClients.allSatisfy { $0.prefixLength > 0 }
        let forward = Set(server.listen)
        let routes = Set(server.routes.map(\.listen))
        for (address, node) in listenNodes where !ListenAddress.isLoopback(address) && !narrowed {
            if forward.contains(address) && proxyAuthentication == nil {
                fail(
                    node,
                    "listen address \(address) is not loopback and access.allow_clients admits everyone: anyone "
                        + "who reaches it could use the proxy; add access.proxy_auth (basic: { users_file: PATH }) or "
                        + "narrow access.allow_clients to your networks (e.g. [10.0.0.0/8])")
            } else if routes.contains(address) && !forward.contains(address) {
                fail(
                    node,
                    "route listen address \(address) is not loopback and access.allow_clients admits everyone; "
                        + "narrow access.allow_clients to your networks (e.g. [10.0.0.0/8]): proxy_auth does not apply to routes")
            }
        }
    }
}
