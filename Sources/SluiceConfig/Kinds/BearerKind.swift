import SluiceCore

/// `bearer` (docs/configuration.md, "Adapters"): `Authorization: Bearer <token>`, the token a
/// string or a secret reference (`BearerAdapter`).
enum BearerKind: InterceptorKind {
    static var name: String { "bearer" }

    static func read(_ settings: YAMLNode?, at entry: YAMLNode, _ reader: inout NodeReader) -> BearerAdapter? {
        guard let settings else {
            reader.fail(entry, "bearer needs a token, e.g. '- bearer: ${API_TOKEN}'")
            return nil
        }
        return reader.secret(settings, what: "bearer token").map { BearerAdapter(token: $0) }
    }

    static func describe(_ a: BearerAdapter) -> String { "\(a.token) (\(a.token.source))" }
}
