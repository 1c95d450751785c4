import SluiceCore

/// The HTTP/1.1 request decoder: a pure value-type state machine over bytes (RFC 9112).
///
/// This is Sluice's security boundary, so it is strict: it rejects bare CR and bare LF,
/// NUL and other control bytes, obs-fold, whitespace before the colon, `Content-Length`
/// together with `Transfer-Encoding`, differing `Content-Length`s, transfer codings other than
/// a lone `chunked`, and oversized lines and sections. A chunked body is read by
/// `ChunkedDecoder`, the decoder `HTTPResponseParser` uses too: sizes of up to 16 hex digits
/// checked against the body limit, extensions and trailer fields validated and dropped. A
/// rejected request is reported as a `ProxyError` and nothing of it is ever forwarded.
///
/// Feed it whatever bytes have arrived — any split, down to one byte at a time — and it
/// returns how many it consumed and at most one event. Body events are ranges of the input
/// buffer just passed, so the caller moves body bytes without an intermediate copy.
/// A request with a body ends with an `.end` event (delivered by the call after its last body
/// byte, which may consume nothing); a request without one is complete with its `.head`.
/// Either way the parser is then ready for the next (pipelined) request.
public struct HTTPRequestParser: Sendable {
    public enum Event: Sendable, Equatable {
        case head(HTTPRequestHead)
        case body(Range<Int>)
        case end

        public static func == (a: Event, b: Event) -> Bool {
            switch (a, b) {
            case (.head(let x), .head(let y)): return x.bytes == y.bytes
            case (.body(let x), .body(let y)): return x == y
            case (.end, .end): return true
            default: return false
            }
        }
    }

    public struct Limits: Sendable {
        public var requestLine: Int
        public var headerSection: Int
        public var headerCount: Int
        public var body: Int64?
        public init(requestLine: Int, headerSection: Int, headerCount: Int, body: Int64?) {
            self.requestLine = requestLine
            self.headerSection = headerSection
            self.headerCount = headerCount
            self.body = body
        }
        public init(_ limits: ServerConfiguration.Limits) {
            self.init(
                requestLine: limits.requestLine, headerSection: limits.headerSection,
                headerCount: limits.headerCount, body: limits.requestBody)
        }
    }

    enum State: Sendable {
        case head
        case fixedBody(remaining: Int64)
        /// A chunked body, read by `chunked`.
        case chunked
        case end
        case failed(ProxyError)
    }

    /// Empty lines tolerated before a request line (RFC 9112 §2.2 asks for at least one).
    static let maxLeadingEmptyLines = 8

    public let limits: Limits
    var state: State = .head
    var headBytes: [UInt8] = []
    /// How many bytes of "\r\n\r\n" the head scanner has matched so far.
    var terminatorMatch = 0
    var requestLineLength: Int? = nil
    var leadingEmptyLines = 0
    /// The current request's chunked body, fresh for each one (`State.chunked`).
    var chunked: ChunkedDecoder

    public init(limits: Limits) {
        self.limits = limits
        chunked = ChunkedDecoder(rules: Self.chunkedRules(limits))
    }

    /// A request's chunked body: sizes of up to 16 hex digits, each compared with the room
    /// left under `limits.body`; a trailer section bounded like the head (`headerSection`
    /// bytes), any number of trailer fields within it.
    static func chunkedRules(_ limits: Limits) -> ChunkedDecoder.Rules {
        ChunkedDecoder.Rules(sizeDigits: 16, body: limits.body, trailerSection: limits.headerSection, trailerFields: nil)
    }

    /// True between `.end` and the first byte of the next request's head.
    public var isIdle: Bool {
        if case .head = state { return headBytes.isEmpty && terminatorMatch == 0 }
        return false
    }

    /// Consumes bytes from `input` and returns how many, with the event they completed.
    /// A thrown error is final: the connection must answer it and close.
    public mutating func parse(_ input: UnsafeRawBufferPointer) throws(ProxyError) -> (consumed: Int, event: Event?) {
        switch state {
        case .failed(let error):
            throw error
        case .end:
            state = .head
            resetHead()
            return (0, .end)
        case .head:
            return try guarded { (p: inout HTTPRequestParser) throws(ProxyError) in try p.parseHead(input) }
        default:
            return try guarded { (p: inout HTTPRequestParser) throws(ProxyError) in try p.parseBody(input) }
        }
    }

    private mutating func guarded(
        _ body: (inout HTTPRequestParser) throws(ProxyError) -> (Int, Event?)
    ) throws(ProxyError) -> (consumed: Int, event: Event?) {
        do {
            let (consumed, event) = try body(&self)
            return (consumed, event)
        } catch {
            state = .failed(error)
            throw error
        }
    }

    private mutating func resetHead() {
        headBytes = []
        terminatorMatch = 0
        requestLineLength = nil
        leadingEmptyLines = 0
    }

    // MARK: head

    private mutating func parseHead(_ input: UnsafeRawBufferPointer) throws(ProxyError) -> (Int, Event?) {
        if headBytes.isEmpty, terminatorMatch == 0, requestLineLength == nil, let end = wholeHead(input) {
            // The common head: whole in the input, every line end a CRLF, within the limits.
            return (end, .head(try headComplete(Array(UnsafeRawBufferPointer(rebasing: input[0..<end])))))
        }
        var i = 0
        var segmentStart = 0
        while i < input.count {
            if terminatorMatch == 0 {
                // Bytes other than CR and LF only lengthen the line: skip them, eight at a
                // time, and check the limits once for all of them (they grow with every byte,
                // so the first byte past a limit and the last skipped one fail alike).
                let from = i
                i = SWAR.lineEnd(input, from: i)
                if i > from { try checkLength(headBytes.count + (i - segmentStart)) }
                if i == input.count { break }
            }
            let b = input[i]
            i += 1
            switch (terminatorMatch, b) {
            case (0, 0x0D), (2, 0x0D):
                terminatorMatch += 1
            case (1, 0x0A), (3, 0x0A):
                terminatorMatch += 1
            case (1, _), (3, _):
                throw .malformedRequest("bare CR in request head")
            case (_, 0x0A):
                throw .malformedRequest("bare LF in request head")
            default:
                terminatorMatch = 0
            }
            let length = headBytes.count + (i - segmentStart)
            if terminatorMatch == 2 && requestLineLength == nil {
                if length == 2 {
                    // An empty line before the request line: tolerated, not stored.
                    leadingEmptyLines += 1
                    if leadingEmptyLines > Self.maxLeadingEmptyLines {
                        throw .malformedRequest("too many empty lines before the request line")
                    }
                    headBytes.removeAll(keepingCapacity: true)
                    segmentStart = i
                    terminatorMatch = 0
                    continue
                }
                requestLineLength = length
                if length - 2 > limits.requestLine { throw .requestLineTooLong(limit: limits.requestLine) }
            }
            try checkLength(length)
            if terminatorMatch == 4 {
                headBytes.append(contentsOf: UnsafeRawBufferPointer(rebasing: input[segmentStart..<i]))
                // The bytes go to the head; the parser keeps no buffer between requests (an
                // idle connection holds none, and emptying a buffer the head shares would
                // allocate a new one).
                var bytes: [UInt8] = []
                swap(&bytes, &headBytes)
                return (i, .head(try headComplete(bytes)))
            }
        }
        headBytes.append(contentsOf: UnsafeRawBufferPointer(rebasing: input[segmentStart..<i]))
        return (i, nil)
    }

    /// Where a head that lies whole at the start of `input` ends (past its empty line), when
    /// the byte scan above would take all of it without a complaint: a request line that is
    /// not empty and within `limits.requestLine`, every line ended by CRLF (no bare CR or
    /// LF), the field lines and the final CRLF within `limits.headerSection`. nil for anything
    /// else — a head cut by the end of the input, an empty line before the request line, any
    /// byte the scan would refuse — and the scan reads it from the start, as it always did.
    /// One step a line (`SWAR.lineEnd`) where the scan takes several a line end.
    private func wholeHead(_ input: UnsafeRawBufferPointer) -> Int? {
        var lineStart = 0
        var requestLineEnd = 0  // past the request line's CRLF, once it is seen
        while true {
            let cr = SWAR.lineEnd(input, from: lineStart)
            guard cr + 1 < input.count, input[cr] == 0x0D, input[cr + 1] == 0x0A else { return nil }
            let next = cr + 2
            if requestLineEnd == 0 {
                guard cr > 0, cr <= limits.requestLine else { return nil }
                requestLineEnd = next
            } else {
                guard next - requestLineEnd <= limits.headerSection else { return nil }
                if cr == lineStart { return next }
            }
            lineStart = next
        }
    }

    /// A complete head's bytes, parsed; the parser set for what follows it (a request without
    /// a body is complete with its head: no `.end` follows).
    private mutating func headComplete(_ bytes: [UInt8]) throws(ProxyError) -> HTTPRequestHead {
        let head = try Self.parseHeadBytes(bytes, limits: limits)
        switch head.framing {
        case .none: resetHead()
        case .length(let n): if n == 0 { resetHead() } else { state = .fixedBody(remaining: n) }
        case .chunked:
            chunked = ChunkedDecoder(rules: Self.chunkedRules(limits))
            state = .chunked
        }
        terminatorMatch = 0
        return head
    }

    /// Refuses a head of `length` bytes so far when its request line or its field section is
    /// over the limit.
    @inline(__always)
    private func checkLength(_ length: Int) throws(ProxyError) {
        if let requestLineLength {
            if length - requestLineLength > limits.headerSection {
                throw .headerSectionTooLarge(limit: limits.headerSection)
            }
        } else if length > limits.requestLine + 2 {
            throw .requestLineTooLong(limit: limits.requestLine)
        }
    }

    /// Parses a complete head (request line, fields, final empty line) already known to
    /// contain only CRLF line ends.
    static func parseHeadBytes(_ bytes: [UInt8], limits: Limits) throws(ProxyError) -> HTTPRequestHead {
        var headResult: HTTPRequestHead?
        var failure: ProxyError?
        bytes.withUnsafeBufferPointer { buf in
            do throws(ProxyError) {
                headResult = try parseHead(buf, bytes: bytes, limits: limits)
            } catch {
                failure = error
            }
        }
        if let failure { throw failure }
        return headResult!
    }

    private static func parseHead(
        _ buf: UnsafeBufferPointer<UInt8>, bytes: [UInt8],
        limits: Limits
    ) throws(ProxyError) -> HTTPRequestHead {
        // Request line: method SP request-target SP HTTP-version CRLF (exactly single spaces).
        guard let start = buf.baseAddress else { throw .malformedRequest("malformed request line (method)") }
        var i = ASCII.tokenEnd(start, from: 0, count: buf.count)
        let methodRange = 0..<i
        guard !methodRange.isEmpty, i < buf.count, buf[i] == 0x20 else {
            throw .malformedRequest("malformed request line (method)")
        }
        i += 1
        let targetStart = i
        // Eight bytes at a time up to the word holding SP (or any other byte a target lacks).
        do {
            let base = UnsafeRawPointer(start)
            while i + 8 <= buf.count {
                let word = SWAR.load(base + i)
                if SWAR.below(0x21, word) | SWAR.equal(0x7F, word) | word & 0x8080_8080_8080_8080 != 0 { break }
                i += 8
            }
        }
        while i < buf.count, buf[i] > 0x20, buf[i] < 0x7F { i += 1 }
        let targetRange = targetStart..<i
        guard !targetRange.isEmpty, i < buf.count, buf[i] == 0x20 else {
            throw .malformedRequest("malformed request line (target)")
        }
        i += 1
        guard i + 10 <= buf.count,
            buf[i] == 0x48, buf[i + 1] == 0x54, buf[i + 2] == 0x54, buf[i + 3] == 0x50, buf[i + 4] == 0x2F,
            (0x30...0x39).contains(buf[i + 5]), buf[i + 6] == 0x2E, (0x30...0x39).contains(buf[i + 7]),
            buf[i + 8] == 0x0D, buf[i + 9] == 0x0A
        else { throw .malformedRequest("malformed request line (version)") }
        let major = Int(buf[i + 5] - 0x30)
        let minor = Int(buf[i + 7] - 0x30)
        guard major == 1, minor <= 1 else { throw .unsupportedVersion }
        i += 10

        var fields: [HTTPRequestHead.Field] = []
        fields.reserveCapacity(16)
        var contentLength: Int64?
        var transferCodings: [String] = []
        var sawTransferEncoding = false
        var connectionTokens: [String] = []
        var expectsContinue = false
        var hostCount = 0

        while i < buf.count {
            if buf[i] == 0x0D { break }  // the final empty line
            if buf[i] == 0x20 || buf[i] == 0x09 { throw .malformedRequest("obsolete line folding in header") }
            let nameStart = i
            i = ASCII.tokenEnd(start, from: i, count: buf.count)
            guard i > nameStart, i < buf.count, buf[i] == 0x3A else {
                throw .malformedRequest("malformed header field name")
            }
            let nameRange = nameStart..<i
            i += 1
            while i < buf.count, buf[i] == 0x20 || buf[i] == 0x09 { i += 1 }
            let valueStart = i
            // Eight bytes at a time up to the word holding the CR (or any other control byte).
            while i + 8 <= buf.count, SWAR.controlOrDEL(SWAR.load(UnsafeRawPointer(start + i))) == 0 { i += 8 }
            while i < buf.count, buf[i] != 0x0D {
                guard ASCII.isFieldValueByte(buf[i]) else {
                    throw .malformedRequest("control character in header field value")
                }
                i += 1
            }
            var valueEnd = i
            while valueEnd > valueStart, buf[valueEnd - 1] == 0x20 || buf[valueEnd - 1] == 0x09 { valueEnd -= 1 }
            i += 2  // CRLF, guaranteed by the scanner
            let field = HTTPRequestHead.Field(name: nameRange, value: valueStart..<valueEnd)
            fields.append(field)
            if fields.count > limits.headerCount { throw .tooManyHeaders(limit: limits.headerCount) }

            let name = UnsafeBufferPointer(rebasing: buf[nameRange])
            let value = UnsafeBufferPointer(rebasing: buf[valueStart..<valueEnd])
            switch name.count {
            case 4 where ASCII.equalsIgnoringCase(name, "host"):
                hostCount += 1
                // An authority: reg-name or IP literal and a port; never userinfo or a path.
                for b in value {
                    switch b {
                    case 0x40, 0x2F, 0x5C, 0x3F, 0x23, 0x20, 0x09: throw .malformedRequest("invalid Host header")
                    default: continue
                    }
                }
            case 6 where ASCII.equalsIgnoringCase(name, "expect"):
                if ASCII.equalsIgnoringCase(value, "100-continue") { expectsContinue = true }
            case 10 where ASCII.equalsIgnoringCase(name, "connection"):
                for token in listElements(value) { connectionTokens.append(token.lowercased()) }
            case 14 where ASCII.equalsIgnoringCase(name, "content-length"):
                for element in listElements(value, keepEmpty: true) {
                    guard !element.isEmpty, element.count <= 18, element.utf8.allSatisfy({ $0 >= 48 && $0 <= 57 }),
                        let n = Int64(element)
                    else { throw .malformedRequest("invalid Content-Length") }
                    if let previous = contentLength, previous != n {
                        throw .malformedRequest("differing Content-Length values")
                    }
                    contentLength = n
                }
            case 17 where ASCII.equalsIgnoringCase(name, "transfer-encoding"):
                sawTransferEncoding = true
                for coding in listElements(value, keepEmpty: true) { transferCodings.append(coding.lowercased()) }
            default:
                break
            }
        }

        if minor == 1 && hostCount != 1 {
            throw .malformedRequest(hostCount == 0 ? "missing Host header" : "more than one Host header")
        }
        if hostCount > 1 { throw .malformedRequest("more than one Host header") }

        let framing: HTTPRequestHead.BodyFraming
        if sawTransferEncoding {
            if contentLength != nil { throw .malformedRequest("both Content-Length and Transfer-Encoding") }
            if minor == 0 { throw .malformedRequest("Transfer-Encoding in an HTTP/1.0 request") }
            guard transferCodings == ["chunked"] else {
                throw .unsupportedTransferCoding(transferCodings.joined(separator: ", "))
            }
            framing = .chunked
        } else if let n = contentLength {
            if let max = limits.body, n > max { throw .bodyTooLarge(limit: max) }
            framing = .length(n)
        } else {
            framing = .none
        }

        return HTTPRequestHead(
            bytes: bytes, methodRange: methodRange, targetRange: targetRange,
            minorVersion: minor, fields: fields, framing: framing,
            connectionTokens: connectionTokens, expectsContinue: expectsContinue)
    }

    /// The comma-separated elements of a list-valued field, with optional whitespace trimmed.
    static func listElements(_ value: UnsafeBufferPointer<UInt8>, keepEmpty: Bool = false) -> [String] {
        var out: [String] = []
        var start = 0
        for i in 0...value.count where i == value.count || value[i] == 0x2C {
            var s = start
            var e = i
            while s < e, value[s] == 0x20 || value[s] == 0x09 { s += 1 }
            while e > s, value[e - 1] == 0x20 || value[e - 1] == 0x09 { e -= 1 }
            if e > s || keepEmpty { out.append(String(decoding: UnsafeBufferPointer(rebasing: value[s..<e]), as: UTF8.self)) }
            start = i + 1
        }
        return out
    }

    // MARK: body

    private mutating func parseBody(_ input: UnsafeRawBufferPointer) throws(ProxyError) -> (Int, Event?) {
        guard !input.isEmpty else { return (0, nil) }
        switch state {
        case .fixedBody(let remaining):
            let n = Int(min(Int64(input.count), remaining))
            state = remaining - Int64(n) == 0 ? .end : .fixedBody(remaining: remaining - Int64(n))
            return (n, .body(0..<n))
        case .chunked:
            do throws(ChunkedDecoder.Failure) {
                switch try chunked.decode(input) {
                case (let n, .data(let range)?):
                    return (n, .body(range))
                case (let n, .end?):
                    // `.end` comes from the next call, which consumes nothing.
                    state = .end
                    return (n, nil)
                case (let n, nil):
                    return (n, nil)
                }
            } catch {
                throw requestError(error)
            }
        case .head, .end, .failed:
            return (0, nil)
        }
    }

    /// A refused chunked body as the `ProxyError` the client is answered with, worded as this
    /// parser always worded it: the limits map to their own statuses (413, 431), and every
    /// malformed trailer line is "invalid trailer".
    private func requestError(_ failure: ChunkedDecoder.Failure) -> ProxyError {
        switch failure {
        case .bodyTooLarge(let limit): return .bodyTooLarge(limit: limit)
        case .trailerSectionTooLarge(let limit): return .headerSectionTooLarge(limit: limit)
        case .tooManyTrailerFields(let limit): return .tooManyHeaders(limit: limit)
        case .sizeTooLarge: return .malformedRequest("invalid chunk size")
        case .bareCRInSizeLine: return .malformedRequest("bare CR in chunk-size line")
        case .bareCRInTrailer: return .malformedRequest("bare CR in trailer")
        case .trailerLineFolding: return .malformedRequest("obsolete line folding in trailer")
        case .bareLFInTrailer, .trailerFieldWithoutColon, .trailerWhitespaceBeforeColon, .trailerInvalidNameCharacter,
            .trailerEmptyName, .trailerControlCharacter:
            return .malformedRequest("invalid trailer")
        case .invalidSize, .sizeLineTooLong, .invalidExtension, .missingCRLFAfterData:
            return .malformedRequest(failure.reason)
        }
    }
}
