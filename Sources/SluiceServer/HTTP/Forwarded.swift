import SluiceCore

/// `routes[].forwarded` and `routes[].trusted_clients` (docs/configuration.md, "Gateway
/// routes"): what a gateway route tells its upstream about the client it forwards for.
///
/// A route is where an origin server meets clients it cannot see: Sluice connects to it, so
/// the origin's own view of the peer is Sluice. The route says who the client was, in one of
/// two vocabularies: RFC 7239 `Forwarded: for=…;proto=…;host=…`, or the de-facto
/// `X-Forwarded-For`, `X-Forwarded-Proto` and `X-Forwarded-Host` that most frameworks read.
///
/// Fields of either vocabulary that a client sent itself are lies until proven otherwise: a
/// client outside `trusted_clients` has every one of them removed, whatever the style
/// (`none` included), so an origin that reads them never sees a forged address. A trusted
/// client (another proxy in front of Sluice) keeps its chain, and Sluice appends its own hop:
/// one more `Forwarded` element or `X-Forwarded-For` address, as another field line of the
/// same name (RFC 9110 §5.3: the lines of a list field are one list). A trusted client's
/// `X-Forwarded-Proto` and `X-Forwarded-Host` describe the first hop, so they are kept and
/// Sluice adds none of its own then.
///
/// The style itself is `ServerConfiguration.Route.Forwarded` (read by `readRoutes` in
/// Sources/SluiceConfig/PolicyReader.swift).
///
/// `ForwardingFields`: the forwarding fields of one route connection, fixed at accept: the route's style,
/// whether the client is trusted, and its address.
///
/// A class, never changed once made: every request on every connection reads it (an
/// optional struct of strings was copied and destroyed through its value witness, nil or
/// not: ≈ 110 instructions a request).
///
/// Threading: made at accept and read on the connection's worker thread; immutable.
final class ForwardingFields: Sendable, Equatable {
    /// The request fields this type owns, by lowercased name.
    enum Field: Int, Sendable, CaseIterable {
        case forwarded, xForwardedFor, xForwardedProto, xForwardedHost

        /// The field `name` (any case) names, compared as bytes: most fields are not one of
        /// these, and are told so by their length alone.
        static func named(_ name: UnsafeBufferPointer<UInt8>) -> Field? {
            switch name.count {
            case 9: return ASCII.equalsIgnoringCase(name, "forwarded") ? .forwarded : nil
            case 15: return ASCII.equalsIgnoringCase(name, "x-forwarded-for") ? .xForwardedFor : nil
            case 16: return ASCII.equalsIgnoringCase(name, "x-forwarded-host") ? .xForwardedHost : nil
            case 17: return ASCII.equalsIgnoringCase(name, "x-forwarded-proto") ? .xForwardedProto : nil
            default: return nil
            }
        }

        var canonicalName: String {
            switch self {
            case .forwarded: return "Forwarded"
            case .xForwardedFor: return "X-Forwarded-For"
            case .xForwardedProto: return "X-Forwarded-Proto"
            case .xForwardedHost: return "X-Forwarded-Host"
            }
        }
    }

    /// Which of the `Field`s a request carried (one bit each).
    struct Present: OptionSet, Sendable {
        let rawValue: UInt8
        init(rawValue: UInt8) { self.rawValue = rawValue }
        init(_ field: Field) { rawValue = 1 << UInt8(field.rawValue) }
    }

    let style: ServerConfiguration.Route.Forwarded
    /// The client is in the route's `trusted_clients`: its own forwarding fields travel on.
    let trusted: Bool
    /// The client's IP address, without port or brackets (`192.0.2.1`, `2001:db8::1`).
    let clientAddress: String
    /// The scheme the client used to reach Sluice (`http`: routes listen in plain text).
    let proto: String

    init(style: ServerConfiguration.Route.Forwarded, trusted: Bool, clientAddress: String, proto: String = "http") {
        self.style = style
        self.trusted = trusted
        self.clientAddress = clientAddress
        self.proto = proto
    }

    static func == (a: ForwardingFields, b: ForwardingFields) -> Bool {
        a.style == b.style && a.trusted == b.trusted && a.clientAddress == b.clientAddress && a.proto == b.proto
    }

    /// Whether the client's field `name` is removed before forwarding: one of the forwarding
    /// fields, from a client that is not trusted.
    func removes(_ name: UnsafeBufferPointer<UInt8>) -> Bool {
        !trusted && Field.named(name) != nil
    }

    /// The field lines Sluice adds to `head` (its `Host` and, from a trusted client, which
    /// forwarding fields it carried already).
    func lines(for head: HTTPRequestHead) -> [(name: String, value: String)] {
        var host: String?
        var present = Present()
        head.bytes.withUnsafeBufferPointer { buf in
            for field in head.fields {
                let name = UnsafeBufferPointer(rebasing: buf[field.name])
                if host == nil, name.count == 4, ASCII.equalsIgnoringCase(name, "host") {
                    host = head.string(field.value)
                } else if trusted, let owned = Field.named(name) {
                    present.insert(Present(owned))
                }
            }
        }
        return lines(host: host, present: present)
    }

    /// The field lines Sluice adds to a request whose `Host` was `host` (nil: none) and which
    /// carried the `present` fields (as counted after `drops`).
    func lines(host: String?, present: Present) -> [(name: String, value: String)] {
        switch style {
        case .none:
            return []
        case .rfc7239:
            var element = "for=\(Self.nodeName(clientAddress));proto=\(proto)"
            if let host, !host.isEmpty { element += ";host=\(Self.token(orQuoted: host))" }
            return [(Field.forwarded.canonicalName, element)]
        case .xForwarded:
            var out = [(Field.xForwardedFor.canonicalName, clientAddress)]
            if !present.contains(.init(.xForwardedProto)) { out.append((Field.xForwardedProto.canonicalName, proto)) }
            if let host, !host.isEmpty, !present.contains(.init(.xForwardedHost)) {
                out.append((Field.xForwardedHost.canonicalName, host))
            }
            return out
        }
    }

    /// RFC 7239 §6: an IPv6 node is bracketed and, since `[` and `:` are not token
    /// characters, quoted.
    static func nodeName(_ address: String) -> String {
        address.utf8.contains(0x3A) ? "\"[\(address)]\"" : address
    }

    /// A `Forwarded` parameter value: a token as is, anything else as a quoted string.
    static func token(orQuoted value: String) -> String {
        if !value.isEmpty && value.utf8.allSatisfy(ASCII.isTokenChar) { return value }
        var quoted = "\""
        for c in value {
            if c == "\"" || c == "\\" { quoted.append("\\") }
            quoted.append(c)
        }
        return quoted + "\""
    }
}
