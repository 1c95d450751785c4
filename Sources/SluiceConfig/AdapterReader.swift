import SluiceCore

/// Reading of a policy's `adapters:` list: each one-key map (or bare name) is read by the
/// kind the registry names for its key (`InterceptorRegistry`, one file per kind in
/// `Kinds/`); an unknown key is a located error with the closest known one.
extension NodeReader {
    mutating func readAdapters(_ node: YAMLNode, policy: String) -> [any RequestAdapter] {
        guard case .sequence(let items) = node else {
            fail(node, "adapters must be a list, e.g. [ { bearer: ${TOKEN} } ]")
            return []
        }
        var out: [any RequestAdapter] = []
        for item in items {
            var name: String?
            var settings: YAMLNode?
            switch item {
            case .scalar(let s):
                name = s.string
            case .mapping(let m) where m.count == 1:
                name = m.first!.key.scalar?.string
                settings = m.first!.value
            default:
                fail(item, "each adapter is a one-key map (e.g. '- bearer: ${TOKEN}') or a bare name ('- deflate')")
                continue
            }
            guard let name, let kind = kinds.kind(named: name) else {
                let names = kinds.names
                var message = "unknown adapter '\(name ?? "?")'"
                if let name, let s = DidYouMean.closest(to: name, among: names) {
                    message += "; did you mean '\(s)'?"
                } else {
                    message += " (adapters: \(names.joined(separator: ", ")))"
                }
                fail(item, message)
                continue
            }
            if let adapter = kind.readAny(settings, at: item, &self) { out.append(adapter) }
        }
        return out
    }
}
