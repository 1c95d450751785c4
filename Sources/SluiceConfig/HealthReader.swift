import SluiceCore

extension NodeReader {
    /// `health:` in a policy: `{ consecutive_failures: 5, cooldown: 10s, probe: { path: /healthz,
    /// interval: 5s } }`, `{}` for the defaults, or `none` (no circuit breaking for a host under
    /// a default that has it). Behaviour: Sources/SluiceCore/Features/CircuitBreaker.swift.
    mutating func readHealth(_ node: YAMLNode) -> PolicyEntry.Section<Health> {
        if let word = node.scalar?.string {
            if word == "none" || word == "off" { return .off }
            if word.isEmpty { return .on(Health()) }
            fail(node, "health must be a mapping, {} for the defaults, or none")
            return .inherit
        }
        var health = Health()
        entries(node, in: "health", known: ["consecutive_failures", "cooldown", "probe"]) { r, key, value in
            switch key {
            case "consecutive_failures":
                if let n = value.scalar.flatMap({ Int($0.string) }), n >= 1, n <= 1000 {
                    health.consecutiveFailures = n
                } else {
                    r.fail(value, "consecutive_failures must be 1 to 1000")
                }
            case "cooldown":
                if let ms = r.duration(value, key: key) { health.cooldown = ms }
            default:
                var path: String?
                var interval = Health.defaultProbeInterval
                var sawPath = false
                r.entries(value, in: "health.probe", known: ["path", "interval"]) { r, k, v in
                    sawPath = sawPath || k == "path"
                    if k == "interval" {
                        if let ms = r.duration(v, key: k) { interval = ms }
                    } else if let text = v.scalar?.string, text.hasPrefix("/"),
                        !text.contains(where: { $0.isWhitespace || $0.isNewline || $0 == "#" })
                    {
                        path = text
                    } else {
                        r.fail(v, "probe path must be an origin-form path such as /healthz (starts with /, no spaces)")
                    }
                }
                if let path {
                    health.probe = .init(path: path, interval: interval)
                } else if !sawPath, case .mapping = value {
                    r.fail(value, "health.probe needs a path")
                }
            }
        }
        return .on(health)
    }
}
