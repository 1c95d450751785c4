import FuzzSupport

@testable import SluiceServer

/// Fuzz target: `HTTPResponseParser`, the native upstream transport's response decoder (status
/// lines, interim heads, fields, framing, chunked bodies and trailers, EOF), the input being
/// what an origin sends on one connection. Byte 0 picks the limits (bit 0), which responses
/// answer a HEAD request (bits 1–3 shift a 7-response pattern, repeated) and the largest piece
/// the input is cut into (bits 4–7); the rest is the origin's bytes. After each `.end` the next
/// response is expected, as a connection does before its next request; at the end of the
/// input, `finish()` (the origin closes).
///
/// Checks, beyond "no crash, no hang":
/// - the same events at the same offsets, the same body bytes, the same `Failure`, whether the
///   bytes arrive at once or cut into pieces whose sizes derive from the input's first bytes;
/// - the call contract: never more consumed than given, body ranges non-empty and within
///   the bytes consumed, a call without an event consumed everything, `.end` only after a head;
/// - every head the parser accepts, checked by a plain reference written here: CRLF line ends,
///   no control bytes, a `HTTP/1.x` status line with a status 100–599 other than 101, token
///   field names, no obs-fold, within the limits; never `Content-Length` together with
///   `Transfer-Encoding` nor `Transfer-Encoding` in HTTP/1.0; interim heads where the
///   reference finds them; and the framing, status, persistence and field count the reference
///   derives from the fields (RFC 9112 §6.3);
/// - the body against that framing: `.none` ends at the head, `.length(n)` delivers exactly
///   the n bytes after the head and then `.end`, `.close` delivers everything up to the EOF,
///   and a chunked body that ended equals what a plain chunked decoder makes of the same bytes,
///   ending at the same offset.
@main
enum ResponseParserFuzzer {
    /// Small limits, so that they are reached within `-max_len`.
    static let limits = [
        HTTPResponseParser.Limits(headerSection: 1024, headerCount: 16, interimResponses: 4),
        HTTPResponseParser.Limits(headerSection: 128, headerCount: 3, interimResponses: 1),
    ]
    static let maxPieces = [1, 2, 3, 5, 8, 13, 16, 32, 64, 128, 256, 512, 1024, 4096, 16384, 65536]

    static func main() {
        FuzzDriver.run { data, count in ResponseParserFuzzer.testOneInput(FuzzDriver.bytes(data, count)) }
    }

    /// One input: returns 0, or traps on a finding.
    static func testOneInput(_ raw: UnsafeRawBufferPointer) -> Int32 {
        guard let selector = raw.first else { return 0 }
        let limits = limits[Int(selector & 1)]
        let headPattern = UInt8(0b0100101) >> (selector >> 1 & 7)
        let input = UnsafeRawBufferPointer(rebasing: raw[1...])
        let whole = ResponseStream.parse(input, limits: limits, headPattern: headPattern)
        var seed: UInt64 = 0
        for b in raw.prefix(8) { seed = seed << 8 | UInt64(b) }
        var random = SplitMix(seed: seed ^ UInt64(raw.count))
        let maxPiece = UInt64(maxPieces[Int(selector >> 4)])
        let cut = ResponseStream.parse(input, limits: limits, headPattern: headPattern) { _ in
            Int(random.next() % maxPiece) + 1
        }
        fuzzCheck(whole == cut, "different results whole and cut:\n\(whole)\n\(cut)")
        let bytes = Array(input)
        for (index, response) in whole.responses.enumerated() {
            Reference.check(response, isLast: index == whole.responses.count - 1, in: bytes, stream: whole, limits: limits)
        }
        return 0
    }
}

/// What the parser made of one connection's bytes, flattened so that two runs over the same
/// bytes cut differently can be compared.
struct ResponseStream: Equatable, CustomStringConvertible {
    struct Interim: Equatable {
        var status: Int
        var offset: Int
    }

    struct Response: Equatable {
        var start: Int
        var headRequest: Bool
        var interims: [Interim] = []
        var framing: HTTPResponseParser.BodyFraming?
        var headOffset = 0
        var status = 0
        var keepAlive = false
        var minorVersion = 0
        var fieldCount = 0
        var body: [UInt8] = []
        var endOffset: Int?
        /// `.end` came from `finish()`.
        var endedAtEOF = false
    }

    var responses: [Response] = []
    var error: String?
    /// `finish()` returned nil (nothing of a response had started).
    var idleClose = false

    var description: String {
        "error: \(error ?? "-") idleClose: \(idleClose)\n" + responses.map { "\($0)" }.joined(separator: "\n")
    }

    /// Feeds `input` revealed in pieces of the sizes `cuts` yields (nil: all at once), calling
    /// `parse` until a call returns no event after each piece, then `finish()`.
    static func parse(
        _ input: UnsafeRawBufferPointer, limits: HTTPResponseParser.Limits, headPattern: UInt8,
        cuts: ((Int) -> Int)? = nil
    ) -> ResponseStream {
        var parser = HTTPResponseParser(limits: limits)
        var out = ResponseStream()
        func expect(at offset: Int) {
            let headRequest = headPattern >> (out.responses.count % 7) & 1 != 0
            parser.expectResponse(headRequest: headRequest)
            out.responses.append(Response(start: offset, headRequest: headRequest))
        }
        expect(at: 0)
        var start = 0  // first byte not consumed
        var available = 0  // bytes revealed so far
        var calls = 0
        repeat {
            available = min(input.count, available + max(1, cuts?(available) ?? input.count))
            while true {
                calls += 1
                fuzzCheck(calls <= 4 * input.count + 64, "parser makes no progress")
                let window = UnsafeRawBufferPointer(rebasing: input[start..<available])
                let consumed: Int
                let event: HTTPResponseParser.Event?
                do throws(HTTPResponseParser.Failure) {
                    (consumed, event) = try parser.parse(window)
                } catch {
                    out.error = error.reason
                    return out
                }
                fuzzCheck(consumed >= 0 && consumed <= window.count, "consumed \(consumed) of \(window.count)")
                fuzzCheck(event != nil || consumed == window.count, "a call without an event left bytes")
                let at = start + consumed
                let r = out.responses.count - 1
                switch event {
                case .interim(let status)?:
                    fuzzCheck(out.responses[r].framing == nil, "interim after the final head")
                    out.responses[r].interims.append(Interim(status: status, offset: at))
                case .head(let framing)?:
                    fuzzCheck(out.responses[r].framing == nil, "a second final head")
                    fuzzCheck(parser.head.isComplete, "head event with an incomplete head")
                    out.responses[r].framing = framing
                    out.responses[r].headOffset = at
                    out.responses[r].status = parser.head.status
                    out.responses[r].keepAlive = parser.keepAlive
                    out.responses[r].minorVersion = parser.minorVersion
                    out.responses[r].fieldCount = parser.head.lineCount
                case .body(let range)?:
                    fuzzCheck(
                        !range.isEmpty && range.lowerBound >= 0 && range.upperBound <= consumed,
                        "body range \(range) outside the \(consumed) bytes consumed")
                    fuzzCheck(out.responses[r].framing != nil, "body before the head")
                    out.responses[r].body += window[range]
                case .end?:
                    fuzzCheck(out.responses[r].framing != nil, "end before the head")
                    fuzzCheck(consumed == 0 || out.responses[r].framing == .chunked, "end consumed bytes")
                    out.responses[r].endOffset = at
                case nil:
                    break
                }
                start = at
                if event == .end { expect(at: start) }
                if event == nil { break }
            }
        } while available < input.count
        fuzzCheck(start == input.count, "consumed \(start) of \(input.count) without an error")
        do throws(HTTPResponseParser.Failure) {
            let r = out.responses.count - 1
            switch try parser.finish() {
            case .end?:
                fuzzCheck(out.responses[r].framing != nil, "end at EOF before the head")
                out.responses[r].endOffset = start
                out.responses[r].endedAtEOF = true
            case nil:
                fuzzCheck(start == out.responses[r].start, "finish() saw nothing of a started response")
                out.idleClose = true
            case let event?:
                fuzzCheck(false, "finish() returned \(event)")
            }
        } catch {
            out.error = error.reason
        }
        return out
    }
}

/// RFC 9112 written plainly and separately from the parser, asked only about what the parser
/// accepted: it need not refuse everything the parser refuses, but everything it checks, an
/// accepted response must pass. Field values are split on bytes, never as `String`s (a
/// combining character after a comma would hide it from `split`).
enum Reference {
    typealias Field = (name: String, value: [UInt8])

    static func check(
        _ r: ResponseStream.Response, isLast: Bool, in bytes: [UInt8],
        stream: ResponseStream, limits: HTTPResponseParser.Limits
    ) {
        // The heads the parser reported, walked from the response's start: each ends at the
        // first CRLF CRLF; all but an accepted final one are interim.
        let bound = r.framing != nil ? r.headOffset : (r.interims.last?.offset ?? r.start)
        var position = r.start
        var interims: [ResponseStream.Interim] = []
        var finalHead: ArraySlice<UInt8>?
        while position < bound {
            guard let end = headEnd(bytes, from: position), end <= bound else {
                return fuzzCheck(false, "a head the reference does not find ends at \(bound)")
            }
            let head = bytes[position..<end]
            checkHead(head, limits: limits)
            let status = statusCode(head)
            if end == bound && r.framing != nil {
                finalHead = head
            } else {
                fuzzCheck(status < 200, "status \(status) taken for an interim head")
                interims.append(ResponseStream.Interim(status: status, offset: end))
            }
            position = end
        }
        fuzzCheck(interims == r.interims, "interims \(r.interims), the reference finds \(interims)")
        fuzzCheck(interims.count <= limits.interimResponses, "\(interims.count) interim heads accepted")
        guard let framing = r.framing, let head = finalHead else { return }
        let fields = checkHead(head, limits: limits)
        let status = statusCode(head)
        let minor = Int(head[head.startIndex + 7] - 0x30)
        fuzzCheck(status == r.status && status >= 200, "status \(r.status), the reference reads \(status)")
        fuzzCheck(minor == r.minorVersion, "minor version \(r.minorVersion), the reference reads \(minor)")
        fuzzCheck(fields.count == r.fieldCount, "\(r.fieldCount) fields, the reference reads \(fields.count)")

        func elements(_ name: String) -> [[UInt8]]? {
            let found = fields.filter { $0.name == name }
            return found.isEmpty ? nil : found.flatMap { listElements($0.value) }
        }
        let lengths = elements("content-length")
        let codings = elements("transfer-encoding")
        let chunked = Array("chunked".utf8)
        fuzzCheck(lengths == nil || codings == nil, "Content-Length together with Transfer-Encoding accepted")
        fuzzCheck(codings == nil || minor == 1, "Transfer-Encoding in an HTTP/1.0 response accepted")
        if let codings {
            fuzzCheck(codings.filter { $0 == chunked }.count <= 1, "chunked twice accepted")
            fuzzCheck(!codings.dropLast().contains(chunked), "chunked before another coding accepted")
            fuzzCheck(!codings.contains([]), "an empty transfer coding accepted")
        }
        if let lengths {
            fuzzCheck(
                Set(lengths).count == 1 && !lengths[0].isEmpty && lengths[0].count <= 18
                    && lengths[0].allSatisfy { $0 >= 0x30 && $0 <= 0x39 }, "Content-Length \(lengths) accepted")
        }
        let expected: HTTPResponseParser.BodyFraming
        if r.headRequest || status == 204 || status == 304 {
            expected = .none
        } else if let codings {
            expected = codings.last == chunked ? .chunked : .close
        } else if let lengths {
            expected = .length(lengths[0].reduce(Int64(0)) { $0 * 10 + Int64($1 - 0x30) })
        } else {
            expected = .close
        }
        fuzzCheck(framing == expected, "framing \(framing), the reference expects \(expected)")

        let connection = elements("connection") ?? []
        let close = connection.contains(Array("close".utf8))
        let keepAlive = connection.contains(Array("keep-alive".utf8))
        let persistent = minor == 1 ? !close : keepAlive && !close
        fuzzCheck(r.keepAlive == (persistent && framing != .close), "keepAlive \(r.keepAlive) for \(framing)")

        let h = r.headOffset
        switch framing {
        case .none:
            fuzzCheck(r.body.isEmpty && r.endOffset == h, "bodiless response: \(r.body.count) bytes, end at \(r.endOffset ?? -1)")
        case .length(let n):
            let end = h + Int(min(n, Int64(bytes.count - h)))
            fuzzCheck(r.body[...] == bytes[h..<end], "length body differs from the bytes after the head")
            if Int64(bytes.count - h) >= n {
                fuzzCheck(r.endOffset == h + Int(n), "length(\(n)) ended at \(r.endOffset ?? -1), not \(h + Int(n))")
            } else {
                fuzzCheck(
                    r.endOffset == nil && stream.error == "connection closed before the response ended",
                    "short length body: \(stream.error ?? "no error")")
            }
        case .close:
            fuzzCheck(isLast && r.body[...] == bytes[h...], "close-delimited body is not the rest of the input")
            fuzzCheck(
                r.endedAtEOF && r.endOffset == bytes.count && stream.error == nil, "close-delimited body did not end at EOF")
        case .chunked:
            let reference = decodeChunked(bytes[h...])
            if let end = r.endOffset {
                fuzzCheck(reference != nil, "chunked body ended where the reference decoder finds none")
                fuzzCheck(reference?.body == r.body, "chunked body differs from the reference decoder's")
                fuzzCheck(
                    reference.map { h + $0.length } == end,
                    "chunked body ended at \(end), the reference at \(reference.map { h + $0.length } ?? -1)")
            } else {
                fuzzCheck(stream.error != nil, "chunked body neither ended nor failed")
                if let reference { fuzzCheck(reference.body.starts(with: r.body), "partial chunked body differs") }
            }
        }
    }

    static func statusCode(_ head: ArraySlice<UInt8>) -> Int {
        head[(head.startIndex + 9)..<(head.startIndex + 12)].reduce(0) { $0 * 10 + Int($1 - 0x30) }
    }

    /// A list field's elements: split at commas, SP and HTAB trimmed, ASCII lowercased.
    static func listElements(_ value: [UInt8]) -> [[UInt8]] {
        value.split(separator: 0x2C, omittingEmptySubsequences: false).map { element in
            var e = element
            while let f = e.first, f == 0x20 || f == 0x09 { e = e.dropFirst() }
            while let l = e.last, l == 0x20 || l == 0x09 { e = e.dropLast() }
            return e.map { $0 >= 0x41 && $0 <= 0x5A ? $0 | 0x20 : $0 }
        }
    }

    /// The index after the first CRLF CRLF at or after `from`.
    static func headEnd(_ b: [UInt8], from: Int) -> Int? {
        var i = from
        while i + 3 < b.count {
            if b[i] == 13, b[i + 1] == 10, b[i + 2] == 13, b[i + 3] == 10 { return i + 4 }
            i += 1
        }
        return nil
    }

    /// Checks an accepted head (status line, field lines, empty line) and returns its fields,
    /// names lowercased and values trimmed.
    @discardableResult
    static func checkHead(_ head: ArraySlice<UInt8>, limits: HTTPResponseParser.Limits) -> [Field] {
        fuzzCheck(head.count <= limits.headerSection, "head of \(head.count) bytes accepted")
        for (k, c) in zip(head.indices, head) {
            if c == 13 { fuzzCheck(k + 1 < head.endIndex && head[k + 1] == 10, "bare CR accepted") }
            if c == 10 { fuzzCheck(k > head.startIndex && head[k - 1] == 13, "bare LF accepted") }
            fuzzCheck(c >= 0x20 || c == 9 || c == 10 || c == 13, "control byte \(c) accepted")
            fuzzCheck(c != 0x7F, "DEL accepted")
        }
        var lines: [ArraySlice<UInt8>] = []
        var s = head.startIndex
        for k in head.indices where head[k] == 10 {
            lines.append(head[s..<(k - 1)])
            s = k + 1
        }
        fuzzCheck(lines.last?.isEmpty == true && lines.dropLast().allSatisfy { !$0.isEmpty }, "not one empty line at the end")
        let statusLine = Array(lines[0])
        fuzzCheck(
            statusLine.starts(with: Array("HTTP/1.1 ".utf8)) || statusLine.starts(with: Array("HTTP/1.0 ".utf8)),
            "bad version accepted")
        fuzzCheck(
            statusLine.count >= 12 && statusLine[9..<12].allSatisfy { $0 >= 0x30 && $0 <= 0x39 }
                && (statusLine.count == 12 || statusLine[12] == 0x20), "bad status code accepted")
        let status = Int(String(decoding: statusLine[9..<12], as: UTF8.self))!
        fuzzCheck(status >= 100 && status <= 599 && status != 101, "status \(status) accepted")
        var fields: [Field] = []
        for line in lines.dropFirst().dropLast() {
            fuzzCheck(line.first != 0x20 && line.first != 0x09, "obs-fold accepted")
            let colon = line.firstIndex(of: 0x3A) ?? line.endIndex
            fuzzCheck(colon < line.endIndex, "field line without a colon")
            fuzzCheck(colon > line.startIndex && line[line.startIndex..<colon].allSatisfy(isToken), "field name is not a token")
            fields.append(
                (String(decoding: line[line.startIndex..<colon], as: UTF8.self).lowercased(), Array(line[(colon + 1)...])))
        }
        fuzzCheck(fields.count <= limits.headerCount, "\(fields.count) fields accepted")
        return fields
    }

    static func isToken(_ c: UInt8) -> Bool {
        switch c {
        case 0x30...0x39, 0x41...0x5A, 0x61...0x7A: return true
        default: return Array("!#$%&'*+-.^_`|~".utf8).contains(c)
        }
    }

    /// RFC 9112 §7.1 chunked decoding: sizes in hex, extensions skipped to the CRLF, data
    /// followed by exactly CRLF, trailer lines up to the empty line. Returns the body and the length
    /// of the encoding, or nil when the bytes hold no complete chunked body.
    static func decodeChunked(_ bytes: ArraySlice<UInt8>) -> (body: [UInt8], length: Int)? {
        let b = Array(bytes)
        var i = 0
        var body: [UInt8] = []
        func line() -> ArraySlice<UInt8>? {
            guard let cr = b[i...].firstIndex(of: 13), cr + 1 < b.count, b[cr + 1] == 10 else { return nil }
            defer { i = cr + 2 }
            return b[i..<cr]
        }
        while true {
            guard let sizeLine = line() else { return nil }
            let hex = sizeLine.prefix { hexValue($0) != nil }
            guard !hex.isEmpty, hex.count <= 16 else { return nil }
            // After the size: nothing, or whitespace or `;` before an extension.
            if let next = sizeLine.dropFirst(hex.count).first, next != 0x20, next != 0x09, next != 0x3B { return nil }
            let size = hex.reduce(UInt64(0)) { $0 << 4 | hexValue($1)! }
            if size == 0 { break }
            guard size <= UInt64(b.count - i), b.count - i - Int(size) >= 2 else { return nil }
            body += b[i..<(i + Int(size))]
            i += Int(size)
            guard b[i] == 13, b[i + 1] == 10 else { return nil }  // the data's CRLF
            i += 2
        }
        while true {
            guard let trailer = line() else { return nil }
            if trailer.isEmpty { return (body, i) }
        }
    }

    static func hexValue(_ c: UInt8) -> UInt64? {
        switch c {
        case 0x30...0x39: return UInt64(c - 0x30)
        case 0x41...0x46: return UInt64(c - 0x37)
        case 0x61...0x66: return UInt64(c - 0x57)
        default: return nil
        }
    }
}
