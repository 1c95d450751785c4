import CLibEvent
import SluiceCore

/// Every HTTP/1.1 response byte Sluice writes to a client comes from here: an upstream's head
/// re-framed for the client (RFC 9110 §7.6), the body framing (chunks), Sluice's own error
/// responses, `100 Continue`, and the answer to a CONNECT. Writes go straight into the
/// client's output `evbuffer`; nothing is built as a `String` on the forwarding path.
enum ResponseEncoder {
    /// How the response body is framed for the client.
    enum Framing {
        /// No body (HEAD, 1xx, 204, 304).
        case none
        /// The upstream's `Content-Length`.
        case length
        /// Re-chunked for an HTTP/1.1 client.
        case chunked
        /// Ends with the connection (an HTTP/1.0 client without a length).
        case close
    }

    /// Why an upstream response head cannot be forwarded (the client gets 502).
    struct InvalidResponse: Error {
        let reason: String
    }

    /// `HTTP/1.1 100 Continue`: Sluice itself asks for the request body it will stream on.
    static func interimContinue(into output: OpaquePointer) {
        evbuffer_add(output, "HTTP/1.1 100 Continue\r\n\r\n", 25)
    }

    /// An origin's interim response (`102 Processing`, `103 Early Hints`, …) forwarded to an
    /// HTTP/1.1 client before the final one (RFC 9110 §15.2): its end-to-end fields
    /// (`ResponseHeadCollector.endToEndFields`: hop-by-hop ones left out, values cleaned).
    /// With Sluice's `Via` line, as every message it forwards (RFC 9110 §7.6.3).
    static func interim(
        status: Int, fields: [(name: String, value: String)], viaLine: [UInt8], into output: OpaquePointer
    ) {
        var text = "HTTP/1.1 \(status) \(reasonPhrase(status))\r\n"
        for field in fields { text += field.name + ": " + field.value + "\r\n" }
        text.withUTF8 { _ = evbuffer_add(output, $0.baseAddress, $0.count) }
        viaLine.withUnsafeBytes { _ = evbuffer_add(output, $0.baseAddress, $0.count) }
        evbuffer_add(output, "\r\n", 2)
    }

    /// The answer to a CONNECT whose tunnel is open (or that Sluice intercepts).
    static let connectEstablished: StaticString = "HTTP/1.1 200 Connection established\r\n\r\n"

    static func connectEstablished(into output: OpaquePointer) {
        evbuffer_add(output, connectEstablished.utf8Start, connectEstablished.utf8CodeUnitCount)
    }

    /// One chunk of a re-chunked body: size line, data, CRLF.
    static func chunk(_ data: UnsafeRawBufferPointer, into output: OpaquePointer) {
        chunkSizeLine(data.count, into: output)
        evbuffer_add(output, data.baseAddress, data.count)
        evbuffer_add(output, "\r\n", 2)
    }

    /// A chunk's size line (hex, CRLF): the caller adds its `size` bytes and a CRLF.
    static func chunkSizeLine(_ size: Int, into output: OpaquePointer) {
        var line: (UInt64, UInt64, UInt64) = (0, 0, 0)  // up to 16 hex digits + CRLF
        let count = withUnsafeMutableBytes(of: &line) { raw -> Int in
            var n = size
            var digits = 0
            repeat {
                digits += 1
                n >>= 4
            } while n > 0
            n = size
            for i in stride(from: digits - 1, through: 0, by: -1) {
                raw[i] = hexDigits[n & 0xF]
                n >>= 4
            }
            raw[digits] = 0x0D
            raw[digits + 1] = 0x0A
            return digits + 2
        }
        withUnsafeBytes(of: &line) { _ = evbuffer_add(output, $0.baseAddress, count) }
    }

    /// The last chunk of a re-chunked body (no trailers).
    static func lastChunk(into output: OpaquePointer) {
        evbuffer_add(output, "0\r\n\r\n", 5)
    }

    private static let hexDigits: [UInt8] = Array("0123456789abcdef".utf8)

    /// Sluice's own response for `error`: a one-line `text/plain` body, `Connection: close`
    /// when the connection ends after it.
    static func error(_ error: ProxyError, close: Bool, into output: OpaquePointer) {
        var text = errorText(error, close: close)
        text.withUTF8 { _ = evbuffer_add(output, $0.baseAddress, $0.count) }
    }

    /// A script's own answer (`req:respond`, `ProxyError.luaResponded`): its status, its
    /// fields (checked by the script's API: tokens, no CR, LF or NUL, no framing field) and
    /// its body, framed by `Content-Length`; no body after a `HEAD` or with a `204` or `304`,
    /// and none with a `205` (RFC 9110 §15.3.6: no content, `Content-Length: 0`).
    static func localAnswer(_ response: LuaResponseView, headRequest: Bool, close: Bool, into output: OpaquePointer) {
        let body = response.status == 205 ? [] : response.body ?? []
        let bodyless = response.status == 204 || response.status == 304
        var head = "HTTP/1.1 \(response.status) \(reasonPhrase(response.status))\r\n"
        for field in response.headers { head += field.name.rawName + ": " + field.value + "\r\n" }
        if !bodyless { head += "Content-Length: \(body.count)\r\n" }
        head += close ? "Connection: close\r\n\r\n" : "\r\n"
        head.withUTF8 { _ = evbuffer_add(output, $0.baseAddress, $0.count) }
        if !headRequest, !bodyless { body.withUnsafeBytes { _ = evbuffer_add(output, $0.baseAddress, $0.count) } }
    }

    /// The bytes of `error(_:close:into:)`, for a socket Sluice answers without a connection.
    static func errorBytes(_ error: ProxyError, close: Bool) -> [UInt8] {
        Array(errorText(error, close: close).utf8)
    }

    private static func errorText(_ error: ProxyError, close: Bool) -> String {
        let body = "sluice: \(error.message)\n"
        var head = "HTTP/1.1 \(error.status) \(reasonPhrase(error.status))\r\n"
        head += "Content-Type: text/plain; charset=utf-8\r\nContent-Length: \(body.utf8.count)\r\n"
        if case .proxyAuthenticationRequired = error {
            head += "Proxy-Authenticate: Basic realm=\"\(ProxyAuthentication.realm)\"\r\n"
        }
        if let seconds = error.retryAfterSeconds { head += "Retry-After: \(seconds)\r\n" }
        if case .rateLimited(let policy, let requests, let window, let seconds) = error {
            // The IETF httpapi rate-limit fields: the quota and what is left of it (none).
            head += "RateLimit-Policy: \"\(policy)\";q=\(requests);w=\(window)\r\n"
            head += "RateLimit: \"\(policy)\";r=0;t=\(seconds)\r\n"
        } else if case .originRateLimited(let policy, _, let seconds) = error {
            head += "RateLimit: \"\(policy)\";r=0;t=\(seconds)\r\n"
        }
        head += close ? "Connection: close\r\n\r\n" : "\r\n"
        return head + body
    }

    /// The response fields the proxy treats specially, recognised by bytes (by
    /// `HTTPResponseParser` as it validates a line, or here for libcurl's lines).
    enum ResponseField {
        case connection, transferEncoding, contentLength
        /// keep-alive, proxy-connection, te, trailer, upgrade (RFC 9110 §7.6.1)
        case hopByHop
        case other

        init(_ name: UnsafeBufferPointer<UInt8>) {
            switch name.count {
            case 2 where ASCII.equalsIgnoringCase(name, "te"): self = .hopByHop
            case 7 where ASCII.equalsIgnoringCase(name, "trailer") || ASCII.equalsIgnoringCase(name, "upgrade"):
                self = .hopByHop
            case 10 where ASCII.equalsIgnoringCase(name, "connection"): self = .connection
            case 10 where ASCII.equalsIgnoringCase(name, "keep-alive"): self = .hopByHop
            case 14 where ASCII.equalsIgnoringCase(name, "content-length"): self = .contentLength
            case 16 where ASCII.equalsIgnoringCase(name, "proxy-connection"): self = .hopByHop
            case 17 where ASCII.equalsIgnoringCase(name, "transfer-encoding"): self = .transferEncoding
            default: self = .other
            }
        }
    }

    /// One field line's parts, as ranges into the collected lines.
    private struct FieldLine {
        var name: Range<Int>
        var value: Range<Int>
        var kind: ResponseField
    }

    /// Splits a field line at its colon: the name without trailing whitespace, the value
    /// trimmed. Throws for a line without a colon or with an invalid name. Whitespace between
    /// the name and the colon is removed, as RFC 9112 §5.1 asks of a proxy — but refused before
    /// `Content-Length` and `Transfer-Encoding`: libcurl does not take `Content-Length : 5` for a
    /// length and reads the body to the close, so a head mended to `Content-Length: 5` would
    /// frame for the client what libcurl did not, and the bytes after the fifth would reach the
    /// client as a second response.
    private static func split(_ buf: UnsafeBufferPointer<UInt8>, _ start: Int, _ end: Int) throws(InvalidResponse) -> FieldLine {
        var colon = start
        while colon < end, buf[colon] != 0x3A { colon += 1 }
        guard colon < end else { throw InvalidResponse(reason: "header line without a colon") }
        var nameEnd = colon
        while nameEnd > start, buf[nameEnd - 1] == 0x20 || buf[nameEnd - 1] == 0x09 { nameEnd -= 1 }
        guard nameEnd > start else { throw InvalidResponse(reason: "invalid header field name") }
        if nameEnd < colon {
            switch ResponseField(UnsafeBufferPointer(rebasing: buf[start..<nameEnd])) {
            case .contentLength, .transferEncoding:
                throw InvalidResponse(reason: "whitespace between a header field name and the colon")
            default: break
            }
        }
        for i in start..<nameEnd where !ASCII.isTokenChar(buf[i]) {
            throw InvalidResponse(reason: "invalid header field name")
        }
        var v = colon + 1
        var vEnd = end
        while v < vEnd, buf[v] == 0x20 || buf[v] == 0x09 { v += 1 }
        while vEnd > v, buf[vEnd - 1] == 0x20 || buf[vEnd - 1] == 0x09 { vEnd -= 1 }
        return FieldLine(
            name: start..<nameEnd, value: v..<vEnd,
            kind: ResponseField(UnsafeBufferPointer(rebasing: buf[start..<nameEnd])))
    }

    /// Calls `body` with each comma-separated element of a list value, whitespace trimmed
    /// (empty elements included).
    private static func forEachElement(
        _ buf: UnsafeBufferPointer<UInt8>, _ range: Range<Int>,
        _ body: (UnsafeBufferPointer<UInt8>) throws(InvalidResponse) -> Void
    ) throws(InvalidResponse) {
        var start = range.lowerBound
        var i = start
        while i <= range.upperBound {
            if i == range.upperBound || buf[i] == 0x2C {
                var s = start
                var e = i
                while s < e, buf[s] == 0x20 || buf[s] == 0x09 { s += 1 }
                while e > s, buf[e - 1] == 0x20 || buf[e - 1] == 0x09 { e -= 1 }
                try body(UnsafeBufferPointer(rebasing: buf[s..<e]))
                start = i + 1
            }
            i += 1
        }
    }

    /// Whether a Connection field of the head lists `name` (ASCII case-insensitive).
    private static func connectionLists(
        _ name: UnsafeBufferPointer<UInt8>, in buf: UnsafeBufferPointer<UInt8>,
        fields: UnsafeMutableBufferPointer<FieldLine>
    ) -> Bool {
        var found = false
        for field in fields where field.kind == .connection && !found {
            try? forEachElement(buf, field.value) { (token: UnsafeBufferPointer<UInt8>) throws(InvalidResponse) in
                if token.count == name.count, zip(token, name).allSatisfy({ ASCII.lower($0) == ASCII.lower($1) }) {
                    found = true
                }
            }
        }
        return found
    }

    /// Writes the response head for the client into `output`: status line, the upstream's
    /// end-to-end fields in order, `viaLine`, and framing chosen for this client (the
    /// upstream's `Content-Length` when it sent one, else chunked for HTTP/1.1 and
    /// close-delimited for HTTP/1.0). Returns the framing; writes nothing when it throws.
    ///
    /// The upstream's head is checked as strictly as a request (RFC 9112 §5, §6.3): differing
    /// or malformed `Content-Length`s and invalid field names are refused (no response
    /// smuggling through Sluice), and so is whitespace before the colon of `Content-Length` or
    /// `Transfer-Encoding` (before any other, it is removed: `split`); CR, LF or NUL inside a
    /// value become SP (RFC 9110 §5.5), so an upstream cannot inject fields. A `Connection`
    /// option naming `Content-Length` does not drop it.
    static func forwardedHead(
        _ head: ResponseHeadCollector, isHeadRequest: Bool, clientMinorVersion: Int,
        keepAlive: Bool, viaLine: [UInt8], extraLines: [UInt8] = [],
        into output: OpaquePointer
    ) throws(InvalidResponse) -> Framing {
        guard (100...599).contains(head.status) else { throw InvalidResponse(reason: "invalid status code") }
        // The fields' parts live on the stack for the two passes.
        let result = withUnsafeTemporaryAllocation(of: FieldLine.self, capacity: max(1, head.lineCount)) { fields in
            head.lines.withUnsafeBufferPointer { buf -> Result<Framing, InvalidResponse> in
                do throws(InvalidResponse) {
                    return .success(
                        try encode(
                            head, buf, fields, isHeadRequest: isHeadRequest,
                            clientMinorVersion: clientMinorVersion, keepAlive: keepAlive,
                            viaLine: viaLine, extraLines: extraLines, into: output))
                } catch {
                    return .failure(error)
                }
            }
        }
        return try result.get()
    }

    private static func encode(
        _ head: ResponseHeadCollector, _ buf: UnsafeBufferPointer<UInt8>,
        _ fields: UnsafeMutableBufferPointer<FieldLine>, isHeadRequest: Bool,
        clientMinorVersion: Int, keepAlive: Bool, viaLine: [UInt8], extraLines: [UInt8],
        into output: OpaquePointer
    ) throws(InvalidResponse) -> Framing {
        let status = head.status
        let count = head.lineCount
        // Pass 1: validate, and learn the facts that decide the framing.
        var hadTransferEncoding = false
        var contentLength: UInt64?
        // Whether a Connection option names fields to drop: `close` and `keep-alive` name none
        // but a field called `close` (Keep-Alive is hop-by-hop anyway).
        var connectionNamesFields = false
        var connectionSaysClose = false
        var start = 0
        // A head from Sluice's own parser was validated line by line: its fields' ranges and
        // kinds come with it, and its values hold no CR, LF or NUL.
        let validated = head.isValidated
        if validated, let facts = head.validatedFraming {
            // The parser read the framing fields as it validated them: their facts come along.
            hadTransferEncoding = facts.transferEncoding
            contentLength = facts.contentLength
            connectionSaysClose = facts.connectionClose
            connectionNamesFields = facts.connectionNamesFields
            for i in 0..<count {
                let f = head.fields[i]
                fields.initializeElement(at: i, to: FieldLine(name: f.name, value: f.value, kind: f.kind))
            }
        } else {
            for i in 0..<count {
                let field: FieldLine
                if validated {
                    let f = head.fields[i]
                    field = FieldLine(name: f.name, value: f.value, kind: f.kind)
                } else {
                    field = try split(buf, start, head.lineEnd(i))
                    start = head.lineEnd(i)
                }
                fields.initializeElement(at: i, to: field)
                switch field.kind {
                case .connection:
                    try forEachElement(buf, field.value) { (token: UnsafeBufferPointer<UInt8>) throws(InvalidResponse) in
                        if ASCII.equalsIgnoringCase(token, "close") {
                            connectionSaysClose = true
                        } else if !token.isEmpty, !ASCII.equalsIgnoringCase(token, "keep-alive") {
                            connectionNamesFields = true
                        }
                    }
                case .transferEncoding:
                    hadTransferEncoding = true
                case .contentLength:
                    try forEachElement(buf, field.value) { (element: UnsafeBufferPointer<UInt8>) throws(InvalidResponse) in
                        guard !element.isEmpty, element.count <= 18 else {
                            throw InvalidResponse(reason: "invalid or differing Content-Length")
                        }
                        var n: UInt64 = 0
                        for b in element {
                            guard b >= 0x30, b <= 0x39 else {
                                throw InvalidResponse(reason: "invalid or differing Content-Length")
                            }
                            n = n * 10 + UInt64(b - 0x30)
                        }
                        guard contentLength == nil || contentLength == n else {
                            throw InvalidResponse(reason: "invalid or differing Content-Length")
                        }
                        contentLength = n
                    }
                default:
                    break
                }
            }
        }
        let written = UnsafeMutableBufferPointer(rebasing: fields[0..<count])

        let bodiless = isHeadRequest || status < 200 || status == 204 || status == 304
        let framing: Framing
        if bodiless {
            framing = .none
        } else if contentLength != nil && !hadTransferEncoding {
            framing = .length
        } else {
            framing = clientMinorVersion == 1 ? .chunked : .close
        }
        let close = !keepAlive || framing == .close

        // Pass 2: write into one reserved extent of the output (an upper bound: each line
        // gains at most ": " and CRLF; the fixed lines take under 96 bytes).
        let reason = head.reason
        let useOwnReason = reason.isEmpty || !reason.allSatisfy({ $0 == 0x09 || ($0 >= 0x20 && $0 != 0x7F) })
        let bound = 96 + max(reason.count, 40) + buf.count + 4 * count + viaLine.count + extraLines.count
        var extent = iovec()
        guard evbuffer_reserve_space(output, bound, &extent, 1) >= 1 else {
            throw InvalidResponse(reason: "out of memory")
        }
        let out = extent.iov_base.assumingMemoryBound(to: UInt8.self)
        var n = 0
        func put(_ b: UInt8) {
            out[n] = b
            n += 1
        }
        func put(_ bytes: UnsafeBufferPointer<UInt8>) {
            guard let base = bytes.baseAddress else { return }
            ShortCopy.copy(out + n, base, bytes.count)
            n += bytes.count
        }
        func put(_ text: StaticString) {
            ShortCopy.copy(out + n, text.utf8Start, text.utf8CodeUnitCount)
            n += text.utf8CodeUnitCount
        }
        put("HTTP/1.1 ")
        put(UInt8(0x30 + status / 100))
        put(UInt8(0x30 + status / 10 % 10))
        put(UInt8(0x30 + status % 10))
        put(0x20)
        if useOwnReason {
            for b in reasonPhrase(status).utf8 { put(b) }
        } else {
            reason.withUnsafeBufferPointer { put($0) }
        }
        put("\r\n")
        for (i, field) in written.enumerated() {
            switch field.kind {
            case .connection, .transferEncoding, .hopByHop: continue
            case .contentLength where hadTransferEncoding && !bodiless: continue
            default: break
            }
            let name = UnsafeBufferPointer(rebasing: buf[field.name])
            if connectionSaysClose, ASCII.equalsIgnoringCase(name, "close") { continue }
            // `Connection` may not take away the length the body is framed by (an origin's or a
            // script's `Connection: content-length`): only hop-by-hop fields go.
            if connectionNamesFields, field.kind != .contentLength, connectionLists(name, in: buf, fields: written) {
                continue
            }
            // A validated line written as `Name: value` with nothing after the value (nearly
            // every origin's): copied whole, one copy where name and value take two.
            if validated, field.value.lowerBound == field.name.upperBound + 2, buf[field.name.upperBound + 1] == 0x20,
                field.value.upperBound == head.lineEnd(i), !field.value.isEmpty
            {
                put(UnsafeBufferPointer(rebasing: buf[field.name.lowerBound..<field.value.upperBound]))
                put("\r\n")
                continue
            }
            put(name)
            put(": ")
            if validated {
                put(UnsafeBufferPointer(rebasing: buf[field.value]))
            } else {
                for i in field.value {
                    let b = buf[i]
                    put(b == 0x0D || b == 0x0A || b == 0 ? 0x20 : b)
                }
            }
            put("\r\n")
        }
        viaLine.withUnsafeBufferPointer { put($0) }
        if !extraLines.isEmpty { extraLines.withUnsafeBufferPointer { put($0) } }
        if framing == .chunked { put("Transfer-Encoding: chunked\r\n") }
        if close { put("Connection: close\r\n") }
        put("\r\n")
        extent.iov_len = n
        evbuffer_commit_space(output, &extent, 1)
        return framing
    }

    /// The origin's `101` for the client of an upgrade: its end-to-end fields and `Upgrade`
    /// as they came (field names checked, CR, LF and NUL in values made SP), `Via`, and
    /// `Connection: Upgrade`; the other hop-by-hop and framing fields are dropped.
    static func switchingProtocols(
        _ head: ResponseHeadCollector, viaLine: [UInt8], into output: OpaquePointer
    )
        throws(InvalidResponse)
    {
        var out: [UInt8] = Array("HTTP/1.1 101 Switching Protocols\r\n".utf8)
        var sawUpgrade = false
        var start = 0
        try head.lines.withUnsafeBufferPointer { (buf: UnsafeBufferPointer<UInt8>) throws(InvalidResponse) in
            for i in 0..<head.lineCount {
                let end = head.lineEnd(i)
                defer { start = end }
                let field = try split(buf, start, end)
                let name = UnsafeBufferPointer(rebasing: buf[field.name])
                let isUpgrade = name.count == 7 && ASCII.equalsIgnoringCase(name, "upgrade")
                if !isUpgrade, field.kind != .other { continue }
                sawUpgrade = sawUpgrade || isUpgrade
                out.append(contentsOf: name)
                out.append(contentsOf: ": ".utf8)
                for i in field.value { out.append(buf[i] == 0x0D || buf[i] == 0x0A || buf[i] == 0 ? 0x20 : buf[i]) }
                out.append(contentsOf: "\r\n".utf8)
            }
        }
        guard sawUpgrade else { throw InvalidResponse(reason: "101 without Upgrade") }
        out.append(contentsOf: viaLine)
        out.append(contentsOf: "Connection: Upgrade\r\n\r\n".utf8)
        evbuffer_add(output, out, out.count)
    }

    static func reasonPhrase(_ status: Int) -> String {
        switch status {
        case 102: return "Processing"
        case 103: return "Early Hints"
        case 200: return "OK"
        case 201: return "Created"
        case 202: return "Accepted"
        case 204: return "No Content"
        case 206: return "Partial Content"
        case 301: return "Moved Permanently"
        case 302: return "Found"
        case 303: return "See Other"
        case 304: return "Not Modified"
        case 307: return "Temporary Redirect"
        case 308: return "Permanent Redirect"
        case 400: return "Bad Request"
        case 401: return "Unauthorized"
        case 403: return "Forbidden"
        case 404: return "Not Found"
        case 405: return "Method Not Allowed"
        case 407: return "Proxy Authentication Required"
        case 408: return "Request Timeout"
        case 409: return "Conflict"
        case 410: return "Gone"
        case 413: return "Content Too Large"
        case 414: return "URI Too Long"
        case 415: return "Unsupported Media Type"
        case 416: return "Range Not Satisfiable"
        case 429: return "Too Many Requests"
        case 431: return "Request Header Fields Too Large"
        case 500: return "Internal Server Error"
        case 501: return "Not Implemented"
        case 502: return "Bad Gateway"
        case 503: return "Service Unavailable"
        case 504: return "Gateway Timeout"
        case 505: return "HTTP Version Not Supported"
        case 508: return "Loop Detected"
        default: return "Status \(status)"
        }
    }
}
