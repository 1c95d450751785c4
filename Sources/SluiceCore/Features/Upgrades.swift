/// `upgrades:` in a policy: which HTTP/1.1 protocol upgrades (RFC 9110 §7.8) Sluice carries
/// for the host, and how long a switched connection may sit idle.
///
/// An allowed upgrade (`Upgrade: websocket` with `Connection: upgrade` on a bodiless HTTP/1.1
/// request) is forwarded with the policy's adapters applied to its handshake; after the
/// origin's `101` the client connection becomes a byte tunnel to the origin connection, both
/// ways, until either side closes or nothing moves for `idleTimeout`. An upgrade the policy
/// does not allow is not refused: `Upgrade` is hop-by-hop and a proxy may ignore it, so the
/// request goes on as a plain request without it (the origin answers it as such; a
/// WebSocket server typically answers `426` or `400`). `upgrades: []` carries none.
///
/// Threading: an immutable value, shared by every worker through the policy table.
public struct Upgrades: Sendable, Equatable {
    /// Protocol names carried by default: `[websocket]`.
    public static let defaultAllowed = ["websocket"]
    /// How long a switched connection may move no byte either way: `300s` by default.
    public static let defaultIdleTimeout = 300_000

    /// Allowed protocol names, lower-cased (an `Upgrade` element's name before any `/version`).
    public let allowed: [String]
    /// Milliseconds without a byte either way after which the tunnel closes.
    public let idleTimeout: Int

    public init(allowed: [String] = Upgrades.defaultAllowed, idleTimeout: Int = Upgrades.defaultIdleTimeout) {
        self.allowed = allowed.map { $0.lowercased() }
        self.idleTimeout = idleTimeout
    }

    /// The built-in policy: WebSocket only, 300 s idle.
    public static let standard = Upgrades()

    /// The `Upgrade` value to forward for a client's `Upgrade` field values: the offered
    /// protocols (comma-separated, in order) whose name is allowed, or nil when none is.
    public func forwardedValue(offering values: [String]) -> String? {
        var kept: [String] = []
        for value in values {
            for element in value.split(separator: ",") {
                let item = element.trimmingWhitespace()
                guard !item.isEmpty else { continue }
                let name = item.split(separator: "/", maxSplits: 1).first.map { String($0).lowercased() } ?? ""
                if allowed.contains(name) { kept.append(item) }
            }
        }
        return kept.isEmpty ? nil : kept.joined(separator: ", ")
    }
}

extension Substring {
    fileprivate func trimmingWhitespace() -> String {
        var s = self[...]
        while let c = s.first, c == " " || c == "\t" { s = s.dropFirst() }
        while let c = s.last, c == " " || c == "\t" { s = s.dropLast() }
        return String(s)
    }
}
