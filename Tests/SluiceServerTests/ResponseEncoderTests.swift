import CLibEvent
import HTTPTypes
import SluiceCore
import Testing

@testable import SluiceServer

/// Collects `lines` (each given without its CRLF) as libcurl would hand them over.
private func collect(_ lines: [String]) -> (ResponseHeadCollector, completed: Bool) {
    var head = ResponseHeadCollector()
    var completed = false
    for line in lines + [""] {
        let bytes = Array((line + "\r\n").utf8)
        completed = bytes.withUnsafeBytes { head.add($0) } || completed
    }
    return (head, completed)
}

/// What `ResponseEncoder` wrote into a fresh evbuffer, and the framing it chose.
private func encode(
    _ lines: [String], head: Bool = false, minor: Int = 1, keepAlive: Bool = true
)
    -> (text: String, framing: ResponseEncoder.Framing?, error: String?)
{
    let (collected, _) = collect(lines)
    let output = evbuffer_new()!
    defer { evbuffer_free(output) }
    var framing: ResponseEncoder.Framing?
    var failure: String?
    do {
        framing = try ResponseEncoder.forwardedHead(
            collected, isHeadRequest: head, clientMinorVersion: minor,
            keepAlive: keepAlive, viaLine: Array("Via: 1.1 test\r\n".utf8),
            into: output)
    } catch {
        failure = error.reason
    }
    return (drain(output), framing, failure)
}

private func drain(_ output: OpaquePointer) -> String {
    let n = evbuffer_get_length(output)
    var bytes = [UInt8](repeating: 0, count: n)
    bytes.withUnsafeMutableBytes { _ = evbuffer_remove(output, $0.baseAddress, n) }
    return String(decoding: bytes, as: UTF8.self)
}

@Suite struct ResponseHeadCollectorTests {
    @Test func finalHeadIsCompleteAtTheEmptyLine() {
        var head = ResponseHeadCollector()
        let lines = ["HTTP/1.1 200 OK\r\n", "Content-Length: 3\r\n"]
        for line in lines {
            #expect(!Array(line.utf8).withUnsafeBytes { head.add($0) })
        }
        #expect(Array("\r\n".utf8).withUnsafeBytes { head.add($0) })
        #expect(head.status == 200 && head.isComplete)
        #expect(String(decoding: head.reason, as: UTF8.self) == "OK")
        #expect(head.value("content-length") == "3")
    }

    /// libcurl hands a chunked body's trailer fields to the header callback after the final
    /// head: they are not added to it (nor is the empty line after them a second head), but a
    /// status line after a complete head (a parent's CONNECT answer, then the origin's) starts
    /// the next head.
    @Test func trailerFieldsAfterTheFinalHeadAreDropped() {
        var (head, completed) = collect(["HTTP/1.1 200 OK", "Transfer-Encoding: chunked", "Trailer: X-T"])
        #expect(completed && head.lineCount == 2)
        for line in ["X-T: v\r\n", "\r\n"] { _ = Array(line.utf8).withUnsafeBytes { head.add($0) } }
        #expect(head.lineCount == 2 && head.value("x-t") == nil && head.isComplete)
        (head, completed) = collect(["HTTP/1.1 200 Connection established", "", "HTTP/1.1 204 No Content", "X-A: 1"])
        #expect(completed && head.status == 204 && head.lineCount == 1 && head.value("x-a") == "1")
    }

    @Test func interimHeadsAreDropped() {
        let (head, completed) = collect(["HTTP/1.1 100 Continue", "", "HTTP/1.1 201 Created", "X-A: 1"])
        #expect(completed && head.status == 201)
        #expect(head.lineCount == 1 && head.value("x-a") == "1")
    }

    @Test func anInterimHeadAloneIsNotComplete() {
        let (head, completed) = collect(["HTTP/1.1 103 Early Hints", "Link: </a>"])
        #expect(!completed && !head.isComplete && head.status == 103)
    }

    @Test func obsFoldIsJoinedWithOneSpace() {
        let (head, _) = collect(["HTTP/1.1 200 OK", "X-Long: one", " \t two", "X-B: b"])
        #expect(head.value("x-long") == "one two")
        #expect(head.value("x-b") == "b")
    }

    @Test func http2StatusLineHasNoReason() {
        let (head, _) = collect(["HTTP/2 204"])
        #expect(head.status == 204 && head.reason.isEmpty)
    }

    @Test func valueLookupIgnoresCaseAndTrims() {
        let (head, _) = collect(["HTTP/1.1 200 OK", "Retry-After:   120  ", "retry-after: 5"])
        #expect(head.value("retry-after") == "120")
        #expect(head.value("location") == nil)
    }

    /// Lines past the collector's first room (256 bytes) grow it; a copy kept while the
    /// original is reset and collects another head reads its own lines, and so does the
    /// original.
    @Test func aCollectorGrowsAndACopyKeepsItsLines() {
        let long = String(repeating: "v", count: 300)
        var (head, _) = collect(["HTTP/1.1 200 OK", "X-Long: " + long, "X-B: 2"])
        let kept = head
        head.reset()
        for line in ["HTTP/1.1 404 Not Found", "X-C: 3", ""] {
            _ = Array((line + "\r\n").utf8).withUnsafeBytes { head.add($0) }
        }
        #expect(kept.value("x-long") == long && kept.value("x-b") == "2" && kept.value("x-c") == nil)
        #expect(kept.lines.count == ("X-Long: " + long).utf8.count + "X-B: 2".utf8.count)
        #expect(head.status == 404 && head.value("x-c") == "3" && head.value("x-b") == nil)
        #expect(String(decoding: head.lines, as: UTF8.self) == "X-C: 3")
    }

    @Test func resetForgetsEverything() {
        var (head, _) = collect(["HTTP/1.1 500 Oops", "X: y"])
        head.reset()
        #expect(head.status == 0 && head.lines.isEmpty && head.lineCount == 0 && !head.isComplete && head.reason.isEmpty)
    }
}

@Suite struct ResponseEncoderTests {
    @Test func lengthFramedHeadKeepsFieldsInOrderAndAddsVia() {
        let r = encode(["HTTP/1.1 200 OK", "Server: nginx", "Content-Length: 5", "X-A: 1"])
        #expect(r.framing == .length)
        #expect(r.text == "HTTP/1.1 200 OK\r\nServer: nginx\r\nContent-Length: 5\r\nX-A: 1\r\nVia: 1.1 test\r\n\r\n")
    }

    @Test func bodyWithoutLengthIsRechunkedForHTTP11() {
        let r = encode(["HTTP/1.1 200 OK", "Transfer-Encoding: chunked"])
        #expect(r.framing == .chunked)
        #expect(r.text == "HTTP/1.1 200 OK\r\nVia: 1.1 test\r\nTransfer-Encoding: chunked\r\n\r\n")
    }

    @Test func bodyWithoutLengthIsCloseDelimitedForHTTP10() {
        let r = encode(["HTTP/1.1 200 OK"], minor: 0)
        #expect(r.framing == .close)
        #expect(r.text.hasSuffix("Via: 1.1 test\r\nConnection: close\r\n\r\n"))
    }

    @Test func lengthIsDroppedWhenTransferEncodingIsPresent() {
        let r = encode(["HTTP/1.1 200 OK", "Content-Length: 5", "Transfer-Encoding: chunked"])
        #expect(r.framing == .chunked && !r.text.contains("Content-Length"))
    }

    @Test func bodilessResponsesKeepTheirLengthButHaveNoBody() {
        #expect(encode(["HTTP/1.1 200 OK", "Content-Length: 5"], head: true).framing == ResponseEncoder.Framing.none)
        #expect(encode(["HTTP/1.1 304 Not Modified", "Content-Length: 5"]).text.contains("Content-Length: 5\r\n"))
        #expect(encode(["HTTP/1.1 204 No Content"]).framing == ResponseEncoder.Framing.none)
    }

    @Test func hopByHopAndConnectionListedFieldsAreRemoved() {
        let r = encode([
            "HTTP/1.1 200 OK", "Connection: keep-alive, X-Secret", "Keep-Alive: timeout=5", "TE: trailers",
            "Trailer: X", "Upgrade: h2c", "Proxy-Connection: close", "X-Secret: s", "x-secret: t",
            "X-Kept: k", "Content-Length: 0",
        ])
        #expect(r.text == "HTTP/1.1 200 OK\r\nX-Kept: k\r\nContent-Length: 0\r\nVia: 1.1 test\r\n\r\n")
    }

    @Test func aFieldNamedCloseGoesWithConnectionClose() {
        let r = encode(["HTTP/1.1 200 OK", "Connection: close", "Close: x", "Content-Length: 0"])
        #expect(!r.text.contains("Close: x"))
    }

    @Test func keepAliveFalsePromisesToClose() {
        let r = encode(["HTTP/1.1 200 OK", "Content-Length: 0"], keepAlive: false)
        #expect(r.text.hasSuffix("Via: 1.1 test\r\nConnection: close\r\n\r\n"))
    }

    @Test func valuesCannotInjectFields() {
        // A value with a NUL (CR and LF cannot reach the collector inside one line).
        let r = encode(["HTTP/1.1 200 OK", "X-A: a\u{0}b", "Content-Length: 0"])
        #expect(r.text.contains("X-A: a b\r\n"))
    }

    /// Removed (RFC 9112 §5.1), but refused before the framing fields: libcurl reads
    /// `Content-Length : 5` as no length at all (the body to the close), and a mended head
    /// would frame for the client what libcurl did not.
    @Test func whitespaceBeforeTheColonIsRemovedOrRefused() {
        let r = encode(["HTTP/1.1 200 OK", "X-A \t: v", "Content-Length: 0"])
        #expect(r.text.contains("\r\nX-A: v\r\n"))
        for line in ["Content-Length : 5", "transfer-encoding\t: chunked"] {
            let r = encode(["HTTP/1.1 200 OK", line, "Content-Length: 5"])
            #expect(r.error == "whitespace between a header field name and the colon" && r.text.isEmpty, "\(line)")
        }
    }

    /// `Connection` names hop-by-hop fields: naming the length does not drop it (the body is
    /// framed by it, and the client must be told).
    @Test func connectionNamingTheLengthKeepsIt() {
        let r = encode(["HTTP/1.1 200 OK", "Connection: content-length, x-hop", "X-Hop: 1", "Content-Length: 5"])
        #expect(r.framing == .length && r.text.contains("\r\nContent-Length: 5\r\n") && !r.text.contains("X-Hop"), "\(r)")
    }

    @Test func missingOrInvalidReasonGetsSluicesOwn() {
        #expect(encode(["HTTP/2 404"]).text.hasPrefix("HTTP/1.1 404 Not Found\r\n"))
        #expect(encode(["HTTP/1.1 502 \u{7F}"]).text.hasPrefix("HTTP/1.1 502 Bad Gateway\r\n"))
    }

    @Test(arguments: [
        (["HTTP/1.1 200 OK", "Content-Length: 5", "Content-Length: 6"], "invalid or differing Content-Length"),
        (["HTTP/1.1 200 OK", "Content-Length: 5, 6"], "invalid or differing Content-Length"),
        (["HTTP/1.1 200 OK", "Content-Length: -1"], "invalid or differing Content-Length"),
        (["HTTP/1.1 200 OK", "Content-Length: "], "invalid or differing Content-Length"),
        (["HTTP/1.1 200 OK", "Bad Name: x"], "invalid header field name"),
        (["HTTP/1.1 200 OK", ": x"], "invalid header field name"),
        (["HTTP/1.1 200 OK", "no colon"], "header line without a colon"),
        (["HTTP/1.1 999 What"], "invalid status code"),
    ])
    func refusedHeadsWriteNothing(lines: [String], reason: String) {
        let r = encode(lines)
        #expect(r.error == reason)
        #expect(r.text.isEmpty)
    }

    @Test func equalContentLengthsAreOne() {
        let r = encode(["HTTP/1.1 200 OK", "Content-Length: 5, 5"])
        #expect(r.framing == .length && r.error == nil)
    }

    @Test func chunksAreSizedInHex() {
        let output = evbuffer_new()!
        defer { evbuffer_free(output) }
        let data = [UInt8](repeating: 0x61, count: 300)
        data.withUnsafeBytes { ResponseEncoder.chunk($0, into: output) }
        ResponseEncoder.lastChunk(into: output)
        #expect(drain(output) == "12c\r\n" + String(repeating: "a", count: 300) + "\r\n0\r\n\r\n")
    }

    @Test func sluicesOwnErrorResponse() {
        let output = evbuffer_new()!
        defer { evbuffer_free(output) }
        ResponseEncoder.error(.loopDetected, close: true, into: output)
        let body = "sluice: \(ProxyError.loopDetected.message)\n"
        #expect(
            drain(output) == "HTTP/1.1 508 Loop Detected\r\nContent-Type: text/plain; charset=utf-8\r\n"
                + "Content-Length: \(body.utf8.count)\r\nConnection: close\r\n\r\n" + body)
    }
}

/// The fields the shared cache keeps of a response head.
@Suite struct ResponseHeadCacheFieldsTests {
    @Test func endToEndFieldsDropHopByHopAndFraming() {
        let (head, _) = collect([
            "HTTP/1.1 200 OK", "Content-Length: 5", "Connection: keep-alive, X-Hop",
            "X-Hop: 1", "Keep-Alive: timeout=5", "Transfer-Encoding: chunked",
            "Cache-Control:  max-age=60 ", "ETag: \"a\"", "Set-Cookie: s=1", "bad name: x",
        ])
        let fields = head.endToEndFields()
        #expect(fields.map(\.name) == ["Cache-Control", "ETag", "Set-Cookie"])
        #expect(fields[0].value == "max-age=60")
    }

    @Test func extraLinesFollowVia() {
        let (collected, _) = collect(["HTTP/1.1 200 OK", "Content-Length: 0"])
        let output = evbuffer_new()!
        defer { evbuffer_free(output) }
        _ = try? ResponseEncoder.forwardedHead(
            collected, isHeadRequest: false, clientMinorVersion: 1, keepAlive: true,
            viaLine: Array("Via: 1.1 t\r\n".utf8),
            extraLines: Array("Cache-Status: Sluice; fwd=uri-miss\r\n".utf8), into: output)
        #expect(
            drain(output) == "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nVia: 1.1 t\r\nCache-Status: Sluice; fwd=uri-miss\r\n\r\n")
    }
}

/// A head read by Sluice's own response parser carries its validated field ranges; the
/// encoder must write exactly what it writes for the same lines collected from libcurl.
@Suite struct ValidatedHeadEncodingTests {
    private func parsed(_ lines: [String]) -> ResponseHeadCollector? {
        var parser = HTTPResponseParser()
        parser.expectResponse(headRequest: false)
        let bytes = Array((lines.joined(separator: "\r\n") + "\r\n\r\n").utf8)
        var offset = 0
        while offset < bytes.count {
            guard let step = try? bytes.withUnsafeBytes({ try parser.parse(UnsafeRawBufferPointer(rebasing: $0[offset...])) })
            else { return nil }
            offset += step.consumed
            if case .head? = step.event { return parser.head }
            if step.event == nil && step.consumed == 0 { return nil }
        }
        return nil
    }

    private func encoded(_ head: ResponseHeadCollector, minor: Int = 1, keepAlive: Bool = true) -> String {
        let output = evbuffer_new()!
        defer { evbuffer_free(output) }
        _ = try? ResponseEncoder.forwardedHead(
            head, isHeadRequest: false, clientMinorVersion: minor, keepAlive: keepAlive,
            viaLine: Array("Via: 1.1 test\r\n".utf8), into: output)
        return drain(output)
    }

    @Test(arguments: [
        ["HTTP/1.1 200 OK", "Server: nginx", "Content-Length: 5", "ETag: \"x\"", "Connection: keep-alive"],
        ["HTTP/1.1 404 Not Found", "Transfer-Encoding: chunked", "X-Empty:", "X-Spaces:   padded value \t"],
        [
            "HTTP/1.1 200 ", "Connection: close, X-Drop", "X-Drop: gone", "Keep-Alive: timeout=5", "TE: trailers",
            "Upgrade: h2c", "Proxy-Connection: keep-alive", "Trailer: X-T", "Content-Type: text/plain; charset=\u{e9}",
        ],
        ["HTTP/1.0 200 OK", "Content-Length: 0", "Content-Length: 0"],
        ["HTTP/1.1 204 No Content", "Date: Thu, 26 Nov 2026 00:00:00 GMT"],
        // Lines copied whole (`Name: value`) beside lines rewritten from their name and value.
        ["HTTP/1.1 200 OK", "X-Tight:value", "X-Two:  spaces", "X-Tab:\tv", "X-Trail: v ", "Content-Length: 0"],
        // The framing facts the parser hands over: every kind of `Connection` list.
        ["HTTP/1.1 200 OK", "Connection: Keep-Alive, , x-drop", "X-Drop: gone", "close: stays", "Content-Length: 2"],
        ["HTTP/1.1 200 OK", "Connection: ,CLOSE", "close: goes", "Content-Length: 2"],
        ["HTTP/1.1 200 OK", "Connection: keep-alive", "Connection: X-Later", "X-Later: gone", "Content-Length: 2"],
        ["HTTP/1.1 200 OK", "Connection: ", "Content-Length: 3", "X-Other: kept"],
    ])
    func sameBytesAsTheCurlPath(_ lines: [String]) throws {
        let head = try #require(parsed(lines))
        #expect(head.isValidated && head.validatedFraming != nil)
        let (curlHead, completed) = collect(lines)
        #expect(completed && !curlHead.isValidated)
        // The validated head's line ends (kept in its fields) are where libcurl's are.
        #expect(head.lines == curlHead.lines && head.lineCount == curlHead.lineCount)
        #expect((0..<head.lineCount).map(head.lineEnd) == (0..<curlHead.lineCount).map(curlHead.lineEnd))
        for (minor, keepAlive) in [(1, true), (0, true), (1, false)] {
            let mine = encoded(head, minor: minor, keepAlive: keepAlive)
            #expect(!mine.isEmpty)
            #expect(mine == encoded(curlHead, minor: minor, keepAlive: keepAlive))
        }
    }
}

/// The parser's framing facts ride only on the final head it validated: never on an interim
/// head, a reset or reused collector, or a head rebuilt from edits — each of which the encoder
/// must read line by line.
@Suite struct ValidatedFramingTests {
    private func feed(_ parser: inout HTTPResponseParser, _ text: String) -> HTTPResponseParser.Event? {
        let bytes = Array(text.utf8)
        return try? bytes.withUnsafeBytes { try parser.parse($0).event }
    }

    @Test func onlyAFinalValidatedHeadCarriesThem() {
        var parser = HTTPResponseParser()
        parser.expectResponse(headRequest: false)
        guard case .interim? = feed(&parser, "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n") else {
            Issue.record("no interim head")
            return
        }
        #expect(parser.head.isValidated && parser.head.validatedFraming == nil)
        guard case .head? = feed(&parser, "HTTP/1.1 200 OK\r\nConnection: close, X-A\r\nContent-Length: 3\r\n\r\n") else {
            Issue.record("no final head")
            return
        }
        let facts = ResponseHeadCollector.ValidatedFraming(
            contentLength: 3, transferEncoding: false, connectionClose: true, connectionNamesFields: true)
        #expect(parser.head.validatedFraming == facts)
        #expect(parser.head.replacingFields(HTTPFields()).validatedFraming == nil)
        #expect(parser.head.reframed(length: 9).validatedFraming == nil)
        var copy = parser.head
        copy.reset()
        #expect(copy.validatedFraming == nil && parser.head.validatedFraming == facts)

        // The next response on the same parser: the last one's facts are gone.
        parser.expectResponse(headRequest: false)
        #expect(parser.head.validatedFraming == nil)
        guard case .head? = feed(&parser, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n") else {
            Issue.record("no second head")
            return
        }
        #expect(
            parser.head.validatedFraming
                == ResponseHeadCollector.ValidatedFraming(
                    contentLength: nil, transferEncoding: true, connectionClose: false, connectionNamesFields: false))
    }
}

/// A script's own answer (`req:respond`): its status and fields, Sluice's `Content-Length`,
/// and no body where none may follow.
@Suite struct LocalAnswerEncoderTests {
    private func written(_ response: LuaResponseView, head: Bool = false, close: Bool = false) -> String {
        let output = evbuffer_new()!
        defer { evbuffer_free(output) }
        ResponseEncoder.localAnswer(response, headRequest: head, close: close, into: output)
        return drain(output)
    }

    @Test func statusFieldsLengthAndBody() {
        var fields = HTTPFields()
        fields.append(HTTPField(name: .contentType, value: "application/json"))
        fields.append(HTTPField(name: .setCookie, value: "a=1"))
        fields.append(HTTPField(name: .setCookie, value: "b=2"))
        let answer = LuaResponseView(status: 403, headers: fields, body: Array("{}".utf8))
        #expect(
            written(answer)
                == "HTTP/1.1 403 Forbidden\r\nContent-Type: application/json\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\n"
                + "Content-Length: 2\r\n\r\n{}")
        #expect(written(answer, head: true, close: true).hasSuffix("Content-Length: 2\r\nConnection: close\r\n\r\n"))
        #expect(written(LuaResponseView(status: 200)) == "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        #expect(
            written(LuaResponseView(status: 204, body: Array("x".utf8))) == "HTTP/1.1 204 No Content\r\n\r\n")
    }
}
