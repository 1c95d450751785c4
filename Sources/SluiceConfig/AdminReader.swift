import SluiceCore

/// `admin: { listen: 127.0.0.1:9901, token: ${ADMIN_TOKEN} }` (docs/configuration.md,
/// "admin"). Off unless configured; its address must be loopback unless a token guards it,
/// and it may not share an address with a proxy listener or a route.
extension NodeReader {
    mutating func readAdmin(_ node: YAMLNode, into admin: inout ServerConfiguration.Admin?) {
        var listen: (String, YAMLNode)?
        var token: Secret?
        entries(node, in: "admin", known: ["listen", "token"]) { r, key, value in
            switch key {
            case "listen":
                guard let text = value.scalar?.string, ListenAddress.isValid(text) else {
                    return r.fail(value, "invalid admin.listen address: expected IP:port, e.g. 127.0.0.1:9901 or [::1]:9901")
                }
                listen = (text, value)
            default:
                token = r.secret(value, what: "admin.token")
            }
        }
        guard let (address, addressNode) = listen else {
            return fail(node, "admin needs listen (e.g. admin: { listen: 127.0.0.1:9901 })")
        }
        if token == nil && !ListenAddress.isLoopback(address) {
            return fail(
                addressNode,
                "admin.listen \(address) is not a loopback address: anyone who reaches it could "
                    + "cancel requests and reload; set admin.token (e.g. token: ${ADMIN_TOKEN}) or listen on 127.0.0.1")
        }
        listenNodes.append((address, addressNode))
        admin = ServerConfiguration.Admin(listen: address, token: token)
    }
}
