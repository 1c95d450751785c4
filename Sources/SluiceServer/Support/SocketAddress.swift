import SluiceCore

#if canImport(Glibc)
    import Glibc
#endif

/// Helpers over C socket addresses: the raw address bytes for ACL checks, and text for logs.
enum SocketAddress {
    /// Calls `body` with the 4 or 16 network-order address bytes of `sa`, or returns nil for
    /// families other than IPv4 and IPv6.
    static func withAddressBytes<R>(
        _ sa: UnsafePointer<sockaddr>,
        _ body: (UnsafeRawBufferPointer) -> R
    ) -> R? {
        switch Int32(sa.pointee.sa_family) {
        case AF_INET:
            return sa.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { sin in
                var addr = sin.pointee.sin_addr
                return withUnsafeBytes(of: &addr) { body($0) }
            }
        case AF_INET6:
            return sa.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { sin6 in
                var addr = sin6.pointee.sin6_addr
                return withUnsafeBytes(of: &addr) { body($0) }
            }
        default:
            return nil
        }
    }

    /// Whether `sa` lies in any of `networks`.
    static func matches(_ sa: UnsafePointer<sockaddr>, _ networks: [IPNetwork]) -> Bool {
        withAddressBytes(sa) { bytes in networks.contains { $0.contains(bytes) } } ?? false
    }

    /// `1.2.3.4:80` or `[::1]:80`.
    static func describe(_ sa: UnsafePointer<sockaddr>) -> String {
        guard let host = host(sa) else { return "unknown" }
        switch Int32(sa.pointee.sa_family) {
        case AF_INET:
            return sa.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { "\(host):\(UInt16(bigEndian: $0.pointee.sin_port))" }
        default:
            return sa.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) {
                "[\(host)]:\(UInt16(bigEndian: $0.pointee.sin6_port))"
            }
        }
    }

    /// The address alone, `1.2.3.4` or `::1`; nil for families other than IPv4 and IPv6.
    static func host(_ sa: UnsafePointer<sockaddr>) -> String? {
        let family = Int32(sa.pointee.sa_family)
        guard family == AF_INET || family == AF_INET6 else { return nil }
        var text = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN) + 1)
        _ = withAddressBytes(sa) { bytes in inet_ntop(family, bytes.baseAddress, &text, socklen_t(text.count)) }
        return String(cBuffer: text)
    }
}
