import SluiceCore

/// The server's `upstream:` section, `{ max_connections_per_host: 0, max_streams: 100 }`
/// (docs/configuration.md, "upstream"; the behaviour: Sources/SluiceCore/Features/HTTP2.swift,
/// applied per worker by `UpstreamSession`). A policy's `upstream:` (scheme, port, http2) is
/// read by `readUpstream` in TrustReader.swift.
extension NodeReader {
    mutating func readUpstreamPool(_ node: YAMLNode, into limits: inout UpstreamPoolLimits) {
        entries(node, in: "upstream", known: ["max_connections_per_host", "max_streams"]) { r, key, value in
            switch key {
            case "max_connections_per_host":
                if let n = r.count(value, key: key, min: 0) { limits.maxConnectionsPerHost = n }
            default:
                guard let n = r.count(value, key: key, min: 1) else { return }
                guard n <= 1000 else { return r.fail(value, "max_streams must be 1 to 1000, not \(n)") }
                limits.maxStreams = n
            }
        }
    }
}
