import HTTPTypes

/// An upstream response head as libcurl hands it over, one line per call
/// (`CURLOPT_HEADERFUNCTION`): the status, the reason phrase and the field lines, kept as
/// bytes. Interim (1xx) heads are dropped when the next status line starts; the head is
/// complete at the empty line after a final (≥ 200) status. A field line that starts with
/// whitespace (obs-fold) is joined to the previous one with one SP, as RFC 9112 §5.2 asks
/// of a proxy. Nothing here judges the fields: `ResponseEncoder` does, when it re-frames the
/// head for the client.
///
/// Sluice's own response parser (`HTTPResponseParser`) fills it through `beginValidated`,
/// `addValidated` and `completeValidated` instead: it has already checked every line, so it
/// hands over each field's name and value ranges and kind (`fields`), and the encoder
/// neither splits nor scrubs the lines a second time.
///
/// A value type with reusable storage: `reset()` keeps its buffers' capacity, so a pooled
/// collector (see `UpstreamSession.takeHeadCollector`) collects heads without allocating.
struct ResponseHeadCollector {
    /// A field line the response parser validated: a token name, a colon, a value of HTAB,
    /// SP, VCHAR and obs-text only (no CR, LF or NUL), as ranges into `lines`.
    struct ValidatedField {
        var name: Range<Int>
        var value: Range<Int>
        /// Where the line ends in `lines`: past its last byte, trailing whitespace included
        /// (so past `value` when the value is followed by SP or HTAB).
        var end: Int
        var kind: ResponseEncoder.ResponseField
    }

    /// 0 until a status line arrived.
    private(set) var status = 0
    /// The reason phrase as received (may be empty).
    private(set) var reason: [UInt8] = []
    /// The field lines back to back, without their line ends.
    var lines: ArraySlice<UInt8> { storage.bytes }
    /// `lines`, written in place (a head appended one array run per field).
    private var storage = ByteRoom()
    /// Where each field line ends in `lines`, for a head that is not validated (a validated
    /// one keeps its ends in `fields`: one append a line, not two). Read through `lineEnd`.
    private var looseEnds: [Int] = []
    /// The empty line after a final status arrived.
    private(set) var isComplete = false
    /// One entry per field line when the head came validated from `HTTPResponseParser`
    /// (`isValidated`); empty for libcurl's lines.
    private(set) var fields: [ValidatedField] = []
    /// The head came from `HTTPResponseParser`: `fields` describes every line.
    private(set) var isValidated = false
    /// How many field lines the head has.
    var lineCount: Int { isValidated ? fields.count : looseEnds.count }

    /// Where field line `i` ends in `lines` (where the next one starts).
    func lineEnd(_ i: Int) -> Int { isValidated ? fields[i].end : looseEnds[i] }

    /// What the response parser learnt of a validated final head's framing fields, so that
    /// the encoder need not read `Connection` and `Content-Length` again; nil for any other
    /// head (libcurl's, an interim one, an edited one).
    private(set) var validatedFraming: ValidatedFraming?

    /// The framing facts of a validated final head (`validatedFraming`).
    struct ValidatedFraming: Equatable {
        /// The `Content-Length` value (the parser refused differing ones).
        var contentLength: UInt64?
        var transferEncoding = false
        /// `Connection` lists `close`.
        var connectionClose = false
        /// `Connection` lists an option other than `close` and `keep-alive`: a field to drop.
        var connectionNamesFields = false
    }

    /// Forgets the head, keeping the buffers' capacity. An empty buffer is left alone: a
    /// response resets its collector three times (the transfer's start, the request's
    /// send, the status line), and emptying an empty array still costs a call to
    /// `replaceSubrange` (64 instructions each).
    mutating func reset() {
        status = 0
        if !reason.isEmpty { reason.removeAll(keepingCapacity: true) }
        storage.removeAll()
        if !looseEnds.isEmpty { looseEnds.removeAll(keepingCapacity: true) }
        if !fields.isEmpty { fields.removeAll(keepingCapacity: true) }
        isValidated = false
        validatedFraming = nil
        isComplete = false
    }

    /// A final status line the response parser checked: `status` and its reason phrase.
    mutating func beginValidated(status: Int, reason: UnsafeRawBufferPointer) {
        reset()
        self.status = status
        reason.withMemoryRebound(to: UInt8.self) { self.reason.append(contentsOf: $0) }
        isValidated = true
    }

    /// A field line the response parser checked, with its name and trimmed value as ranges
    /// of `line`, and its kind.
    mutating func addValidated(
        _ line: UnsafeRawBufferPointer, name: Range<Int>, value: Range<Int>,
        kind: ResponseEncoder.ResponseField
    ) {
        let base = storage.count
        storage.append(line)
        fields.append(
            ValidatedField(
                name: base + name.lowerBound..<base + name.upperBound,
                value: base + value.lowerBound..<base + value.upperBound, end: storage.count, kind: kind))
    }

    /// The same status and reason with `replacement` as its field lines (a script's edits,
    /// `LuaResponseStage`): not validated, so the encoder checks every line again.
    func replacingFields(_ replacement: HTTPFields) -> ResponseHeadCollector {
        var head = ResponseHeadCollector()
        head.status = status
        head.reason = reason
        head.isComplete = isComplete
        for field in replacement {
            // The value's bytes, not `field.value`: a value that is not UTF-8 would come back
            // with U+FFFD in place of each of its obs-text bytes.
            var name = field.name.rawName
            name.withUTF8 { head.storage.append(UnsafeRawBufferPointer($0)) }
            let separator: StaticString = ": "
            head.storage.append(UnsafeRawBufferPointer(start: separator.utf8Start, count: 2))
            field.withUnsafeBytesOfValue { head.storage.append(UnsafeRawBufferPointer($0)) }
            head.looseEnds.append(head.storage.count)
        }
        return head
    }

    /// The same head framed by `Content-Length: length` (a body kept for a script, its own or
    /// the script's replacement: `ResponseEncoder.keptBodyAnswer`): the `Content-Length` and
    /// `Transfer-Encoding` lines left out, the new length last. Not validated, so the encoder
    /// checks every line again.
    ///
    /// `replacedBody`: the body is a script's, not the origin's (`res:set_body`): the fields that
    /// describe the origin's bytes go — `Content-MD5`, `Content-Digest`, `Repr-Digest`, and
    /// `Accept-Ranges` (a range of the origin's body would not match this one) — and a strong
    /// `ETag` is made weak, so that no client resumes or checks this body against the origin's.
    func reframed(length: Int, replacedBody: Bool = false) -> ResponseHeadCollector {
        var head = ResponseHeadCollector()
        head.status = status
        head.reason = reason
        head.isComplete = isComplete
        lines.withUnsafeBufferPointer { buf in
            var start = 0
            for i in 0..<lineCount {
                let end = lineEnd(i)
                defer { start = end }
                var nameEnd = start
                while nameEnd < end, buf[nameEnd] != 0x3A { nameEnd += 1 }
                while nameEnd > start, buf[nameEnd - 1] == 0x20 || buf[nameEnd - 1] == 0x09 { nameEnd -= 1 }
                let name = UnsafeBufferPointer(rebasing: buf[start..<nameEnd])
                switch ResponseEncoder.ResponseField(name) {
                case .contentLength, .transferEncoding: continue
                default: break
                }
                if replacedBody {
                    if Self.describesTheBytes(name) { continue }
                    if ASCII.equalsIgnoringCase(name, "etag") {
                        var v = nameEnd + 1
                        while v < end, buf[v] == 0x20 || buf[v] == 0x09 { v += 1 }
                        if v < end, buf[v] == 0x22 {
                            // `"tag"` becomes `W/"tag"`.
                            let weak: StaticString = "ETag: W/"
                            head.storage.append(UnsafeRawBufferPointer(start: weak.utf8Start, count: weak.utf8CodeUnitCount))
                            head.storage.append(UnsafeRawBufferPointer(rebasing: UnsafeRawBufferPointer(buf)[v..<end]))
                            head.looseEnds.append(head.storage.count)
                            continue
                        }
                    }
                }
                head.storage.append(UnsafeRawBufferPointer(rebasing: UnsafeRawBufferPointer(buf)[start..<end]))
                head.looseEnds.append(head.storage.count)
            }
        }
        var last = "Content-Length: \(length)"
        last.withUTF8 { head.storage.append(UnsafeRawBufferPointer($0)) }
        head.looseEnds.append(head.storage.count)
        return head
    }

    /// The fields about the origin's body bytes that a replaced body drops (`reframed`).
    private static func describesTheBytes(_ name: UnsafeBufferPointer<UInt8>) -> Bool {
        ASCII.equalsIgnoringCase(name, "content-md5") || ASCII.equalsIgnoringCase(name, "content-digest")
            || ASCII.equalsIgnoringCase(name, "repr-digest") || ASCII.equalsIgnoringCase(name, "accept-ranges")
    }

    /// The empty line that ends a validated final head, with what the parser learnt of its
    /// framing fields.
    mutating func completeValidated(framing: ValidatedFraming) {
        validatedFraming = framing
        isComplete = true
    }

    /// Takes one line as libcurl delivers it (with its CRLF or LF). Returns true when it
    /// completed a final head.
    mutating func add(_ line: UnsafeRawBufferPointer) -> Bool {
        var end = line.count
        while end > 0, line[end - 1] == 0x0A || line[end - 1] == 0x0D { end -= 1 }
        if end == 0 {
            // The empty line: an interim (1xx) head ends here and is forgotten at the next
            // status line; a final head is complete.
            if status >= 200 { isComplete = true }
            return isComplete
        }
        if end >= 5, line[0] == 0x48, line[1] == 0x54, line[2] == 0x54, line[3] == 0x50, line[4] == 0x2F {  // "HTTP/"
            reset()
            parseStatusLine(UnsafeRawBufferPointer(rebasing: line[0..<end]))
            return false
        }
        // A field line after the final head is a chunked body's trailer (libcurl passes them
        // through the header callback too): dropped, as the native engine drops them — a head
        // kept until its body is (`read_response_body`) would carry them to the client.
        guard !isComplete else { return false }
        if line[0] == 0x20 || line[0] == 0x09, !looseEnds.isEmpty {
            // obs-fold: joined to the field it continues.
            var s = 0
            while s < end, line[s] == 0x20 || line[s] == 0x09 { s += 1 }
            withUnsafeBytes(of: UInt8(0x20)) { storage.append($0) }
            storage.append(UnsafeRawBufferPointer(rebasing: line[s..<end]))
            looseEnds[looseEnds.count - 1] = storage.count
            return false
        }
        storage.append(UnsafeRawBufferPointer(rebasing: line[0..<end]))
        looseEnds.append(storage.count)
        return false
    }

    /// "HTTP/1.1 200 OK" or "HTTP/2 200": the three digits after the first space, and the
    /// reason after the space that follows them.
    private mutating func parseStatusLine(_ line: UnsafeRawBufferPointer) {
        reason.removeAll(keepingCapacity: true)
        guard let sp = line.firstIndex(of: 0x20) else {
            status = 0
            return
        }
        var i = sp + 1
        var code = 0
        while i < line.count, line[i] >= 0x30, line[i] <= 0x39, code < 1000 {
            code = code * 10 + Int(line[i] - 0x30)
            i += 1
        }
        status = code
        if i + 1 < line.count { reason.append(contentsOf: UnsafeRawBufferPointer(rebasing: line[(i + 1)...])) }
    }

    /// Whether a field's name starts with `ratelimit` or `x-ratelimit` (any case): the fields
    /// `RateLimitLearning` reads besides `Retry-After`. One pass over the first bytes of each
    /// line, so that an answer without them costs no lookups.
    func mentionsRateLimit() -> Bool {
        lines.withUnsafeBufferPointer { buf in
            var start = 0
            for line in 0..<lineCount {
                let end = lineEnd(line)
                defer { start = end }
                var i = start
                if i < end, buf[i] | 0x20 == UInt8(ascii: "x") { i += 2 }
                guard i + 9 <= end else { continue }
                var same = true
                for (k, byte) in "ratelimit".utf8.enumerated() where buf[i + k] | 0x20 != byte {
                    same = false
                    break
                }
                if same { return true }
            }
            return false
        }
    }

    /// The value of the first field named `lowercaseName` (ASCII case-insensitive), trimmed.
    func value(_ lowercaseName: String) -> String? {
        var name = lowercaseName
        return name.withUTF8 { wanted in
            lines.withUnsafeBufferPointer { buf -> String? in
                var start = 0
                for i in 0..<lineCount {
                    let end = lineEnd(i)
                    defer { start = end }
                    let colon = start + wanted.count
                    guard colon < end, buf[colon] == 0x3A else { continue }
                    var same = true
                    for k in 0..<wanted.count where ASCII.lower(buf[start + k]) != wanted[k] {
                        same = false
                        break
                    }
                    guard same else { continue }
                    var v = colon + 1
                    var e = end
                    while v < e, buf[v] == 0x20 || buf[v] == 0x09 { v += 1 }
                    while e > v, buf[e - 1] == 0x20 || buf[e - 1] == 0x09 { e -= 1 }
                    return String(decoding: UnsafeBufferPointer(rebasing: buf[v..<e]), as: UTF8.self)
                }
                return nil
            }
        }
    }

    /// Calls `body` with each field line's name (before its first colon; never empty) and its
    /// value (after the colon, SP and HTAB trimmed from both ends), as the line holds them;
    /// a line without a colon, or with nothing before it, is skipped.
    func forEachField(_ body: (_ name: ArraySlice<UInt8>, _ value: ArraySlice<UInt8>) -> Void) {
        let lines = self.lines
        var start = 0
        for i in 0..<lineCount {
            let end = lineEnd(i)
            defer { start = end }
            guard let colon = lines[start..<end].firstIndex(of: 0x3A), colon > start else { continue }
            var v = colon + 1
            var e = end
            while v < e, lines[v] == 0x20 || lines[v] == 0x09 { v += 1 }
            while e > v, lines[e - 1] == 0x20 || lines[e - 1] == 0x09 { e -= 1 }
            body(lines[start..<colon], lines[v..<e])
        }
    }

    /// The end-to-end fields as `(name, value)` strings, for the shared cache: hop-by-hop
    /// fields (RFC 9110 §7.6.1, and those the `Connection` field names) and `Content-Length`
    /// (a stored body's length is its own) left out; values trimmed, CR, LF and NUL made SP
    /// as the encoder does; a line without a valid name is skipped. Built only when a cache
    /// looks at the response.
    func endToEndFields() -> [(name: String, value: String)] {
        var out: [(name: String, value: String)] = []
        forEachField { name, value in
            guard name.allSatisfy(ASCII.isTokenChar) else { return }
            let scrubbed = value.map { $0 == 0x0D || $0 == 0x0A || $0 == 0 ? 0x20 : $0 }
            out.append((String(decoding: name, as: UTF8.self), String(decoding: scrubbed, as: UTF8.self)))
        }
        let connection = out.filter { $0.name.lowercased() == "connection" }
            .flatMap { $0.value.split(separator: ",").map { $0.filter { $0 != " " && $0 != "\t" }.lowercased() } }
        let dropped = Set([
            "connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade",
            "content-length", "proxy-authenticate",
        ]).union(connection)
        return out.filter { !dropped.contains($0.name.lowercased()) }
    }
}
