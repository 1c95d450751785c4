import Testing

@testable import SluiceServer

/// `HTTPResponseParser`: the native upstream transport's response decoder, fed whole, split at
/// every byte and byte at a time; its refusals; the `.end` timing contract; and a property test
/// against responses generated here.
@Suite struct HTTPResponseParserTests {
    typealias Parser = HTTPResponseParser

    /// What a run produced, flattened for comparison across input splits.
    struct Outcome: Equatable {
        /// Every event but `.body`, with the input offset after the call that returned it.
        var events: [String] = []
        /// The decoded body of each final head.
        var bodies: [[UInt8]] = []
        /// Each final head as `status reason|field lines|keepAlive|minor`.
        var heads: [String] = []
        /// Each interim head's end-to-end fields, as `name: value` lines joined by `|`.
        var interims: [String] = []
        var failure: String?
        /// Bytes consumed in all (only without a failure: how far a failing run got depends on
        /// the split).
        var consumed = 0
    }

    static func b(_ s: String) -> [UInt8] { Array(s.utf8) }

    /// One `parse` call (a helper: typed-throws closures inside `withUnsafeBytes` crash the 6.3
    /// compiler's SILGen).
    static func feed(_ parser: inout Parser, _ bytes: [UInt8]) throws(Parser.Failure) -> (consumed: Int, event: Parser.Event?) {
        let result: Result<(consumed: Int, event: Parser.Event?), Parser.Failure> = bytes.withUnsafeBytes { buf in
            do throws(Parser.Failure) {
                return .success(try parser.parse(buf))
            } catch {
                return .failure(error)
            }
        }
        return try result.get()
    }

    static func describe(_ parser: Parser) -> String {
        let h = parser.head
        var fields: [String] = []
        var start = 0
        for i in 0..<h.lineCount {
            let end = h.lineEnd(i)
            fields.append(String(decoding: h.lines[start..<end], as: UTF8.self))
            start = end
        }
        return
            "\(h.status) \(String(decoding: h.reason, as: UTF8.self))|\(fields.joined(separator: "|"))|\(parser.keepAlive)|\(parser.minorVersion)"
    }

    /// Feeds `input` in pieces cut at `cuts` (sorted offsets), calling `parse` after each piece
    /// until a call returns no event, as a connection does; after each `.end` the next response
    /// is expected (`headRequests`, one per response); at the end of the input, `finish()`.
    /// Checks the call contract on the way: a call without an event consumed all it was given
    /// (or nothing, the response being over); body ranges are non-empty and within the bytes
    /// consumed.
    static func run(
        _ input: [UInt8], cuts: [Int] = [], headRequests: [Bool] = [false],
        limits: Parser.Limits = .default, finish: Bool = true
    ) -> Outcome {
        var parser = Parser(limits: limits)
        parser.expectResponse(headRequest: headRequests[0])
        var responses = 0
        var out = Outcome()
        var pending: [UInt8] = []
        var offset = 0
        var start = 0
        func record(_ event: Parser.Event, _ parser: Parser) {
            switch event {
            case .interim(let status):
                out.events.append("interim(\(status))@\(offset)")
                out.interims.append(parser.head.endToEndFields().map { "\($0.name): \($0.value)" }.joined(separator: "|"))
            case .head(let framing):
                out.events.append("head(\(framing))@\(offset)")
                out.heads.append(describe(parser))
                out.bodies.append([])
            case .end: out.events.append("end@\(offset)")
            case .body: break
            }
        }
        for cut in cuts + [input.count] where cut >= start {
            pending += input[start..<cut]
            start = cut
            while true {
                let result: (consumed: Int, event: Parser.Event?)
                do {
                    result = try feed(&parser, pending)
                } catch {
                    out.failure = error.reason
                    return out
                }
                #expect(result.consumed >= 0 && result.consumed <= pending.count)
                if case .body(let range)? = result.event {
                    #expect(!range.isEmpty && range.lowerBound >= 0 && range.upperBound <= result.consumed)
                    out.bodies[out.bodies.count - 1] += pending[range]
                }
                if result.event == nil {
                    #expect(result.consumed == pending.count || result.consumed == 0, "an event-less call left bytes")
                }
                pending.removeFirst(result.consumed)
                offset += result.consumed
                guard let event = result.event else { break }
                record(event, parser)
                if event == .end {
                    responses += 1
                    if responses < headRequests.count { parser.expectResponse(headRequest: headRequests[responses]) }
                }
            }
        }
        if finish {
            do throws(Parser.Failure) {
                if let event = try parser.finish() { record(event, parser) }
            } catch {
                out.failure = error.reason
                return out
            }
        }
        out.consumed = offset
        return out
    }

    /// `run` whole, at every single cut and byte at a time: all the same. Returns the whole run.
    @discardableResult
    static func everySplit(
        _ text: String, headRequests: [Bool] = [false], limits: Parser.Limits = .default,
        sourceLocation: SourceLocation = #_sourceLocation
    ) -> Outcome {
        let input = b(text)
        let whole = run(input, headRequests: headRequests, limits: limits)
        for cut in 1..<max(1, input.count) {
            let split = run(input, cuts: [cut], headRequests: headRequests, limits: limits)
            #expect(split == whole, "split at \(cut)", sourceLocation: sourceLocation)
            if split != whole { break }
        }
        #expect(
            run(input, cuts: Array(0..<input.count), headRequests: headRequests, limits: limits) == whole,
            "byte at a time", sourceLocation: sourceLocation)
        return whole
    }

    static func expectFailure(
        _ text: String, _ reason: String, headRequests: [Bool] = [false],
        limits: Parser.Limits = .default, sourceLocation: SourceLocation = #_sourceLocation
    ) {
        let whole = everySplit(text, headRequests: headRequests, limits: limits, sourceLocation: sourceLocation)
        #expect(whole.failure == reason, "\(whole)", sourceLocation: sourceLocation)
    }

    // MARK: valid responses

    @Test func contentLengthBody() {
        let text = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello"
        let o = Self.everySplit(text)
        #expect(o.events == ["head(length(5))@\(text.utf8.count - 5)", "end@\(text.utf8.count)"])
        #expect(o.bodies == [Self.b("hello")])
        #expect(o.heads == ["200 OK|Content-Type: text/plain|Content-Length: 5|true|1"])
        #expect(o.failure == nil && o.consumed == text.utf8.count)
    }

    @Test func chunkedWithExtensionsAndTrailers() {
        let head = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        let text =
            head
            + "5;name=value\r\nhello\r\nA ; x=\"y z\"\r\n0123456789\r\n1 \r\n!\r\n0;last\r\nX-Trailer: t\r\nX-Other:\tu\r\n\r\n"
        let o = Self.everySplit(text)
        #expect(o.events == ["head(chunked)@\(head.utf8.count)", "end@\(text.utf8.count)"])
        #expect(o.bodies == [Self.b("hello0123456789!")])
        // Trailer fields are dropped: the head keeps its own fields only.
        #expect(o.heads == ["200 OK|Transfer-Encoding: chunked|true|1"])
    }

    @Test func closeDelimitedBody() {
        let head = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n"
        let text = head + "everything until the close\r\n\r\nHTTP/1.1 200 OK\r\n"
        let o = Self.everySplit(text)
        #expect(o.events == ["head(close)@\(head.utf8.count)", "end@\(text.utf8.count)"])
        #expect(o.bodies == [Array(Self.b(text).dropFirst(head.utf8.count))])
        #expect(o.heads == ["200 OK|Content-Type: text/plain|false|1"])
    }

    @Test func bodilessResponses() {
        // HEAD: Content-Length describes the GET's body; none follows.
        let head = "HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n"
        var o = Self.everySplit(head, headRequests: [true])
        #expect(o.events == ["head(none)@\(head.utf8.count)", "end@\(head.utf8.count)"])
        #expect(o.bodies == [[]] && o.heads == ["200 OK|Content-Length: 1234|true|1"])
        // A HEAD answered with chunked framing has no body either.
        o = Self.everySplit("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", headRequests: [true])
        #expect(o.events.first?.hasPrefix("head(none)") == true && o.events.count == 2)

        let noContent = "HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n"
        o = Self.everySplit(noContent)
        #expect(o.events == ["head(none)@\(noContent.utf8.count)", "end@\(noContent.utf8.count)"])
        #expect(o.heads == ["204 No Content|Content-Length: 0|true|1"])

        let notModified = "HTTP/1.1 304 Not Modified\r\nETag: \"v1\"\r\nContent-Length: 99\r\n\r\n"
        o = Self.everySplit(notModified)
        #expect(o.events == ["head(none)@\(notModified.utf8.count)", "end@\(notModified.utf8.count)"])
        #expect(o.bodies == [[]])

        // Bytes after a bodiless response are not its body: they are left unconsumed.
        o = Self.everySplit(noContent + "stray")
        #expect(o.events == ["head(none)@\(noContent.utf8.count)", "end@\(noContent.utf8.count)"])
        #expect(o.consumed == noContent.utf8.count)
    }

    @Test func interimHeadsThenFinal() {
        let interim1 = "HTTP/1.1 100 Continue\r\n\r\n"
        let interim2 = "HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\nConnection: close\r\n\r\n"
        let final = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n"
        let text = interim1 + interim2 + final + "ok"
        let o = Self.everySplit(text)
        let a = interim1.utf8.count
        let b = a + interim2.utf8.count
        let c = b + final.utf8.count
        #expect(o.events == ["interim(100)@\(a)", "interim(103)@\(b)", "head(length(2))@\(c)", "end@\(c + 2)"])
        #expect(o.heads == ["200 OK|Content-Length: 2|true|1"])  // nothing of the 1xx heads
        // Each interim head's fields are there to forward when it is reported (hop-by-hop ones
        // aside), whatever the split; its `Connection: close` says nothing of the final one.
        #expect(o.interims == ["", "Link: </style.css>; rel=preload"])
        #expect(o.bodies == [Self.b("ok")])
    }

    @Test func persistence() {
        var o = Self.everySplit("HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 3\r\n\r\nabc")
        #expect(o.heads == ["200 OK|Connection: keep-alive|Content-Length: 3|true|0"])
        #expect(o.bodies == [Self.b("abc")])
        o = Self.everySplit("HTTP/1.0 200 OK\r\nContent-Length: 3\r\n\r\nabc")
        #expect(o.heads == ["200 OK|Content-Length: 3|false|0"])
        o = Self.everySplit("HTTP/1.1 200 OK\r\nConnection: Keep-Alive, CLOSE\r\nContent-Length: 3\r\n\r\nabc")
        #expect(o.heads.first?.hasSuffix("|false|1") == true)
        o = Self.everySplit("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 3\r\n\r\nabc")
        #expect(o.heads == ["200 OK|Connection: close|Content-Length: 3|false|1"])
        #expect(o.bodies == [Self.b("abc")])
        // Close-delimited: never reusable, whatever Connection says.
        o = Self.everySplit("HTTP/1.0 200 OK\r\nConnection: keep-alive\r\n\r\nabc")
        #expect(o.heads == ["200 OK|Connection: keep-alive|false|0"])
    }

    @Test func repeatedIdenticalContentLengths() {
        let o = Self.everySplit("HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\nContent-Length: 5\r\n\r\nhello")
        #expect(o.events.first?.hasPrefix("head(length(5))") == true)
        #expect(o.bodies == [Self.b("hello")])
    }

    @Test func transferCodingsBeforeChunked() {
        let body = "3\r\n\u{1}\u{2}\u{3}\r\n0\r\n\r\n"
        for te in [
            "Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked", "Transfer-Encoding: gzip, Chunked",
            "Transfer-Encoding: gzip;q=1 , chunked",
        ] {
            let o = Self.everySplit("HTTP/1.1 200 OK\r\n\(te)\r\n\r\n" + body)
            #expect(o.events.first?.hasPrefix("head(chunked)") == true, "\(te)")
            #expect(o.bodies == [[1, 2, 3]])
        }
        // A final coding other than chunked: read until the close (RFC 9112 §6.3).
        let o = Self.everySplit("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n" + body)
        #expect(o.events.first?.hasPrefix("head(close)") == true && o.bodies == [Self.b(body)])
    }

    @Test func statusLines() throws {
        var o = Self.everySplit("HTTP/1.1 404\r\nContent-Length: 0\r\n\r\n")
        #expect(o.heads == ["404 |Content-Length: 0|true|1"])
        o = Self.everySplit("HTTP/1.1 500 \r\nContent-Length: 0\r\n\r\n")
        #expect(o.heads == ["500 |Content-Length: 0|true|1"])
        o = Self.everySplit("HTTP/1.1 599 Very\tstrange \u{E9}\r\nContent-Length: 0\r\n\r\n")
        #expect(o.heads == ["599 Very\tstrange \u{E9}|Content-Length: 0|true|1"])
        // Field values: OWS trimmed by the collector's lookups, HTAB and obs-text kept.
        var parser = Parser()
        _ = try Self.feed(&parser, Self.b("HTTP/1.1 200 OK\r\nX-A:  a\tb \u{FF} \r\nEmpty:\r\nContent-Length: 0\r\n\r\n"))
        #expect(parser.head.value("x-a") == "a\tb \u{FF}" && parser.head.value("empty") == "")
    }

    /// Several responses on one connection, `expectResponse` between them.
    @Test func responsesOnOneConnection() {
        let r1 = "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\na"
        let r2 = "HTTP/1.1 204 No Content\r\n\r\n"
        let r3 = "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nbc\r\n0\r\n\r\n"
        let r4 = "HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n"
        let r5 = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
        let o = Self.everySplit(r1 + r2 + r3 + r4 + r5, headRequests: [false, false, false, true, false])
        #expect(
            o.events.map { $0.prefix { $0 != "@" } }
                == [
                    "head(length(1))", "end", "head(none)", "end", "interim(100)", "head(chunked)", "end",
                    "head(none)", "end", "head(length(0))", "end",
                ])
        #expect(o.bodies == [Self.b("a"), [], Self.b("bc"), [], []])
        #expect(o.heads.map { $0.prefix(3) } == ["200", "204", "201", "200", "200"])
        #expect(o.failure == nil && o.consumed == (r1 + r2 + r3 + r4 + r5).utf8.count)
    }

    // MARK: the .end contract

    @Test func endTiming() throws {
        // .length(n): .end from the call after the last .body, consuming nothing.
        var p = Parser()
        let head = Self.b("HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n")
        var r = try Self.feed(&p, head + Self.b("abcEXTRA"))
        #expect(r.consumed == head.count && r.event == .head(.length(3)))
        r = try Self.feed(&p, Self.b("abcEXTRA"))
        #expect(r.consumed == 3 && r.event == .body(0..<3))
        r = try Self.feed(&p, Self.b("EXTRA"))
        #expect(r.consumed == 0 && r.event == .end)
        r = try Self.feed(&p, Self.b("EXTRA"))
        #expect(r.consumed == 0 && r.event == nil)
        #expect(try p.finish() == nil)  // the response had ended: an idle close

        // .none and .length(0): .end from the call right after .head, consuming nothing,
        // with or without bytes available.
        for text in ["HTTP/1.1 204 No Content\r\n\r\n", "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"] {
            p = Parser()
            r = try Self.feed(&p, Self.b(text))
            #expect(r.consumed == text.utf8.count && (r.event == .head(.none) || r.event == .head(.length(0))))
            r = try Self.feed(&p, [])
            #expect(r.consumed == 0 && r.event == .end)
            r = try Self.feed(&p, [])
            #expect(r.consumed == 0 && r.event == nil)
        }

        // .chunked: .end from the call that consumes the trailer section's last LF.
        p = Parser()
        r = try Self.feed(&p, Self.b("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"))
        #expect(r.event == .head(.chunked))
        r = try Self.feed(&p, Self.b("3\r\nabc\r\n0\r\n\r\nNEXT"))
        #expect(r.consumed == 6 && r.event == .body(3..<6))
        r = try Self.feed(&p, Self.b("\r\n0\r\n\r\nNEXT"))
        #expect(r.consumed == 7 && r.event == .end)
        r = try Self.feed(&p, Self.b("NEXT"))
        #expect(r.consumed == 0 && r.event == nil)

        // .close: .end from finish().
        p = Parser()
        r = try Self.feed(&p, Self.b("HTTP/1.1 200 OK\r\n\r\nab"))
        #expect(r.event == .head(.close))
        r = try Self.feed(&p, Self.b("ab"))
        #expect(r.consumed == 2 && r.event == .body(0..<2))
        r = try Self.feed(&p, [])
        #expect(r.consumed == 0 && r.event == nil)
        #expect(try p.finish() == .end)
        #expect(try p.finish() == nil)

        // An .end not yet fetched is delivered by finish().
        p = Parser()
        _ = try Self.feed(&p, Self.b("HTTP/1.1 204 No Content\r\n\r\n"))
        #expect(try p.finish() == .end)
    }

    @Test func hasStartedAndFinishOnAnIdleConnection() throws {
        var p = Parser()
        #expect(!p.hasStarted)
        #expect(try p.finish() == nil)  // closed before any response byte

        p = Parser()
        _ = try Self.feed(&p, Self.b("H"))
        #expect(p.hasStarted)
        #expect(throws: Parser.Failure(reason: "connection closed inside the response head")) { _ = try p.finish() }

        p = Parser()
        _ = try Self.feed(&p, Self.b("HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n"))
        _ = try Self.feed(&p, Self.b("x"))
        #expect(try Self.feed(&p, []).event == .end)
        #expect(p.hasStarted)
        p.expectResponse(headRequest: false)
        #expect(!p.hasStarted && p.head.status == 0 && !p.keepAlive)
        #expect(try p.finish() == nil)

        // A refused first byte counts as started: the origin did answer (badly).
        p = Parser()
        #expect(throws: Parser.Failure.self) { _ = try Self.feed(&p, Self.b("\n")) }
        #expect(p.hasStarted)
    }

    @Test func failureIsFinalUntilExpectResponse() {
        var p = Parser()
        let bad = Parser.Failure(reason: "bare LF in the response head")
        #expect(throws: bad) { _ = try Self.feed(&p, Self.b("HTTP/1.1 200 OK\n")) }
        #expect(throws: bad) { _ = try Self.feed(&p, Self.b("HTTP/1.1 200 OK\r\n\r\n")) }
        #expect(throws: bad) { _ = try p.finish() }
        // expectResponse starts afresh (a pooled parser serves another connection).
        p.expectResponse(headRequest: false)
        #expect(!p.hasStarted)
        #expect(throws: Never.self) {
            let r = try Self.feed(&p, Self.b("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"))
            #expect(r.event == .head(.length(0)))
        }
    }

    // MARK: refusals

    @Test func framingConflicts() {
        Self.expectFailure(
            "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\nabc",
            "Content-Length together with Transfer-Encoding")
        Self.expectFailure(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
            "Content-Length together with Transfer-Encoding")
        // Also on a bodiless response: the head itself is contradictory.
        Self.expectFailure(
            "HTTP/1.1 304 Not Modified\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
            "Content-Length together with Transfer-Encoding")
        Self.expectFailure(
            "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd", "differing Content-Length values")
        Self.expectFailure("HTTP/1.1 200 OK\r\nContent-Length: 3, 4\r\n\r\nabcd", "differing Content-Length values")
        Self.expectFailure("HTTP/1.1 200 OK\r\nContent-Length: 5, 05\r\n\r\nhello", "differing Content-Length values")
        for value in ["+5", "-5", "0x5", "5 5", "", "5,", " , 5", "1234567890123456789", "5a"] {
            Self.expectFailure("HTTP/1.1 200 OK\r\nContent-Length: \(value)\r\n\r\nhello", "invalid Content-Length")
        }
        Self.expectFailure(
            "HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", "Transfer-Encoding in an HTTP/1.0 response")
        Self.expectFailure(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, chunked\r\n\r\n", "chunked more than once in Transfer-Encoding")
        Self.expectFailure(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
            "chunked more than once in Transfer-Encoding")
        Self.expectFailure(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", "chunked is not the final transfer coding")
        Self.expectFailure(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked;x=1\r\n\r\n", "parameters on the chunked transfer coding")
        for value in ["", "gzip,", "gzip, , chunked", "\"chunked\"", "gzip x"] {
            Self.expectFailure("HTTP/1.1 200 OK\r\nTransfer-Encoding: \(value)\r\n\r\n", "invalid Transfer-Encoding")
        }
    }

    @Test func lineEndsAndFieldSyntax() {
        Self.expectFailure("HTTP/1.1 200 OK\nContent-Length: 0\r\n\r\n", "bare LF in the response head")
        Self.expectFailure("HTTP/1.1 200 OK\r\nContent-Length: 0\n\r\n", "bare LF in the response head")
        Self.expectFailure("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\n", "bare LF in the response head")
        Self.expectFailure("HTTP/1.1 200 OK\r\nX: a\rb\r\n\r\n", "bare CR in the response head")
        Self.expectFailure("HTTP/1.1 200 OK\r\r\n\r\n", "bare CR in the response head")
        Self.expectFailure(
            "HTTP/1.1 200 OK\r\nX: a\r\n b\r\nContent-Length: 0\r\n\r\n", "obsolete line folding in a header field")
        Self.expectFailure("HTTP/1.1 200 OK\r\nX: a\r\n\tb\r\n\r\n", "obsolete line folding in a header field")
        Self.expectFailure(
            "HTTP/1.1 200 OK\r\nContent-Length : 0\r\n\r\n", "whitespace between a header field name and the colon")
        Self.expectFailure("HTTP/1.1 200 OK\r\nX\t: a\r\n\r\n", "whitespace between a header field name and the colon")
        Self.expectFailure("HTTP/1.1 200 OK\r\nX: a\u{0}b\r\n\r\n", "NUL or control character in a header field value")
        Self.expectFailure("HTTP/1.1 200 OK\r\nX: a\u{1}b\r\n\r\n", "NUL or control character in a header field value")
        Self.expectFailure("HTTP/1.1 200 OK\r\nX: a\u{7F}\r\n\r\n", "NUL or control character in a header field value")
        // HTABs inside a value's eight-byte words: the value scan goes on after each, and still
        // stops at a control byte later in the same word (or a bare CR).
        Self.expectFailure(
            "HTTP/1.1 200 OK\r\nX: ab\tc\u{0}defghijklmn\r\n\r\n", "NUL or control character in a header field value")
        Self.expectFailure("HTTP/1.1 200 OK\r\nX: a\t\tb\rcdefghijk\r\n\r\n", "bare CR in the response head")
        let tabs = "HTTP/1.1 200 OK\r\nX: a\tb\t\tcdefghij\tklmnopqrstu\t\r\nContent-Length: 0\r\n\r\n"
        let o = Self.everySplit(tabs)
        #expect(o.failure == nil && o.heads == ["200 OK|X: a\tb\t\tcdefghij\tklmnopqrstu\t|Content-Length: 0|true|1"])
        Self.expectFailure("HTTP/1.1 200 OK\r\n: a\r\n\r\n", "empty header field name")
        Self.expectFailure("HTTP/1.1 200 OK\r\nNo colon here\r\n\r\n", "whitespace between a header field name and the colon")
        Self.expectFailure("HTTP/1.1 200 OK\r\nNoColon\r\n\r\n", "header field line without a colon")
        Self.expectFailure("HTTP/1.1 200 OK\r\nX@Y: a\r\n\r\n", "invalid character in a header field name")
        Self.expectFailure("HTTP/1.1 200 OK\r\nX\u{0}: a\r\n\r\n", "invalid character in a header field name")
        // Interim heads are held to the same syntax.
        Self.expectFailure(
            "HTTP/1.1 100 Continue\r\nX : y\r\n\r\nHTTP/1.1 200 OK\r\n\r\n",
            "whitespace between a header field name and the colon")
    }

    @Test func statusLineRefusals() {
        Self.expectFailure("HTTP/1.1 99 Low\r\n\r\n", "malformed status line (status code)")
        Self.expectFailure("HTTP/1.1 099 Low\r\n\r\n", "status code 99 out of range")
        Self.expectFailure("HTTP/1.1 600 High\r\n\r\n", "status code 600 out of range")
        Self.expectFailure("HTTP/1.1 2000 OK\r\n\r\n", "malformed status line (status code)")
        Self.expectFailure("HTTP/1.1 20x OK\r\n\r\n", "malformed status line (status code)")
        Self.expectFailure("HTTP/2 200\r\n\r\n", "malformed status line (version)")
        Self.expectFailure("HTTP/1.2 200 OK\r\n\r\n", "malformed status line (version)")
        Self.expectFailure("HTTP/2.0 200 OK\r\n\r\n", "malformed status line (version)")
        Self.expectFailure("http/1.1 200 OK\r\n\r\n", "malformed status line (version)")
        Self.expectFailure("HTTP/1.1  200 OK\r\n\r\n", "malformed status line (status code)")
        Self.expectFailure("HTTP/1.1 200 O\u{1}K\r\n\r\n", "control character in the reason phrase")
        Self.expectFailure("\r\nHTTP/1.1 200 OK\r\n\r\n", "empty line where a status line was expected")
        Self.expectFailure("ICY 200 OK\r\n\r\n", "malformed status line (version)")
        Self.expectFailure(
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
            "101 Switching Protocols without an upgrade request")
    }

    @Test func limits() {
        let small = Parser.Limits(headerSection: 64, headerCount: 3, interimResponses: 16)
        Self.expectFailure(
            "HTTP/1.1 200 OK\r\nX-Long: \(String(repeating: "y", count: 60))\r\n\r\n",
            "response head larger than 64 bytes", limits: small)
        // Detected before the line ends: an endless line cannot grow memory.
        Self.expectFailure(
            "HTTP/1.1 200 OK\r\nX-Long: \(String(repeating: "y", count: 100))", "response head larger than 64 bytes",
            limits: small)
        // Exactly at the limit (the final CRLF included) is accepted.
        let exact = "HTTP/1.1 200 OK\r\nX: \(String(repeating: "y", count: 40))\r\n\r\n"
        #expect(exact.utf8.count == 64)
        #expect(Self.everySplit(exact, limits: small).failure == nil)
        Self.expectFailure("HTTP/1.1 200 OK\r\nA: 1\r\nB: 2\r\nC: 3\r\nD: 4\r\n\r\n", "more than 3 header fields", limits: small)
        let three = Self.everySplit("HTTP/1.1 200 OK\r\nA: 1\r\nB: 2\r\nContent-Length: 0\r\n\r\n", limits: small)
        #expect(three.failure == nil && three.events.count == 2)

        let interim = String(repeating: "HTTP/1.1 100 Continue\r\n\r\n", count: 16)
        let sixteen = Self.everySplit(interim + "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        #expect(sixteen.failure == nil && sixteen.events.count == 18)
        Self.expectFailure(
            interim + "HTTP/1.1 103 Early Hints\r\n\r\nHTTP/1.1 200 OK\r\n\r\n", "1xx flood: more than 16 interim responses")
    }

    @Test func chunkedRefusals() {
        let head = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        for size in ["", "g", "-1", " 5", "0x5", "+5", "5 6", "5\t;x\u{1}"] {
            let reason = size.hasSuffix("\u{1}") ? "invalid chunk extension" : "invalid chunk size"
            Self.expectFailure(head + size + "\r\nhello\r\n0\r\n\r\n", reason)
        }
        Self.expectFailure(head + "1000000000000000\r\n", "chunk size too large")
        Self.expectFailure(head + "0000000000000005\r\nhello\r\n0\r\n\r\n", "chunk size too large")
        let big = Self.everySplit(head + "FFFFFFFFFFFFFFF\r\nabc")  // 15 digits: announced, read as it comes
        #expect(big.failure == "truncated chunked body" && big.bodies == [Self.b("abc")])
        Self.expectFailure(head + "5;\(String(repeating: "e", count: 4096))\r\nhello\r\n0\r\n\r\n", "chunk-size line too long")
        Self.expectFailure(head + "5\rhello\r\n0\r\n\r\n", "bare CR in a chunk-size line")
        Self.expectFailure(head + "5\nhello\r\n0\r\n\r\n", "invalid chunk size")
        Self.expectFailure(head + "5\r\nhelloXX0\r\n\r\n", "missing CRLF after chunk data")
        Self.expectFailure(head + "5\r\nhello\rX0\r\n\r\n", "missing CRLF after chunk data")
        Self.expectFailure(head + "5\r\nhello\n0\r\n\r\n", "missing CRLF after chunk data")
        Self.expectFailure(head + "0\r\nX: a\r\n b\r\n\r\n", "obsolete line folding in a trailer field")
        Self.expectFailure(head + "0\r\nX : a\r\n\r\n", "whitespace between a trailer field name and the colon")
        Self.expectFailure(head + "0\r\nX: a\nY: b\r\n\r\n", "bare LF in the trailer section")
        Self.expectFailure(head + "0\r\nX: a\u{0}\r\n\r\n", "NUL or control character in a trailer field value")
        Self.expectFailure(head + "0\r\n\n", "bare LF in the trailer section")
        let small = Parser.Limits(headerSection: 64, headerCount: 3, interimResponses: 16)
        Self.expectFailure(
            head + "0\r\nT: \(String(repeating: "t", count: 70))\r\n\r\n",
            "trailer section larger than 64 bytes", limits: small)
        Self.expectFailure(head + "0\r\nA: 1\r\nB: 2\r\nC: 3\r\nD: 4\r\n\r\n", "more than 3 trailer fields", limits: small)
    }

    @Test func endOfFileRefusals() {
        Self.expectFailure("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel", "truncated chunked body")
        Self.expectFailure("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n", "truncated chunked body")
        Self.expectFailure("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX: y\r\n", "truncated chunked body")
        Self.expectFailure("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", "truncated chunked body")
        Self.expectFailure("HTTP/1.1 200 OK\r\nContent-Le", "connection closed inside the response head")
        Self.expectFailure("HTTP/1.1 200 OK\r\nContent-Length: 1\r\n", "connection closed inside the response head")
        Self.expectFailure("HTTP/1.1 100 Continue\r\n\r\n", "connection closed inside the response head")
        Self.expectFailure("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhello", "connection closed before the response ended")
        Self.expectFailure("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", "connection closed before the response ended")
    }

    // MARK: property: generated responses

    /// SplitMix64, seeded: the same responses on every run.
    struct Random {
        var state: UInt64
        mutating func next() -> UInt64 {
            state &+= 0x9E37_79B9_7F4A_7C15
            var z = state
            z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
            z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
            return z ^ (z >> 31)
        }
        mutating func int(_ range: ClosedRange<Int>) -> Int { range.lowerBound + Int(next() % UInt64(range.count)) }
        mutating func chance(_ percent: Int) -> Bool { int(0...99) < percent }
        mutating func token() -> String {
            let chars = Array("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.!#$%&'*+^`|~")
            return String((0..<int(1...12)).map { _ in chars[int(0...(chars.count - 1))] })
        }
        mutating func value() -> String {
            let chars = Array("abc XYZ 019 ;=,/\"()<>@[]{}?\t")
            var v = String((0..<int(0...30)).map { _ in chars[int(0...(chars.count - 1))] })
            while v.first == " " || v.first == "\t" { v.removeFirst() }
            return v
        }
    }

    /// One generated response: its bytes and what the parser must make of them.
    struct Generated {
        var bytes: [UInt8] = []
        var headRequest = false
        var events: [String] = []
        var body: [UInt8]?
        var keepAlive = false
    }

    static func generate(_ r: inout Random, last: Bool) -> Generated {
        var g = Generated()
        var text: [UInt8] = []
        for _ in 0..<r.int(0...2) where r.chance(30) {
            let status = [100, 102, 103][r.int(0...2)]
            text += b("HTTP/1.1 \(status) Interim\r\n")
            for _ in 0..<r.int(0...2) { text += b("\(r.token()): \(r.value())\r\n") }
            text += b("\r\n")
            g.events.append("interim(\(status))")
        }
        let minor = r.chance(20) ? 0 : 1
        let status = [200, 200, 201, 203, 206, 404, 500, 204, 304][r.int(0...8)]
        g.headRequest = r.chance(15)
        let bodiless = g.headRequest || status == 204 || status == 304
        var kinds = ["length"]
        if minor == 1 { kinds.append("chunked") }
        if last { kinds.append("close") }
        let kind = bodiless ? "none" : kinds[r.int(0...(kinds.count - 1))]
        var body: [UInt8] = (0..<r.int(0...300)).map { _ in UInt8(truncatingIfNeeded: r.next()) }
        if kind == "none" { body = [] }
        text += b("HTTP/1.\(minor) \(status) Reason \(r.token())\r\n")
        var fields = (0..<r.int(0...6)).map { _ in "X-\(r.token()): \(r.value())" }
        var close = false
        if minor == 0 {
            if r.chance(80) { fields.append("Connection: keep-alive") } else { close = true }
        } else if r.chance(15) {
            fields.append("Connection: close")
            close = true
        }
        switch kind {
        case "length": fields.append("Content-Length: \(body.count)")
        case "chunked": fields.append(r.chance(50) ? "Transfer-Encoding: chunked" : "Transfer-Encoding: gzip, chunked")
        case "none" where r.chance(50): fields.append("Content-Length: \(r.int(0...999))")
        default: break
        }
        for _ in 0..<fields.count { fields.swapAt(r.int(0...(fields.count - 1)), r.int(0...(fields.count - 1))) }
        for f in fields { text += b(f + "\r\n") }
        text += b("\r\n")
        let framing: String
        switch kind {
        case "length": framing = body.isEmpty ? "length(0)" : "length(\(body.count))"
        case "chunked": framing = "chunked"
        case "close": framing = "close"
        default: framing = "none"
        }
        g.events.append("head(\(framing))")
        if kind == "chunked" {
            var rest = body[...]
            while !rest.isEmpty {
                let n = min(rest.count, r.int(1...80))
                let hex = String(n, radix: 16, uppercase: r.chance(50))
                text += b(r.chance(20) ? "\(hex);ext=\(r.token())\r\n" : "\(hex)\r\n")
                text += rest.prefix(n)
                text += b("\r\n")
                rest = rest.dropFirst(n)
            }
            text += b("0\r\n")
            for _ in 0..<r.int(0...2) { text += b("\(r.token()): \(r.value())\r\n") }
            text += b("\r\n")
        } else {
            text += body
        }
        g.events.append("end")
        g.bytes = text
        g.body = body
        g.keepAlive = !close && kind != "close"
        return g
    }

    @Test func generatedResponsesAtRandomSplits() {
        var r = Random(state: 0x5EED)
        for round in 0..<300 {
            let count = r.int(1...4)
            let responses = (0..<count).map { i in Self.generate(&r, last: i == count - 1) }
            let input = responses.flatMap(\.bytes)
            let heads = responses.map(\.headRequest)
            let expectedEvents = responses.flatMap(\.events)
            let expectedBodies = responses.map { $0.body ?? [] }
            let whole = Self.run(input, headRequests: heads)
            #expect(whole.failure == nil, "round \(round): \(whole.failure ?? "")")
            #expect(whole.events.map { String($0.prefix { $0 != "@" }) } == expectedEvents, "round \(round)")
            #expect(whole.bodies == expectedBodies, "round \(round)")
            #expect(
                whole.heads.map { $0.split(separator: "|").dropLast().last.map(String.init) }
                    == responses.map { "\($0.keepAlive)" }, "round \(round): keepAlive")
            #expect(whole.consumed == input.count)
            for _ in 0..<4 {
                let cuts = (0..<r.int(1...12)).map { _ in r.int(0...input.count) }.sorted()
                #expect(Self.run(input, cuts: cuts, headRequests: heads) == whole, "round \(round), cuts \(cuts)")
            }
        }
    }
}
