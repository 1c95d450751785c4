import SluiceCore

/// The HTTP/1.1 response decoder of Sluice's native upstream transport (its own HTTP/1.1
/// client for plain-http origins): a value-type state machine over bytes (RFC 9112), the twin
/// of `HTTPRequestParser`.
///
/// It is a security boundary — a bad upstream response must never produce bytes a client
/// could frame differently — so it is strict. It accepts a status line of exactly
/// `HTTP/1.1` or `HTTP/1.0`, SP, a status code 100–599 and an optional SP and reason (HTAB,
/// SP, VCHAR, obs-text); field lines of a token name, a colon and a value of HTAB, SP,
/// VCHAR and obs-text; lines ended by CRLF. It refuses bare CR and bare LF, NUL and other
/// control bytes, obs-fold, whitespace before the colon, an empty status line, heads over
/// `limits.headerSection` bytes or `limits.headerCount` fields, more than
/// `limits.interimResponses` 1xx heads, `101` (upgrades go through `UpgradeTransfer`),
/// `Content-Length` together with `Transfer-Encoding`, `Transfer-Encoding` in an HTTP/1.0
/// response, `chunked` twice or not last, and `Content-Length`s that are not all the same
/// digit string (at most 18 digits). A chunked body is read by `ChunkedDecoder`, the decoder
/// `HTTPRequestParser` uses too, with chunk sizes of at most 15 hex digits. A refusal is
/// thrown as a `Failure` and is final.
///
/// Interim (1xx) heads are validated and reported as `.interim`, their fields in `head` until
/// the next status line (the transfer forwards them to the client). The framing of the
/// final head follows RFC 9112 §6.3: a response to HEAD, `204` and `304` have no body
/// (`.none`); a `Transfer-Encoding` whose last coding is `chunked` is `.chunked`, any other
/// `Transfer-Encoding` is `.close`; then `Content-Length` is `.length(n)`; else `.close`. The
/// framing checks apply to every final head, bodiless ones included. Chunked trailer fields
/// are validated like header fields, bounded by the same limits, and dropped (a malformed
/// trailer line is refused at its first offending byte).
///
/// The event contract, for `parse`:
/// - A call returns at most one event. A call that returns no event has consumed its whole
///   input, or consumed nothing because the response is over (after `.end`) or the input was
///   empty. So: call again while a call returns an event (also with an empty buffer), then
///   wait for more bytes.
/// - Any split of the bytes, down to one byte at a time, gives the same events (`.body`
///   ranges aside, which follow the pieces), ending at the same offsets, and the same
///   `Failure` at the same byte.
/// - `.interim` and `.head` come from the call that consumed the head's final LF.
/// - `.end` comes:
///   - for `.none` and `.length(0)`: from the call right after `.head`, consuming 0 bytes;
///   - for `.length(n)`: from the call right after the one that returned the last `.body`,
///     consuming 0 bytes;
///   - for `.chunked`: from the call that consumed the final LF of the trailer section
///     (consuming > 0 bytes; the last `.body` came from an earlier call);
///   - for `.close`: from `finish()`.
///   In each case, no byte after the end of the response is consumed.
/// - After `.end`, `parse` returns `(0, nil)` until `expectResponse` is called. Bytes that
///   arrive then (or after a bodiless response) are not part of any response: the caller must
///   not reuse that connection.
///
/// Threading: a value owned by one upstream connection (or transfer), on its worker's thread.
/// Buffers (the line being read, the collected head) keep their capacity from response to
/// response, so a pooled parser reads heads without allocating.
struct HTTPResponseParser {
    struct Failure: Error, Equatable {
        /// Short human text, e.g. "Content-Length together with Transfer-Encoding".
        let reason: String
    }

    enum BodyFraming: Equatable {
        case none
        case length(Int64)
        case chunked
        /// The body ends when the origin closes the connection (`finish()`).
        case close
    }

    enum Event: Equatable {
        /// A 1xx head (not 101) was read (its fields are in `head` until the next status
        /// line); parsing goes on with the next head.
        case interim(status: Int)
        /// The final head is complete: read it from `head`, `keepAlive` and `minorVersion`.
        case head(BodyFraming)
        /// Decoded body bytes: a range of the input buffer just passed (never empty).
        case body(Range<Int>)
        /// The response is complete (see the type's comment for which call delivers it).
        case end
    }

    struct Limits {
        /// The largest head (status line, field lines, the final empty line, with their CRLFs),
        /// for each interim and the final head; also the largest chunked trailer section.
        var headerSection: Int
        /// The most field lines in one head (and in the trailer section).
        var headerCount: Int
        /// The most 1xx heads before the final one.
        var interimResponses: Int

        static let `default` = Limits(headerSection: 64 * 1024, headerCount: 100, interimResponses: 16)
    }

    private enum State {
        /// Reading a head: its status line (`statusSeen` false) or its field lines.
        case head
        case fixedBody(remaining: Int64)
        case closeBody
        /// A chunked body, trailer section included, read by `chunked`.
        case chunked
        /// The response is complete; the next `parse` returns `.end`.
        case endPending
        /// `.end` was delivered; nothing more until `expectResponse`.
        case done
        case failed(Failure)
    }

    /// What the final head's fields say about framing and persistence.
    private struct FieldFacts {
        var contentLength: Int64? = nil
        var contentLengthDigits = 0
        var sawTransferEncoding = false
        var sawChunked = false
        var chunkedIsLast = false
        var connectionClose = false
        var connectionKeepAlive = false
        var connectionNamesFields = false
    }

    let limits: Limits

    /// The final head, filled through `ResponseHeadCollector.add` after validation. Reset
    /// (capacity kept) at `expectResponse`. Complete once `.head` was returned.
    private(set) var head = ResponseHeadCollector()

    /// Forwards `replacement` instead of the head that was parsed (a script's header edits,
    /// with the same status and framing fields); the body is still read by the parsed framing.
    mutating func replaceHead(_ replacement: ResponseHeadCollector) { head = replacement }
    /// After `.head`: the connection may be reused for another request once `.end` arrives —
    /// HTTP/1.1 without `Connection: close`, or HTTP/1.0 with `Connection: keep-alive` — and
    /// the framing is not `.close`.
    private(set) var keepAlive = false
    /// After `.head`: 0 or 1, the minor version of the final status line.
    private(set) var minorVersion = 1

    private var state = State.head
    /// The current response's chunked body, fresh for each one (`State.chunked`).
    private var chunked: ChunkedDecoder
    private var headRequest = false
    private var started = false

    /// The current head line so far (without its CRLF once complete).
    private var line: [UInt8] = []
    /// The last byte scanned was a CR (the line's end needs its LF next).
    private var lineSawCR = false
    /// Bytes of the current head so far, CRLFs included.
    private var sectionBytes = 0
    /// Field lines of the current head.
    private var fieldCount = 0
    /// The current head's status line was read.
    private var statusSeen = false
    private var status = 0
    private var headMinor = 1
    private var interimCount = 0
    private var facts = FieldFacts()

    init(limits: Limits = .default) {
        self.limits = limits
        chunked = ChunkedDecoder(rules: Self.chunkedRules(limits))
        line.reserveCapacity(256)
    }

    /// A response's chunked body: sizes of at most 15 hex digits (there is no body limit, and
    /// 15 keep every size far from overflow); a trailer section bounded like a head.
    static func chunkedRules(_ limits: Limits) -> ChunkedDecoder.Rules {
        ChunkedDecoder.Rules(
            sizeDigits: 15, body: nil, trailerSection: limits.headerSection, trailerFields: limits.headerCount)
    }

    /// True once any byte of the current response was consumed (or refused): a failure with
    /// this false means the connection ended before the origin answered at all.
    var hasStarted: Bool { started }

    /// Prepares for the next response on the connection; called before each request is sent.
    /// `headRequest`: the request is HEAD, so its response has no body whatever its fields say.
    /// Resets everything, a failure included, keeping the buffers' capacity: the parser may be
    /// pooled and used for another connection, but a connection whose parser failed (or that
    /// received bytes after `.end`) must be closed, never given another request.
    mutating func expectResponse(headRequest: Bool) {
        self.headRequest = headRequest
        state = .head
        started = false
        head.reset()
        keepAlive = false
        minorVersion = 1
        if !line.isEmpty { line.removeAll(keepingCapacity: true) }
        lineSawCR = false
        sectionBytes = 0
        fieldCount = 0
        statusSeen = false
        status = 0
        headMinor = 1
        interimCount = 0
        facts = FieldFacts()
    }

    /// Consumes bytes from `input` and returns how many, with at most one event (the
    /// contract is in the type's comment). A thrown `Failure` is final: every later call (and
    /// `finish()`) throws it again, until `expectResponse`.
    mutating func parse(_ input: UnsafeRawBufferPointer) throws(Failure) -> (consumed: Int, event: Event?) {
        switch state {
        case .failed(let failure):
            throw failure
        case .done:
            return (0, nil)
        case .endPending:
            state = .done
            return (0, .end)
        default:
            break
        }
        if input.isEmpty { return (0, nil) }
        started = true
        do throws(Failure) {
            if case .head = state { return try scanLines(input) }
            return try parseBody(input)
        } catch {
            state = .failed(error)
            throw error
        }
    }

    /// The connection reached EOF. Returns `.end` when that completes the response (a
    /// close-delimited body, or a response whose `.end` was not yet fetched), nil when
    /// nothing of a response had started or the response had already ended (an idle
    /// connection closed); throws otherwise.
    mutating func finish() throws(Failure) -> Event? {
        let failure: Failure
        switch state {
        case .failed(let f):
            throw f
        case .done:
            return nil
        case .endPending, .closeBody:
            state = .done
            return .end
        case .head:
            if !started {
                state = .done
                return nil
            }
            failure = Failure(reason: "connection closed inside the response head")
        case .fixedBody:
            failure = Failure(reason: "connection closed before the response ended")
        case .chunked:
            failure = Failure(reason: "truncated chunked body")
        }
        state = .failed(failure)
        throw failure
    }

    // MARK: head lines

    /// Splits `input` into CRLF-ended lines (refusing bare CR and bare LF), bounded by
    /// `limits.headerSection`, and hands each complete line to the head logic.
    /// Line ends are found eight bytes at a time (`SWAR`), not byte by byte;
    /// whatever the split, the first offending byte decides the failure, as a byte-by-byte
    /// scan would: the byte past the limit, a bare LF, or a CR not followed by LF.
    private mutating func scanLines(_ input: UnsafeRawBufferPointer) throws(Failure) -> (Int, Event?) {
        guard input.count > 0 else { return (0, nil) }
        var i = 0
        while i < input.count {
            if lineSawCR {
                // The last segment ended with a CR: this byte must be its LF.
                try count(1)
                guard input[i] == 0x0A else { throw Failure(reason: "bare CR in the response head") }
                i += 1
                lineSawCR = false
                line.removeLast()  // the CR
                if let event = try completeLine() { return (i, event) }
                continue
            }
            if statusSeen && line.isEmpty, let field = Self.wholeFieldLine(input, from: i) {
                // The common line: a valid field line whole in `input`, read in one pass.
                try count(field.end - i + 2)
                let l = UnsafeRawBufferPointer(rebasing: input[i..<field.end]).assumingMemoryBound(to: UInt8.self)
                try self.field(l, name: field.name, value: field.value)
                i = field.end + 2
                continue
            }
            let cr = SWAR.lineEnd(input, from: i)
            if cr < input.count && input[cr] == 0x0A {
                // The first line end is an LF without its CR.
                try count(cr - i)
                try count(1)
                throw Failure(reason: "bare LF in the response head")
            }
            if cr == input.count {
                try count(cr - i)
                line.append(contentsOf: UnsafeRawBufferPointer(rebasing: input[i..<cr]))
                return (cr, nil)
            }
            if line.isEmpty && cr + 1 < input.count && input[cr + 1] == 0x0A {
                // The whole line is in `input`: handed over where it lies, not copied to `line`.
                try count(cr - i + 2)
                let event = try headLine(UnsafeRawBufferPointer(rebasing: input[i..<cr]).assumingMemoryBound(to: UInt8.self))
                i = cr + 2
                if let event { return (i, event) }
                continue
            }
            try count(cr - i + 1)  // the segment and its CR
            line.append(contentsOf: UnsafeRawBufferPointer(rebasing: input[i...cr]))
            lineSawCR = true
            i = cr + 1
        }
        return (i, nil)
    }

    /// Counts `n` more bytes of the head against the limit.
    private mutating func count(_ n: Int) throws(Failure) {
        sectionBytes += n
        if sectionBytes > limits.headerSection {
            throw Failure(reason: "response head larger than \(limits.headerSection) bytes")
        }
    }

    /// Hands the line collected in `line` (without its CRLF) to the head logic, by value
    /// without a copy, and takes its storage back.
    private mutating func completeLine() throws(Failure) -> Event? {
        var complete: [UInt8] = []
        swap(&complete, &line)
        defer {
            complete.removeAll(keepingCapacity: true)
            swap(&complete, &line)
        }
        return try complete.withUnsafeBufferPointer { (l) throws(Failure) in try headLine(l) }
    }

    /// One head line, without its CRLF: in `line` when it came in pieces, else in the input.
    private mutating func headLine(_ l: UnsafeBufferPointer<UInt8>) throws(Failure) -> Event? {
        if !statusSeen {
            try statusLine(l)
            return nil
        }
        if l.isEmpty { return try endOfHead() }
        let (name, value) = try Self.fieldLine(l)
        try field(l, name: name, value: value)
        return nil
    }

    /// A field line `fieldLine` (or `wholeFieldLine`) found valid, with its name and value:
    /// counted, interpreted and collected.
    @inline(__always)
    private mutating func field(_ l: UnsafeBufferPointer<UInt8>, name: Range<Int>, value: Range<Int>) throws(Failure) {
        fieldCount += 1
        if fieldCount > limits.headerCount {
            throw Failure(reason: "more than \(limits.headerCount) header fields")
        }
        guard status >= 200 else {
            // An interim head's fields are validated and kept for the transfer to forward; they
            // say nothing about the final response's framing.
            let kind = ResponseEncoder.ResponseField(UnsafeBufferPointer(rebasing: l[name]))
            head.addValidated(UnsafeRawBufferPointer(l), name: name, value: value, kind: kind)
            return
        }
        let kind = try interpret(l, name: name, value: value)
        head.addValidated(UnsafeRawBufferPointer(l), name: name, value: value, kind: kind)
    }

    /// `HTTP/1.x SP 3DIGIT [ SP reason ]`.
    private mutating func statusLine(_ l: UnsafeBufferPointer<UInt8>) throws(Failure) {
        if l.isEmpty { throw Failure(reason: "empty line where a status line was expected") }
        guard l.count >= 12, l[0] == 0x48, l[1] == 0x54, l[2] == 0x54, l[3] == 0x50, l[4] == 0x2F,  // "HTTP/"
            l[5] == 0x31, l[6] == 0x2E, l[7] == 0x30 || l[7] == 0x31, l[8] == 0x20  // "1.0 " or "1.1 "
        else { throw Failure(reason: "malformed status line (version)") }
        guard Self.isDigit(l[9]), Self.isDigit(l[10]), Self.isDigit(l[11]), l.count == 12 || l[12] == 0x20 else {
            throw Failure(reason: "malformed status line (status code)")
        }
        let code = Int(l[9] - 0x30) * 100 + Int(l[10] - 0x30) * 10 + Int(l[11] - 0x30)
        guard code >= 100 && code <= 599 else { throw Failure(reason: "status code \(code) out of range") }
        for k in min(13, l.count)..<l.count where !(l[k] == 0x09 || (l[k] >= 0x20 && l[k] != 0x7F)) {
            throw Failure(reason: "control character in the reason phrase")
        }
        if code == 101 { throw Failure(reason: "101 Switching Protocols without an upgrade request") }
        if code < 200 {
            interimCount += 1
            if interimCount > limits.interimResponses {
                throw Failure(reason: "1xx flood: more than \(limits.interimResponses) interim responses")
            }
        }
        status = code
        headMinor = Int(l[7] - 0x30)
        statusSeen = true
        fieldCount = 0
        facts = FieldFacts()
        head.beginValidated(status: code, reason: UnsafeRawBufferPointer(UnsafeBufferPointer(rebasing: l[min(13, l.count)...])))
    }

    /// The empty line: an interim head is reported (its fields stay in `head` until the next
    /// status line); a final head decides the framing.
    private mutating func endOfHead() throws(Failure) -> Event {
        if status < 200 {
            statusSeen = false
            sectionBytes = 0
            return .interim(status: status)
        }
        let framing: BodyFraming
        if facts.sawTransferEncoding && facts.contentLength != nil {
            throw Failure(reason: "Content-Length together with Transfer-Encoding")
        }
        if facts.sawTransferEncoding && headMinor == 0 {
            throw Failure(reason: "Transfer-Encoding in an HTTP/1.0 response")
        }
        if headRequest || status == 204 || status == 304 {
            framing = .none
        } else if facts.sawTransferEncoding {
            // RFC 9112 §6.3: a final coding other than chunked is read until the close.
            framing = facts.chunkedIsLast ? .chunked : .close
        } else if let n = facts.contentLength {
            framing = .length(n)
        } else {
            framing = .close
        }
        head.completeValidated(
            framing: ResponseHeadCollector.ValidatedFraming(
                contentLength: facts.contentLength.map { UInt64($0) }, transferEncoding: facts.sawTransferEncoding,
                connectionClose: facts.connectionClose, connectionNamesFields: facts.connectionNamesFields))
        minorVersion = headMinor
        let persistent = headMinor == 1 ? !facts.connectionClose : facts.connectionKeepAlive && !facts.connectionClose
        keepAlive = persistent && framing != .close
        switch framing {
        case .none, .length(0): state = .endPending
        case .length(let n): state = .fixedBody(remaining: n)
        case .chunked:
            chunked = ChunkedDecoder(rules: Self.chunkedRules(limits))
            state = .chunked
        case .close: state = .closeBody
        }
        return .head(framing)
    }

    /// Validates a field line: `token ":" OWS value OWS` with value bytes HTAB, SP, VCHAR and
    /// obs-text. Returns the name and the trimmed value.
    private static func fieldLine(_ l: UnsafeBufferPointer<UInt8>) throws(Failure) -> (name: Range<Int>, value: Range<Int>) {
        // `l` is not empty (the empty line ends the head).
        var i = 0
        while i < l.count, ASCII.isTokenChar(l[i]) { i += 1 }
        if l[0] == 0x20 || l[0] == 0x09 { throw Failure(reason: "obsolete line folding in a header field") }
        guard i < l.count else { throw Failure(reason: "header field line without a colon") }
        if l[i] == 0x20 || l[i] == 0x09 { throw Failure(reason: "whitespace between a header field name and the colon") }
        guard l[i] == 0x3A else { throw Failure(reason: "invalid character in a header field name") }
        guard i > 0 else { throw Failure(reason: "empty header field name") }
        let name = 0..<i
        i += 1
        while i < l.count, l[i] == 0x20 || l[i] == 0x09 { i += 1 }
        let valueStart = i
        // Eight bytes at a time up to the word holding a control byte or DEL, if any.
        if let base = l.baseAddress {
            while i + 8 <= l.count, SWAR.controlOrDEL(SWAR.load(base + i)) == 0 { i += 8 }
        }
        while i < l.count {
            let b = l[i]
            if b < 0x20 && b != 0x09 || b == 0x7F {
                throw Failure(reason: "NUL or control character in a header field value")
            }
            i += 1
        }
        var valueEnd = l.count
        while valueEnd > valueStart, l[valueEnd - 1] == 0x20 || l[valueEnd - 1] == 0x09 { valueEnd -= 1 }
        return (name, valueStart..<valueEnd)
    }

    /// A field line that lies whole in `input` from `start`, CRLF included, and is valid as
    /// `fieldLine` would find it: its name and trimmed value relative to `start`, and where its
    /// CR is. One pass finds the line's end and checks its bytes (the value's scan stops at
    /// the CR), where the general path scans for the line end first and then the line again.
    /// nil for anything else — an empty line, a line cut by the end of `input`, any byte
    /// `fieldLine` or the line scan would refuse — and the general path reads it, refusing
    /// what it must at the byte it always did.
    private static func wholeFieldLine(
        _ input: UnsafeRawBufferPointer, from start: Int
    ) -> (name: Range<Int>, value: Range<Int>, end: Int)? {
        guard let base = input.baseAddress else { return nil }
        let p = base.assumingMemoryBound(to: UInt8.self)
        let n = input.count
        var i = ASCII.tokenEnd(p, from: start, count: n)
        guard i > start, i < n, p[i] == 0x3A else { return nil }
        let nameEnd = i
        i += 1
        while i < n, p[i] == 0x20 || p[i] == 0x09 { i += 1 }
        let valueStart = i
        // Eight bytes at a time to the first control byte or DEL, found in its word at once: an
        // HTAB belongs to the value (the scan goes on after it), a CR ends it, anything else is
        // left to the general path. The last bytes of `input` are looked at one by one.
        while i + 8 <= n {
            let mask = SWAR.controlOrDEL(SWAR.load(base + i))
            if mask == 0 {
                i += 8
                continue
            }
            i += SWAR.firstMatch(mask)
            guard p[i] == 0x09 else { break }
            i += 1
        }
        while i < n, p[i] >= 0x20 && p[i] != 0x7F || p[i] == 0x09 { i += 1 }
        guard i + 1 < n, p[i] == 0x0D, p[i + 1] == 0x0A else { return nil }
        var valueEnd = i
        while valueEnd > valueStart, p[valueEnd - 1] == 0x20 || p[valueEnd - 1] == 0x09 { valueEnd -= 1 }
        return (0..<nameEnd - start, valueStart - start..<valueEnd - start, i)
    }

    /// The fields that decide framing and persistence, checked as they arrive; returns the
    /// field's kind for the encoder.
    private mutating func interpret(
        _ l: UnsafeBufferPointer<UInt8>, name: Range<Int>, value: Range<Int>
    ) throws(Failure)
        -> ResponseEncoder.ResponseField
    {
        // The kind comes from the encoder's own table of the fields a proxy treats specially,
        // so parser and encoder never disagree about a name.
        let kind = ResponseEncoder.ResponseField(UnsafeBufferPointer(rebasing: l[name]))
        switch kind {
        case .connection:
            for element in Self.listElements(l, value) {
                if Self.equalsIgnoringCase(l, element, "close") {
                    facts.connectionClose = true
                } else if Self.equalsIgnoringCase(l, element, "keep-alive") {
                    facts.connectionKeepAlive = true
                } else if !element.isEmpty {
                    facts.connectionNamesFields = true
                }
            }
        case .contentLength:
            for element in Self.listElements(l, value) {
                guard !element.isEmpty, element.count <= 18, element.allSatisfy({ Self.isDigit(l[$0]) }) else {
                    throw Failure(reason: "invalid Content-Length")
                }
                var n: Int64 = 0
                for k in element { n = n * 10 + Int64(l[k] - 0x30) }
                // Identical digit strings: the same value and the same number of digits.
                if let previous = facts.contentLength, previous != n || facts.contentLengthDigits != element.count {
                    throw Failure(reason: "differing Content-Length values")
                }
                facts.contentLength = n
                facts.contentLengthDigits = element.count
            }
        case .transferEncoding:
            facts.sawTransferEncoding = true
            for element in Self.listElements(l, value) {
                // transfer-coding = token *( OWS ";" OWS transfer-parameter )
                var k = element.lowerBound
                while k < element.upperBound, ASCII.isTokenChar(l[k]) { k += 1 }
                let coding = element.lowerBound..<k
                while k < element.upperBound, l[k] == 0x20 || l[k] == 0x09 { k += 1 }
                guard !coding.isEmpty, k == element.upperBound || l[k] == 0x3B else {
                    throw Failure(reason: "invalid Transfer-Encoding")
                }
                if Self.equalsIgnoringCase(l, coding, "chunked") {
                    if k != element.upperBound { throw Failure(reason: "parameters on the chunked transfer coding") }
                    if facts.sawChunked { throw Failure(reason: "chunked more than once in Transfer-Encoding") }
                    facts.sawChunked = true
                    facts.chunkedIsLast = true
                } else {
                    if facts.sawChunked { throw Failure(reason: "chunked is not the final transfer coding") }
                    facts.chunkedIsLast = false
                }
            }
        case .hopByHop, .other:
            break
        }
        return kind
    }

    // MARK: body

    private mutating func parseBody(_ input: UnsafeRawBufferPointer) throws(Failure) -> (Int, Event?) {
        switch state {
        case .fixedBody(let remaining):
            let n = Int(min(Int64(input.count), remaining))
            state = remaining == Int64(n) ? .endPending : .fixedBody(remaining: remaining - Int64(n))
            return (n, .body(0..<n))

        case .closeBody:
            return (input.count, .body(0..<input.count))

        case .chunked:
            do throws(ChunkedDecoder.Failure) {
                switch try chunked.decode(input) {
                case (let n, .data(let range)?):
                    return (n, .body(range))
                case (let n, .end?):
                    state = .done
                    return (n, .end)
                case (let n, nil):
                    return (n, nil)
                }
            } catch {
                throw Failure(reason: error.reason)
            }

        case .head, .endPending, .done, .failed:
            return (0, nil)
        }
    }

    // MARK: bytes

    @inline(__always)
    private static func isDigit(_ b: UInt8) -> Bool { b >= 0x30 && b <= 0x39 }

    /// `ASCII.equalsIgnoringCase` of the bytes `l[range]` and a lower-case literal.
    @inline(__always)
    private static func equalsIgnoringCase(
        _ l: UnsafeBufferPointer<UInt8>, _ range: Range<Int>, _ lowercase: StaticString
    ) -> Bool {
        ASCII.equalsIgnoringCase(UnsafeBufferPointer(rebasing: l[range]), lowercase)
    }

    /// The elements of a comma-separated list in `l[value]`, OWS trimmed, empty ones kept
    /// (callers refuse them where they matter).
    private static func listElements(_ l: UnsafeBufferPointer<UInt8>, _ value: Range<Int>) -> ListElements {
        ListElements(bytes: l, range: value)
    }

    private struct ListElements: Sequence, IteratorProtocol {
        let bytes: UnsafeBufferPointer<UInt8>
        let range: Range<Int>
        var start: Int?

        init(bytes: UnsafeBufferPointer<UInt8>, range: Range<Int>) {
            self.bytes = bytes
            self.range = range
            start = range.lowerBound
        }

        mutating func next() -> Range<Int>? {
            guard let s0 = start else { return nil }
            var e = s0
            while e < range.upperBound, bytes[e] != 0x2C { e += 1 }
            start = e < range.upperBound ? e + 1 : nil
            var s = s0
            var t = e
            while s < t, bytes[s] == 0x20 || bytes[s] == 0x09 { s += 1 }
            while t > s, bytes[t - 1] == 0x20 || bytes[t - 1] == 0x09 { t -= 1 }
            return s..<t
        }
    }
}
