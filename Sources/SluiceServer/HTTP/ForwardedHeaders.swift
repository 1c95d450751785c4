#if canImport(Glibc)
import Glibc
#endif
import CCurl
import HTTPTypes
import SluiceCore

/// The header rewriting a proxy owes both directions (RFC 9110 §7.6): hop-by-hop fields and
/// those named in `Connection` are removed, `Via` is added, `Proxy-Authorization` and
/// `Proxy-Connection` never travel on, and the response is re-framed for this client.
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
        case 14: return ASCII.equalsIgnoringCase(name, "content-length")
        case 16: return ASCII.equalsIgnoringCase(name, "proxy-connection")
        case 17: return ASCII.equalsIgnoringCase(name, "transfer-encoding")
        case 19: return ASCII.equalsIgnoringCase(name, "proxy-authorization")
        default: return false
        }
    }

    /// The curl header list for a forwarded request. Curl derives `Host` from the URL,
    /// sets the body framing itself, and is told not to add `Accept` or `Expect`.
    /// With `edits` (a policy made only of header-editing adapters), the adapters' work is
    /// done here, in the same pass: replaced fields are skipped and the plan's appended.
    static func requestList(for head: HTTPRequestHead, via: String,
                            edits: HeaderEditPlan? = nil) -> UnsafeMutablePointer<curl_slist>? {
        var list: UnsafeMutablePointer<curl_slist>?
        var sawAccept = false
        var line: [UInt8] = []
        line.reserveCapacity(256)
        head.bytes.withUnsafeBufferPointer { buf in
            for field in head.fields {
                let name = UnsafeBufferPointer(rebasing: buf[field.name])
                if isDroppedRequestField(name) { continue }
                if !head.connectionTokens.isEmpty, head.connectionTokens.contains(lowercasedName(name)) { continue }
                if let edits, edits.replaces(name) { continue }
                if name.count == 6, ASCII.equalsIgnoringCase(name, "accept") { sawAccept = true }
                append(name: name, value: buf[field.value], to: &list, scratch: &line)
            }
        }
        if let edits {
            for (name, value) in edits.appended {
                var lower = name.lowercased()
                if lower.withUTF8({ isDroppedRequestField($0) }) { continue }
                if lower == "accept" { sawAccept = true }
                append(name: name.utf8, value: value.utf8, to: &list, scratch: &line)
            }
        }
        return finish(list, via: via, sawAccept: sawAccept)
    }

    /// Appends `Name: value` (curl's `Name;` for an empty value) to a curl list, built in
    /// `scratch` as bytes.
    private static func append(name: some Collection<UInt8>, value: some Collection<UInt8>,
                               to list: inout UnsafeMutablePointer<curl_slist>?, scratch line: inout [UInt8]) {
        line.removeAll(keepingCapacity: true)
        line.append(contentsOf: name)
        if value.isEmpty {
            line.append(0x3B)
        } else {
            line.append(0x3A)
            line.append(0x20)
            line.append(contentsOf: value)
        }
        line.append(0)
        list = line.withUnsafeBufferPointer { p in
            p.withMemoryRebound(to: CChar.self) { curl_slist_append(list, $0.baseAddress) }
        }
    }

    /// Sluice's own lines: `Via`, and empty `Expect`/`Accept` so curl adds neither.
    private static func finish(_ list: UnsafeMutablePointer<curl_slist>?, via: String,
                               sawAccept: Bool) -> UnsafeMutablePointer<curl_slist>? {
        var list = curl_slist_append(list, viaLine(via))
        list = curl_slist_append(list, "Expect:")
        if !sawAccept { list = curl_slist_append(list, "Accept:") }
        return list
    }

    /// `Via: <via>`, built once per distinct value (one per process in practice).
    static func viaLine(_ via: String) -> String { "Via: " + via }

    /// The fields of a request head that travel upstream (hop-by-hop and framing fields
    /// removed), as the pipeline's `HTTPFields`.
    static func forwardedFields(of head: HTTPRequestHead) -> HTTPFields {
        var fields = HTTPFields()
        head.bytes.withUnsafeBufferPointer { buf in
            for field in head.fields {
                let name = UnsafeBufferPointer(rebasing: buf[field.name])
                if isDroppedRequestField(name) { continue }
                if !head.connectionTokens.isEmpty, head.connectionTokens.contains(lowercasedName(name)) { continue }
                guard let name = HTTPField.Name(head.string(field.name)) else { continue }
                fields.append(HTTPField(name: name, lenientValue: buf[field.value]))
            }
        }
        return fields
    }

    /// The curl header list for a request the pipeline adapted.
    static func requestList(for fields: HTTPFields, via: String) -> UnsafeMutablePointer<curl_slist>? {
        var list: UnsafeMutablePointer<curl_slist>?
        var line: [UInt8] = []
        line.reserveCapacity(256)
        for field in fields {
            var lower = field.name.canonicalName
            if lower.withUTF8({ isDroppedRequestField($0) }) { continue }
            append(name: field.name.rawName.utf8, value: field.value.utf8, to: &list, scratch: &line)
        }
        return finish(list, via: via, sawAccept: fields[.accept] != nil)
    }

    /// The value of the first response field named `lowercaseName` in curl's collected lines.
    static func responseValue(_ lowercaseName: String, lines: [UInt8], lineEnds: [Int]) -> String? {
        var start = 0
        for end in lineEnds {
            let line = lines[start..<end]
            if let colon = line.firstIndex(of: 0x3A), colon - start == lowercaseName.utf8.count,
               lines.withUnsafeBufferPointer({ ASCII.equalsIgnoringCase(UnsafeBufferPointer(rebasing: $0[start..<colon]), lowercaseName) }) {
                var v = line[(colon + 1)...]
                while v.first == 0x20 || v.first == 0x09 { v = v.dropFirst() }
                while v.last == 0x20 || v.last == 0x09 { v = v.dropLast() }
                return String(decoding: v, as: UTF8.self)
            }
            start = end
        }
        return nil
    }

    struct ResponseHead {
        var bytes: [UInt8]
        var framing: UpstreamTransfer.ResponseFraming
    }

    /// The response fields the proxy treats specially, recognised by bytes.
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

    /// Why an upstream response head cannot be forwarded (the client gets 502).
    struct InvalidResponse: Error {
        let reason: String
    }

    /// The response head for the client: status line, the upstream's end-to-end fields in
    /// order, `Via`, and framing chosen for this client (the upstream's `Content-Length` when
    /// it sent one, else chunked for HTTP/1.1 and close-delimited for HTTP/1.0).
    ///
    /// The upstream's head is checked as strictly as a request (RFC 9112 §5, §6.3): differing
    /// or malformed `Content-Length`s and invalid field names are refused (no response
    /// smuggling through Sluice); whitespace before a colon is removed and CR, LF or NUL inside
    /// a value become SP (RFC 9110 §5.5), so an upstream cannot inject fields.
    static func responseHead(status: Int, reason: ArraySlice<UInt8>, lines: [UInt8], lineEnds: [Int],
                             isHeadRequest: Bool, clientMinorVersion: Int, keepAlive: Bool,
                             via: String) throws(InvalidResponse) -> ResponseHead {
        guard (100...599).contains(status) else { throw InvalidResponse(reason: "invalid status code") }
        var connectionTokens: [String] = []
        var hadTransferEncoding = false
        var contentLength: UInt64?
        // (name, value) ranges into `lines`, name without trailing whitespace, value trimmed.
        var fields: [(name: Range<Int>, value: Range<Int>, kind: ResponseField)] = []
        fields.reserveCapacity(lineEnds.count)
        var start = 0
        for end in lineEnds {
            defer { start = end }
            guard let colon = lines[start..<end].firstIndex(of: 0x3A) else {
                throw InvalidResponse(reason: "header line without a colon")
            }
            var nameEnd = colon
            while nameEnd > start, lines[nameEnd - 1] == 0x20 || lines[nameEnd - 1] == 0x09 { nameEnd -= 1 }
            guard nameEnd > start, lines[start..<nameEnd].allSatisfy({ ASCII.isTokenChar[Int($0)] }) else {
                throw InvalidResponse(reason: "invalid header field name")
            }
            var v = colon + 1, vEnd = end
            while v < vEnd, lines[v] == 0x20 || lines[v] == 0x09 { v += 1 }
            while vEnd > v, lines[vEnd - 1] == 0x20 || lines[vEnd - 1] == 0x09 { vEnd -= 1 }
            let kind = lines.withUnsafeBufferPointer { ResponseField(UnsafeBufferPointer(rebasing: $0[start..<nameEnd])) }
            fields.append((start..<nameEnd, v..<vEnd, kind))
            switch kind {
            case .connection:
                for token in lines.withUnsafeBufferPointer({ HTTPRequestParser.listElements(UnsafeBufferPointer(rebasing: $0[v..<vEnd])) }) {
                    connectionTokens.append(token.lowercased())
                }
            case .transferEncoding:
                hadTransferEncoding = true
            case .contentLength:
                for element in lines.withUnsafeBufferPointer({ HTTPRequestParser.listElements(UnsafeBufferPointer(rebasing: $0[v..<vEnd]), keepEmpty: true) }) {
                    guard !element.isEmpty, element.count <= 18, element.utf8.allSatisfy({ $0 >= 48 && $0 <= 57 }),
                          let n = UInt64(element), contentLength == nil || contentLength == n
                    else { throw InvalidResponse(reason: "invalid or differing Content-Length") }
                    contentLength = n
                }
            default:
                break
            }
        }

        let bodiless = isHeadRequest || status < 200 || status == 204 || status == 304
        let framing: UpstreamTransfer.ResponseFraming
        if bodiless {
            framing = .none
        } else if contentLength != nil && !hadTransferEncoding {
            framing = .length
        } else {
            framing = clientMinorVersion == 1 ? .chunked : .close
        }
        let close = !keepAlive || framing == .close

        var out: [UInt8] = []
        out.reserveCapacity(lines.count + 4 * lineEnds.count + 128)
        out.append(contentsOf: "HTTP/1.1 \(status) ".utf8)
        if reason.isEmpty || !reason.allSatisfy({ $0 == 0x09 || ($0 >= 0x20 && $0 != 0x7F) }) {
            out.append(contentsOf: reasonPhrase(status).utf8)
        } else {
            out.append(contentsOf: reason)
        }
        out.append(contentsOf: "\r\n".utf8)
        for field in fields {
            switch field.kind {
            case .connection, .transferEncoding, .hopByHop: continue
            case .contentLength where hadTransferEncoding && !bodiless: continue
            default: break
            }
            if !connectionTokens.isEmpty,
               connectionTokens.contains(lines.withUnsafeBufferPointer { lowercasedName(UnsafeBufferPointer(rebasing: $0[field.name])) }) {
                continue
            }
            out.append(contentsOf: lines[field.name])
            out.append(contentsOf: ": ".utf8)
            for b in lines[field.value] { out.append(b == 0x0D || b == 0x0A || b == 0 ? 0x20 : b) }
            out.append(contentsOf: "\r\n".utf8)
        }
        out.append(contentsOf: "Via: \(via)\r\n".utf8)
        if framing == .chunked { out.append(contentsOf: "Transfer-Encoding: chunked\r\n".utf8) }
        if close { out.append(contentsOf: "Connection: close\r\n".utf8) }
        out.append(contentsOf: "\r\n".utf8)
        return ResponseHead(bytes: out, framing: framing)
    }

    static func reasonPhrase(_ status: Int) -> String {
        switch status {
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
        case 408: return "Request Timeout"
        case 409: return "Conflict"
        case 410: return "Gone"
        case 413: return "Content Too Large"
        case 414: return "URI Too Long"
        case 415: return "Unsupported Media Type"
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
