import SluiceCore

extension NodeReader {
    /// `upgrades:` in a policy: a list of protocol names (`[websocket]`, `[]` for none), or
    /// `{ allow: [websocket], idle_timeout: 5m }`. Behaviour:
    /// Sources/SluiceCore/Features/Upgrades.swift.
    mutating func readUpgrades(_ node: YAMLNode) -> Upgrades? {
        switch node {
        case .sequence:
            guard let allowed = upgradeNames(node) else { return nil }
            return Upgrades(allowed: allowed)
        case .mapping:
            var allowed = Upgrades.defaultAllowed
            var idle = Upgrades.defaultIdleTimeout
            var ok = true
            entries(node, in: "upgrades", known: ["allow", "idle_timeout"]) { r, key, value in
                if key == "allow" {
                    if let names = r.upgradeNames(value) { allowed = names } else { ok = false }
                } else {
                    if let ms = r.duration(value, key: "upgrades.idle_timeout") { idle = ms } else { ok = false }
                }
            }
            return ok ? Upgrades(allowed: allowed, idleTimeout: idle) : nil
        default:
            fail(
                node, "upgrades must be a list of protocol names such as [websocket], or { allow: [websocket], idle_timeout: 5m }"
            )
            return nil
        }
    }

    /// Protocol names as `Upgrade` carries them: tokens (RFC 9110 §5.6.2), without a version.
    private mutating func upgradeNames(_ node: YAMLNode) -> [String]? {
        guard case .sequence = node, let items = strings(node, what: "upgrades") else {
            fail(node, "upgrades.allow must be a list of protocol names such as [websocket]")
            return nil
        }
        var names: [String] = []
        for (text, itemNode) in items {
            let isToken =
                !text.isEmpty
                && text.utf8.allSatisfy { b in
                    switch b {
                    case 0x30...0x39, 0x41...0x5A, 0x61...0x7A: return true
                    case 0x21, 0x23, 0x24, 0x25, 0x26, 0x27, 0x2A, 0x2B, 0x2D, 0x2E, 0x5E, 0x5F, 0x60, 0x7C, 0x7E: return true
                    default: return false
                    }
                }
            guard isToken else {
                fail(
                    itemNode,
                    "invalid upgrade protocol '\(text)': expected a protocol name such as websocket (no version, no spaces)")
                return nil
            }
            names.append(text.lowercased())
        }
        return names
    }
}
