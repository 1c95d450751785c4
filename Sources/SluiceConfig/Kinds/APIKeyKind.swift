import SluiceCore

/// `api_key` (docs/configuration.md, "Adapters"): the key as a header, or as a query parameter
/// whose values are then redacted from logs (`APIKeyAdapter`).
enum APIKeyKind: InterceptorKind {
    static var name: String { "api_key" }

    static func read(_ settings: YAMLNode?, at entry: YAMLNode, _ reader: inout NodeReader) -> APIKeyAdapter? {
        guard let settings else {
            reader.fail(entry, "api_key needs header or query, and value")
            return nil
        }
        var placement: APIKeyAdapter.Placement?
        var value: Secret?
        var placements = 0
        reader.entries(settings, in: "api_key", known: ["header", "query", "value"]) { r, key, v in
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
            reader.fail(settings, "api_key needs exactly one of header or query, and a value")
            return nil
        }
        if case .query(let parameter) = placement { reader.redactQueryParameter(parameter) }
        return APIKeyAdapter(placement: placement, value: value)
    }

    static func describe(_ a: APIKeyAdapter) -> String {
        switch a.placement {
        case .header(let h): return "header \(h) = \(a.value) (\(a.value.source))"
        case .query(let q): return "query \(q) = \(a.value) (\(a.value.source))"
        }
    }
}
