import SluiceCore

/// `basic` (docs/configuration.md, "Adapters"): `Authorization: Basic base64(user:password)`
/// (RFC 7617, `BasicAuthAdapter`).
enum BasicKind: InterceptorKind {
    static var name: String { "basic" }

    static func read(_ settings: YAMLNode?, at entry: YAMLNode, _ reader: inout NodeReader) -> BasicAuthAdapter? {
        guard let settings else {
            reader.fail(entry, "basic needs username and password")
            return nil
        }
        var username: String?
        var password: Secret?
        reader.entries(settings, in: "basic", known: ["username", "password"]) { r, key, value in
            if key == "username" {
                username = r.secretOrString(value, what: "username")
            } else {
                password = r.secret(value, what: "password")
            }
        }
        guard let username, let password else {
            reader.fail(settings, "basic needs both username and password")
            return nil
        }
        return BasicAuthAdapter(username: username, password: password)
    }

    static func describe(_ a: BasicAuthAdapter) -> String {
        "username \(a.username), password \(a.password) (\(a.password.source))"
    }
}
