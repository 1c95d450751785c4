import HTTPTypes
import SluiceCore

/// `headers` (docs/configuration.md, "Adapters"): `set`, `add` and `remove` request fields,
/// applied in the order remove, set, add (`HeaderAdapter`).
enum HeadersKind: InterceptorKind {
    static var name: String { "headers" }

    static func read(_ settings: YAMLNode?, at entry: YAMLNode, _ reader: inout NodeReader) -> HeaderAdapter? {
        guard let settings else {
            reader.fail(entry, "headers needs set, add or remove")
            return nil
        }
        var set: [(HTTPField.Name, String)] = []
        var add: [(HTTPField.Name, String)] = []
        var remove: [HTTPField.Name] = []
        reader.entries(settings, in: "headers", known: ["set", "add", "remove"]) { r, key, value in
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
    }

    static func describe(_ a: HeaderAdapter) -> String {
        var parts: [String] = []
        if !a.remove.isEmpty { parts.append("remove " + a.remove.map(\.rawName).joined(separator: ", ")) }
        if !a.set.isEmpty { parts.append("set " + a.set.map { "\($0.0.rawName): \($0.1)" }.joined(separator: ", ")) }
        if !a.add.isEmpty { parts.append("add " + a.add.map { "\($0.0.rawName): \($0.1)" }.joined(separator: ", ")) }
        return parts.joined(separator: "; ")
    }
}
