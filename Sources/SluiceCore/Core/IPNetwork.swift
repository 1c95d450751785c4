/// An IPv4 or IPv6 network in CIDR notation (`127.0.0.0/8`, `::1/128`), used for client ACLs
/// and destination deny lists. Addresses are compared as raw network-order bytes, so a check
/// costs a few byte comparisons and no allocation.
public struct IPNetwork: Sendable, Equatable, CustomStringConvertible {
    /// 4 bytes for IPv4, 16 for IPv6, network order, host bits zeroed.
    public let address: [UInt8]
    public let prefixLength: Int

    /// Parses `a.b.c.d[/n]` or an IPv6 address `[/n]`; a bare address is a host network.
    public init?(_ text: String) {
        let parts = text.split(separator: "/", maxSplits: 1, omittingEmptySubsequences: false)
        guard let bytes = IPNetwork.parseAddress(String(parts[0])) else { return nil }
        let maxPrefix = bytes.count * 8
        var prefix = maxPrefix
        if parts.count == 2 {
            guard let p = Int(parts[1]), p >= 0, p <= maxPrefix else { return nil }
            prefix = p
        }
        var masked = bytes
        for i in 0..<masked.count {
            let bitsHere = max(0, min(8, prefix - i * 8))
            masked[i] &= bitsHere == 0 ? 0 : UInt8(truncatingIfNeeded: 0xFF << (8 - bitsHere))
        }
        address = masked
        prefixLength = prefix
    }

    /// Whether `bytes` (4 or 16 network-order bytes) lies in this network. An IPv4-mapped
    /// IPv6 address (`::ffff:a.b.c.d`) is checked as the IPv4 address it carries.
    public func contains(_ bytes: UnsafeRawBufferPointer) -> Bool {
        var candidate = bytes
        if bytes.count == 16, address.count == 4, IPNetwork.isV4Mapped(bytes) {
            candidate = UnsafeRawBufferPointer(rebasing: bytes[12..<16])
        }
        guard candidate.count == address.count else { return false }
        var remaining = prefixLength
        var i = 0
        while remaining > 0 {
            let bits = min(8, remaining)
            let mask = UInt8(truncatingIfNeeded: 0xFF << (8 - bits))
            if candidate[i] & mask != address[i] { return false }
            remaining -= bits
            i += 1
        }
        return true
    }

    public func contains(_ bytes: [UInt8]) -> Bool {
        bytes.withUnsafeBytes { contains($0) }
    }

    public var description: String {
        if address.count == 4 {
            return address.map(String.init).joined(separator: ".") + "/\(prefixLength)"
        }
        var groups: [String] = []
        for i in stride(from: 0, to: 16, by: 2) {
            groups.append(String(UInt16(address[i]) << 8 | UInt16(address[i + 1]), radix: 16))
        }
        return groups.joined(separator: ":") + "/\(prefixLength)"
    }

    static func isV4Mapped(_ b: UnsafeRawBufferPointer) -> Bool {
        for i in 0..<10 where b[i] != 0 { return false }
        return b[10] == 0xFF && b[11] == 0xFF
    }

    /// Parses a dotted-quad IPv4 or an RFC 4291 IPv6 address (with `::` and an embedded IPv4 tail).
    public static func parseAddress(_ text: String) -> [UInt8]? {
        if text.contains(":") { return parseV6(text) }
        return parseV4(Substring(text))
    }

    static func parseV4(_ text: Substring) -> [UInt8]? {
        let octets = text.split(separator: ".", omittingEmptySubsequences: false)
        guard octets.count == 4 else { return nil }
        var out: [UInt8] = []
        for o in octets {
            guard !o.isEmpty, o.count <= 3, o.allSatisfy(\.isASCIIDigit), let v = UInt8(o) else { return nil }
            out.append(v)
        }
        return out
    }

    static func parseV6(_ text: String) -> [UInt8]? {
        var halves: [String] = []
        if let r = text.firstRange(of: "::") {
            halves = [String(text[..<r.lowerBound]), String(text[r.upperBound...])]
            if halves[1].contains("::") { return nil }
        } else {
            halves = [text]
        }
        func groups(_ s: String) -> [UInt8]? {
            if s.isEmpty { return [] }
            var out: [UInt8] = []
            let parts = s.split(separator: ":", omittingEmptySubsequences: false)
            for (index, part) in parts.enumerated() {
                if index == parts.count - 1, part.contains(".") {
                    guard let v4 = parseV4(part) else { return nil }
                    out += v4
                    continue
                }
                guard !part.isEmpty, part.count <= 4, let v = UInt16(part, radix: 16) else { return nil }
                out += [UInt8(v >> 8), UInt8(v & 0xFF)]
            }
            return out
        }
        guard let head = groups(halves[0]) else { return nil }
        if halves.count == 1 { return head.count == 16 ? head : nil }
        guard let tail = groups(halves[1]), head.count + tail.count <= 14 else { return nil }
        return head + [UInt8](repeating: 0, count: 16 - head.count - tail.count) + tail
    }
}

extension Character {
    var isASCIIDigit: Bool { asciiValue.map { $0 >= 48 && $0 <= 57 } ?? false }
}
