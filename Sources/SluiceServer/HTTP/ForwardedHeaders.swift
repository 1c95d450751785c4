import HTTPTypes
import SluiceCore

#if canImport(Glibc)
    import Glibc
#endif

/// The header rewriting a proxy owes both directions (RFC 9110 §7.6): hop-by-hop fields and
/// those named in `Connection` are removed, `Via` is added, `Proxy-Authorization` and
/// `Proxy-Connection` never travel on. (The response side is `ResponseEncoder`.)
enum ForwardedHeaders {
    static func lowercasedName(_ bytes: UnsafeBufferPointer<UInt8>) -> String {
        String(unsafeUninitializedCapacity: bytes.count) { out in
            for i in 0..<bytes.count { out[i] = ASCII.lower(bytes[i]) }
            return bytes.count
        }
    }

    /// Whether a request field named `name` (any case) never travels upstream: the fields that
    /// describe one connection (RFC 9110 §7.6.1, plus the de-facto `Proxy-Connection`),
    /// `Proxy-Authorization`, and those the session core sets itself (`Host`, framing,
    /// `Expect`). Compared as bytes: no string is built for the fields that do travel.
    static func isDroppedRequestField(_ name: UnsafeBufferPointer<UInt8>) -> Bool {
        switch name.count {
        case 2: return ASCII.equalsIgnoringCase(name, "te")
        case 4: return ASCII.equalsIgnoringCase(name, "host")
        case 6: return ASCII.equalsIgnoringCase(name, "expect")
        case 7: return ASCII.equalsIgnoringCase(name, "upgrade") || ASCII.equalsIgnoringCase(name, "trailer")
        case 10: return ASCII.equalsIgnoringCase(name, "connection") || ASCII.equalsIgnoringCase(name, "keep-alive")
        case 11: return ASCII.equalsIgnoringCase(name, "sluice-peer")
        case 14: return ASCII.equalsIgnoringCase(name, "content-length")
        case 16: return ASCII.equalsIgnoringCase(name, "proxy-connection") || ASCII.equalsIgnoringCase(name, "sluice-lua-depth")
        case 17: return ASCII.equalsIgnoringCase(name, "transfer-encoding")
        case 19: return ASCII.equalsIgnoringCase(name, "proxy-authorization")
        default: return false
        }
    }

    /// The `lua` sub-request depth `head` carries (`LuaSubrequest.depthHeader`, the first
    /// field): read only from this process's own sub-requests, or from a fleet peer's signed
    /// request (`fromPeer`); 0 for anything else.
    static func scriptDepth(of head: HTTPRequestHead, fromPeer: Bool) -> Int {
        guard let value = head.values(named: "sluice-lua-depth").first else { return 0 }
        return LuaSubrequest.depth(fromHeader: Substring(value), anyToken: fromPeer)
    }

    /// `X-Request-Id` (docs/configuration.md, "Request ids").
    static let requestIdName = HTTPField.Name("X-Request-Id")!

    /// The client's `X-Request-Id`, when it sent one (the first; the parser has checked that
    /// it is a legal field value). Compared as bytes.
    static func requestId(of head: HTTPRequestHead) -> String? {
        head.bytes.withUnsafeBufferPointer { buf -> String? in
            for field in head.fields where field.name.count == 12 && !field.value.isEmpty {
                if ASCII.equalsIgnoringCase(UnsafeBufferPointer(rebasing: buf[field.name]), "x-request-id") {
                    return head.string(field.value)
                }
            }
            return nil
        }
    }

    /// The header lines of a forwarded request, built in the worker's reusable `builder`
    /// (the transport adds `Host` from the target and the body's framing). With `edits` (a
    /// policy made only of header-editing adapters), the adapters' work is done here, in the
    /// same pass: replaced fields are skipped and the plan's appended. `requestId`: the
    /// `X-Request-Id` Sluice made for a request that came without one (unless the plan sets or
    /// removes that field itself).
    static func requestLines(
        for head: HTTPRequestHead, viaLine: [UInt8], edits: HeaderEditPlan? = nil,
        requestId: String? = nil, forwarding: ForwardingFields? = nil,
        builder: inout RequestHeaderLines.Builder
    ) -> RequestHeaderLines {
        fieldLines(for: head, edits: edits, requestId: requestId, forwarding: forwarding, builder: &builder)
        builder.append(line: viaLine)
        return builder.makeLines()
    }

    /// `fieldLines` of `exchange`'s request as it came: its head, the request id Sluice made
    /// for it, its connection's forwarding fields (the worker's `scriptLines` and the stage
    /// tests' twin of it).
    static func fieldLines(of exchange: Exchange, edits: HeaderEditPlan?, builder: inout RequestHeaderLines.Builder) {
        fieldLines(
            for: exchange.head, edits: edits, requestId: exchange.generatedRequestId,
            forwarding: exchange.client.forwarding, builder: &builder)
    }

    /// `requestLines` before its last step: the lines left in `builder`, without `Via` and not
    /// made (the lines the policy's scripts read and edit in place, `finishScripted`).
    static func fieldLines(
        for head: HTTPRequestHead, edits: HeaderEditPlan?, requestId: String?, forwarding: ForwardingFields?,
        builder: inout RequestHeaderLines.Builder
    ) {
        builder.reset()
        head.bytes.withUnsafeBufferPointer { buf in
            for field in head.fields {
                let name = UnsafeBufferPointer(rebasing: buf[field.name])
                if isDroppedRequestField(name) { continue }
                if let forwarding, forwarding.removes(name) { continue }
                if !head.connectionTokens.isEmpty, head.connectionTokens.contains(lowercasedName(name)) { continue }
                if let edits, edits.replaces(name) { continue }
                builder.append(name: name, value: UnsafeBufferPointer(rebasing: buf[field.value]))
            }
        }
        if let edits, !edits.appendedRanges.isEmpty {
            edits.appendedBytes.withUnsafeBufferPointer { bytes in
                for (name, value) in edits.appendedRanges {
                    let name = UnsafeBufferPointer(rebasing: bytes[name])
                    if isDroppedRequestField(name) { continue }  // whatever its case
                    builder.append(name: name, value: UnsafeBufferPointer(rebasing: bytes[value]))
                }
            }
        }
        if let requestId {
            var name = "x-request-id"
            let edited = edits.map { plan in name.withUTF8 { plan.replaces($0) } } ?? false
            if !edited { builder.append(name: "X-Request-Id".utf8, value: requestId.utf8) }
        }
        if let forwarding {
            for (name, value) in forwarding.lines(for: head) { builder.append(name: name.utf8, value: value.utf8) }
        }
    }

    /// The fields of a request head that travel upstream (hop-by-hop and framing fields
    /// removed), as the pipeline's `HTTPFields`. With `edits` (`HostPolicy.modelHeaderPlan`),
    /// the fields it replaces are left out (the caller appends the plan's own after the
    /// request id). `reserving`: room for as many more fields, so that the caller's appends
    /// (and the adapters') do not grow the storage again.
    static func forwardedFields(
        of head: HTTPRequestHead, forwarding: ForwardingFields? = nil, edits: HeaderEditPlan? = nil,
        reserving extra: Int = 0
    ) -> HTTPFields {
        var fields = HTTPFields()
        fields.reserveCapacity(head.fields.count + extra)
        head.bytes.withUnsafeBufferPointer { buf in
            for field in head.fields {
                let name = UnsafeBufferPointer(rebasing: buf[field.name])
                if isDroppedRequestField(name) { continue }
                if let forwarding, forwarding.removes(name) { continue }
                if !head.connectionTokens.isEmpty, head.connectionTokens.contains(lowercasedName(name)) { continue }
                if let edits, edits.replaces(name) { continue }
                guard let name = HTTPField.Name(head.string(field.name)) else { continue }
                fields.append(HTTPField(name: name, lenientValue: buf[field.value]))
            }
        }
        if let forwarding {
            for (name, value) in forwarding.lines(for: head) {
                var name = name
                if let edits, name.withUTF8({ edits.replaces($0) }) { continue }
                if let name = HTTPField.Name(name) { fields.append(HTTPField(name: name, value: value)) }
            }
        }
        return fields
    }

    /// The header lines of a request the pipeline adapted. Names and values are copied from
    /// their bytes: `field.value` would make a `String` of a value kept as bytes.
    static func requestLines(
        for fields: HTTPFields, viaLine: [UInt8], builder: inout RequestHeaderLines.Builder
    ) -> RequestHeaderLines {
        builder.reset()
        for field in fields {
            var name = field.name.rawName
            name.withUTF8 { name in
                if isDroppedRequestField(name) { return }
                field.withUnsafeBytesOfValue { builder.append(name: name, value: $0) }
            }
        }
        builder.append(line: viaLine)
        return builder.makeLines()
    }
}
