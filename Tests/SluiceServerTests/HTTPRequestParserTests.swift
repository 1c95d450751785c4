import SluiceCore
import Testing

@testable import SluiceServer

/// What a parse run produced, flattened for comparison across input splits.
struct Parsed: Equatable {
    var heads: [String] = []  // "METHOD target minor framing"
    var bodies: [[UInt8]] = []
    var ends = 0
}

/// One `parse` call over `bytes` (a helper: typed-throws closures inside `withUnsafeBytes`
/// crash the 6.3 compiler's SILGen).
func feed(_ parser: inout HTTPRequestParser, _ bytes: [UInt8]) throws -> (consumed: Int, event: HTTPRequestParser.Event?) {
    let result: Result<(consumed: Int, event: HTTPRequestParser.Event?), ProxyError> = bytes.withUnsafeBytes { buf in
        do throws(ProxyError) {
            return .success(try parser.parse(buf))
        } catch {
            return .failure(error)
        }
    }
    return try result.get()
}

let defaultLimits = HTTPRequestParser.Limits(requestLine: 8192, headerSection: 65536, headerCount: 100, body: nil)

/// Feeds `input` in pieces cut at `cuts` (sorted offsets), running the parser to quiescence
/// after each piece, as `ClientConnection` does.
func run(_ input: [UInt8], cuts: [Int] = [], limits: HTTPRequestParser.Limits = defaultLimits) throws -> Parsed {
    var parser = HTTPRequestParser(limits: limits)
    var out = Parsed()
    var pieces: [ArraySlice<UInt8>] = []
    var start = 0
    for cut in cuts + [input.count] where cut >= start {
        pieces.append(input[start..<cut])
        start = cut
    }
    var pending: [UInt8] = []
    for piece in pieces {
        pending += piece
        while true {
            let result = try feed(&parser, pending)
            switch result.event {
            case .head(let head)?:
                out.heads.append("\(head.method) \(head.target) \(head.minorVersion) \(head.framing)")
                if head.hasBody { out.bodies.append([]) }
            case .body(let range)?:
                out.bodies[out.bodies.count - 1] += pending[range]
            case .end?:
                out.ends += 1
            case nil:
                break
            }
            pending.removeFirst(result.consumed)
            if result.event == nil && result.consumed == 0 { break }
        }
    }
    return out
}

func bytes(_ s: String) -> [UInt8] { Array(s.utf8) }

func expectError(
    _ input: String, limits: HTTPRequestParser.Limits = defaultLimits,
    _ check: (ProxyError) -> Bool, sourceLocation: SourceLocation = #_sourceLocation
) {
    do {
        let parsed = try run(bytes(input), limits: limits)
        Issue.record("expected an error, parsed \(parsed)", sourceLocation: sourceLocation)
    } catch {
        guard let error = error as? ProxyError else {
            Issue.record("not a ProxyError: \(error)", sourceLocation: sourceLocation)
            return
        }
        #expect(check(error), "unexpected error \(error)", sourceLocation: sourceLocation)
    }
}

@Suite struct HTTPRequestParserTests {
    @Test func simpleGet() throws {
        let p = try run(bytes("GET http://a.test/x HTTP/1.1\r\nHost: a.test\r\n\r\n"))
        #expect(p.heads == ["GET http://a.test/x 1 none"])
        #expect(p.bodies.isEmpty)
    }

    @Test func headFieldsAreByteRanges() throws {
        let input = bytes(
            "POST http://a.test/ HTTP/1.1\r\nHost: a.test\r\nX-Pad:   spaced value \t\r\nEmpty:\r\nContent-Length: 3\r\n\r\nabc")
        var parser = HTTPRequestParser(limits: defaultLimits)
        let result = try feed(&parser, input)
        guard case .head(let head)? = result.event else {
            Issue.record("no head")
            return
        }
        #expect(head.method == "POST")
        #expect(head.values(named: "x-pad") == ["spaced value"])
        #expect(head.values(named: "empty") == [""])
        #expect(head.framing == .length(3))
        #expect(head.keepAlive)
        #expect(result.consumed == input.count - 3)
    }

    @Test func contentLengthBodyAndPipelining() throws {
        let input = bytes(
            """
            POST http://a.test/ HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello\
            GET http://a.test/2 HTTP/1.1\r\nHost: a\r\n\r\n
            """)
        let p = try run(input)
        #expect(p.heads == ["POST http://a.test/ 1 length(5)", "GET http://a.test/2 1 none"])
        #expect(p.bodies == [bytes("hello")])
        #expect(p.ends == 1)
    }

    @Test func chunkedBodyWithExtensionsAndTrailers() throws {
        let input = bytes(
            "POST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
                + "5;name=value\r\nhello\r\nA\r\n0123456789\r\n0\r\nX-Trailer: t\r\n\r\n"
                + "GET http://a/next HTTP/1.1\r\nHost: a\r\n\r\n")
        let p = try run(input)
        #expect(p.heads == ["POST http://a/ 1 chunked", "GET http://a/next 1 none"])
        #expect(p.bodies == [bytes("hello0123456789")])
        #expect(p.ends == 1)
    }

    /// The decoder's result must not depend on how the bytes were split: every single cut
    /// point, and byte-at-a-time, give the same events as one piece.
    @Test func everySplitGivesTheSameResult() throws {
        let messages = [
            "GET http://a/ HTTP/1.1\r\nHost: a\r\nAccept: */*\r\n\r\n",
            "\r\nPUT http://a/p HTTP/1.1\r\nHost: a\r\nContent-Length: 11\r\n\r\nhello world",
            "POST http://a/c HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n10\r\n0123456789abcdef\r\n0\r\n\r\n",
            "GET http://a/10 HTTP/1.0\r\n\r\n",
        ]
        let input = bytes(messages.joined())
        let whole = try run(input)
        #expect(whole.heads.count == 4)
        #expect(whole.bodies == [bytes("hello world"), bytes("abc0123456789abcdef")])
        for cut in 1..<input.count {
            #expect(try run(input, cuts: [cut]) == whole, "split at \(cut)")
        }
        #expect(try run(input, cuts: Array(1..<input.count)) == whole, "byte at a time")
    }

    @Test func errorsAtEverySplitAreTheSame() {
        let bad = bytes("POST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\n")
        for cut in 1..<bad.count {
            do {
                _ = try run(bad, cuts: [cut])
                Issue.record("accepted an invalid chunk size at split \(cut)")
            } catch {
                #expect(error as? ProxyError == .malformedRequest("invalid chunk size"))
            }
        }
    }

    // MARK: smuggling and strictness (DESIGN §4)

    @Test func rejectsContentLengthWithTransferEncoding() {
        expectError("POST http://a/ HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n") {
            $0.status == 400
        }
    }

    @Test func rejectsDifferingContentLengths() {
        expectError("POST http://a/ HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd") {
            $0 == .malformedRequest("differing Content-Length values")
        }
        expectError("POST http://a/ HTTP/1.1\r\nHost: a\r\nContent-Length: 3, 4\r\n\r\nabcd") { $0.status == 400 }
        expectError("POST http://a/ HTTP/1.1\r\nHost: a\r\nContent-Length: +3\r\n\r\nabc") { $0.status == 400 }
        expectError("POST http://a/ HTTP/1.1\r\nHost: a\r\nContent-Length: 0x3\r\n\r\nabc") { $0.status == 400 }
    }

    @Test func acceptsRepeatedIdenticalContentLength() throws {
        let p = try run(bytes("POST http://a/ HTTP/1.1\r\nHost: a\r\nContent-Length: 3, 3\r\n\r\nabc"))
        #expect(p.bodies == [bytes("abc")])
    }

    @Test func rejectsObsFold() {
        expectError("GET http://a/ HTTP/1.1\r\nHost: a\r\nX-A: one\r\n two\r\n\r\n") {
            $0 == .malformedRequest("obsolete line folding in header")
        }
    }

    @Test func rejectsBareCRAndBareLF() {
        expectError("GET http://a/ HTTP/1.1\r\nHost: a\rX: y\r\n\r\n") { $0 == .malformedRequest("bare CR in request head") }
        expectError("GET http://a/ HTTP/1.1\nHost: a\r\n\r\n") { $0 == .malformedRequest("bare LF in request head") }
    }

    @Test func rejectsControlCharacters() {
        expectError("GET http://a/ HTTP/1.1\r\nHost: a\r\nX: a\u{0}b\r\n\r\n") { $0.status == 400 }
        expectError("GET http://a/ HTTP/1.1\r\nHost: a\r\nX: a\u{1}b\r\n\r\n") { $0.status == 400 }
        expectError("GET http://a/ HTTP/1.1\r\nHost: a\r\nX: a\u{7F}b\r\n\r\n") { $0.status == 400 }
        expectError("GET http://a/\u{1} HTTP/1.1\r\nHost: a\r\n\r\n") { $0.status == 400 }
    }

    @Test func rejectsWhitespaceBeforeColonAndBadNames() {
        expectError("GET http://a/ HTTP/1.1\r\nHost : a\r\n\r\n") { $0 == .malformedRequest("malformed header field name") }
        expectError("GET http://a/ HTTP/1.1\r\nHost: a\r\n: empty\r\n\r\n") { $0.status == 400 }
        expectError("GET http://a/ HTTP/1.1\r\nHost: a\r\nNo colon\r\n\r\n") { $0.status == 400 }
    }

    /// `ASCII.tokenEnd` (eight bytes at a time over letters and dashes) stops where the byte
    /// by byte token scan does: every byte value at every position of a name of 1 to 20
    /// letters and dashes, and names cut short by the end of the input.
    @Test func tokenEndStopsWhereTheByteScanDoes() {
        let name = Array("Content-Type-And-So-On".utf8)
        for length in 1...20 {
            for position in 0...length {
                for value in 0...255 {
                    var bytes = Array(name[0..<length]) + [0x3A, 0x20, 0x61]
                    bytes[position] = UInt8(value)
                    for count in [position + 1, bytes.count] {
                        var expected = 0
                        while expected < count, ASCII.isTokenChar(bytes[expected]) { expected += 1 }
                        let found = bytes.withUnsafeBufferPointer { ASCII.tokenEnd($0.baseAddress!, from: 0, count: count) }
                        #expect(found == expected, "\(bytes) count \(count)")
                    }
                }
            }
        }
    }

    /// `ASCII.equalsIgnoringCase` (whole words, the last one overlapping) agrees with a byte
    /// by byte comparison: every byte value at every position of names of 1 to 20 bytes.
    @Test func equalsIgnoringCaseAgreesWithTheByteRule() {
        let lowercase = Array("content-length-and-so".utf8)
        for length in 1...20 {
            let literal = Array(lowercase[0..<length])
            for position in 0..<length {
                for value in 0...255 {
                    var bytes = literal.map { $0 >= 0x61 && $0 <= 0x7A && $0 % 2 == 0 ? $0 - 0x20 : $0 }
                    bytes[position] = UInt8(value)
                    let expected = zip(bytes, literal).allSatisfy { ASCII.lower($0) == $1 }
                    let found = bytes.withUnsafeBufferPointer { b in
                        literal.withUnsafeBufferPointer { ASCII.equalsIgnoringCase(b, $0) }
                    }
                    #expect(found == expected, "\(bytes) against \(literal)")
                }
            }
            // A different length never matches.
            let longer = literal + [0x61]
            #expect(!longer.withUnsafeBufferPointer { b in literal.withUnsafeBufferPointer { ASCII.equalsIgnoringCase(b, $0) } })
        }
    }

    @Test func rejectsMalformedRequestLines() {
        expectError("GET  http://a/ HTTP/1.1\r\nHost: a\r\n\r\n") { $0.status == 400 }
        expectError("GET http://a/ HTTP/1.1 \r\nHost: a\r\n\r\n") { $0.status == 400 }
        expectError("GET http://a/\r\nHost: a\r\n\r\n") { $0.status == 400 }
        expectError("G(T http://a/ HTTP/1.1\r\nHost: a\r\n\r\n") { $0.status == 400 }
        expectError("GET http://a/ HTTP/2.0\r\nHost: a\r\n\r\n") { $0 == .unsupportedVersion }
        expectError("GET http://a/ http/1.1\r\nHost: a\r\n\r\n") { $0.status == 400 }
    }

    @Test func hostRules() {
        expectError("GET http://a/ HTTP/1.1\r\n\r\n") { $0 == .malformedRequest("missing Host header") }
        expectError("GET http://a/ HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n") {
            $0 == .malformedRequest("more than one Host header")
        }
    }

    @Test func transferCodings() {
        expectError("POST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n") {
            $0 == .unsupportedTransferCoding("gzip")
        }
        expectError("POST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n") { $0.status == 501 }
        expectError("POST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, chunked\r\n\r\n") { $0.status == 501 }
        expectError("POST http://a/ HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n") { $0.status == 400 }
    }

    @Test func invalidChunkSizes() {
        let prefix = "POST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
        for size in ["", "g", "-1", " 5", "0x5", "11111111111111111"] {
            expectError(prefix + size + "\r\nhello\r\n0\r\n\r\n") { $0.status == 400 }
        }
        expectError(prefix + "5\r\nhelloXX0\r\n\r\n") { $0 == .malformedRequest("missing CRLF after chunk data") }
        expectError(prefix + "5\rhello\r\n0\r\n\r\n") { $0.status == 400 }
    }

    // MARK: limits

    @Test func limitsMapToTheirStatuses() {
        let small = HTTPRequestParser.Limits(requestLine: 64, headerSection: 300, headerCount: 3, body: 10)
        expectError("GET http://a/\(String(repeating: "x", count: 100)) HTTP/1.1\r\nHost: a\r\n\r\n", limits: small) {
            $0 == .requestLineTooLong(limit: 64)
        }
        // Detected before the line ends, so an endless line cannot grow memory.
        expectError("GET http://a/\(String(repeating: "x", count: 100))", limits: small) { $0.status == 414 }
        expectError("GET http://a/ HTTP/1.1\r\nHost: a\r\nX: \(String(repeating: "y", count: 400))\r\n\r\n", limits: small) {
            $0 == .headerSectionTooLarge(limit: 300)
        }
        expectError("GET http://a/ HTTP/1.1\r\nHost: a\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n", limits: small) {
            $0 == .tooManyHeaders(limit: 3)
        }
        expectError("POST http://a/ HTTP/1.1\r\nHost: a\r\nContent-Length: 11\r\n\r\n", limits: small) {
            $0 == .bodyTooLarge(limit: 10)
        }
        expectError(
            "POST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n8\r\n12345678\r\n8\r\n12345678\r\n0\r\n\r\n",
            limits: small
        ) { $0 == .bodyTooLarge(limit: 10) }
    }

    /// A head that arrives whole is read in one step a line (`wholeHead`), one that arrives in
    /// pieces byte by byte: both must agree at the limits' edges (a request line and a field
    /// section one byte under, at and over their limits) and on every malformed line end.
    @Test func aWholeHeadAndAByteAtATimeAgree() throws {
        let limits = HTTPRequestParser.Limits(requestLine: 40, headerSection: 60, headerCount: 10, body: nil)
        func outcome(_ input: [UInt8], cuts: [Int]) -> String {
            do { return "\(try run(input, cuts: cuts, limits: limits))" } catch { return "error \(error)" }
        }
        var heads: [String] = []
        for extra in -1...1 {
            // "GET http://a/" + padding + " HTTP/1.1" is 40 + extra bytes.
            let line = "GET http://a/" + String(repeating: "p", count: 18 + extra) + " HTTP/1.1"
            heads.append(line + "\r\nHost: a\r\n\r\n")
            // Fields and the final CRLF: 60 + extra bytes.
            heads.append("GET http://a/ HTTP/1.1\r\nHost: a\r\nX: " + String(repeating: "v", count: 44 + extra) + "\r\n\r\n")
        }
        let good = "GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n"
        heads += [
            "\r\n" + good, "\n" + good, "GET http://a/ HTTP/1.1\nHost: a\r\n\r\n", "GET http://a/ HTTP/1.1\r\nHost: a\r\n\n",
            "GET http://a/ HTTP/1.1\r\nHost: a\rX\r\n\r\n", "GET http://a/ HTTP/1.1\r\nHost: a\r\n\r", good + good,
            "GET http://a/ HTTP/1.1\r\r\nHost: a\r\n\r\n", "\r\n\r\n",
        ]
        for text in heads {
            let input = bytes(text)
            let whole = outcome(input, cuts: [])
            #expect(whole == outcome(input, cuts: Array(1..<max(1, input.count))), "\(text.debugDescription)")
        }
        // The edges themselves: at the limits a head is read, over them it is refused.
        #expect(outcome(bytes(heads[2]), cuts: []).hasPrefix("Parsed"))
        #expect(outcome(bytes(heads[4]), cuts: []) == "error \(ProxyError.requestLineTooLong(limit: 40))")
        #expect(outcome(bytes(heads[3]), cuts: []).hasPrefix("Parsed"))
        #expect(outcome(bytes(heads[5]), cuts: []) == "error \(ProxyError.headerSectionTooLarge(limit: 60))")
    }

    /// Found by the chunked-body fuzz target: with a body limit, a chunk size near 2^64 after
    /// a first chunk overflowed the limit check and trapped (the whole process, from one client).
    @Test func hugeChunkSizeAfterAFirstChunkIsTooLarge() throws {
        let head = "POST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
        let limited = HTTPRequestParser.Limits(requestLine: 1024, headerSection: 2048, headerCount: 24, body: 16)
        for size in ["FFFFFFFFFFFFFFFF", "8000000000000000", "7FFFFFFFFFFFFFFE", "e"] {
            expectError(head + "3\r\nabc\r\n\(size)\r\n", limits: limited) { $0 == .bodyTooLarge(limit: 16) }
        }
        // Without a limit the chunk is announced and its first bytes pass through.
        let p = try run(bytes(head + "3\r\nabc\r\nFFFFFFFFFFFFFFFF\r\nxyz"))
        #expect(p.bodies == [bytes("abcxyz")] && p.ends == 0)
    }

    @Test func keepAliveRules() throws {
        func head(_ s: String) throws -> HTTPRequestHead {
            var parser = HTTPRequestParser(limits: defaultLimits)
            let input = bytes(s)
            let r = try feed(&parser, input)
            guard case .head(let h)? = r.event else { throw ProxyError.malformedRequest("no head") }
            return h
        }
        #expect(try head("GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n").keepAlive)
        #expect(try !head("GET http://a/ HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").keepAlive)
        #expect(try !head("GET http://a/ HTTP/1.0\r\n\r\n").keepAlive)
        #expect(try head("GET http://a/ HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").keepAlive)
        #expect(
            try head("PUT http://a/ HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\n").expectsContinue)
    }
}
