import CLibEvent
import SluiceCore
import Testing

@testable import SluiceServer

/// `UpgradeResponseReader`: the answer to an upgrade handshake, fed whole and split at every byte.
struct UpgradeResponseReaderTests {
    /// Feeds `text` in pieces of `step` bytes; returns the events with the offset they ended at.
    private func run(
        _ text: String, step: Int
    ) throws -> (events: [(UpgradeResponseReader.Event, Int)], reader: UpgradeResponseReader) {
        var reader = UpgradeResponseReader()
        var events: [(UpgradeResponseReader.Event, Int)] = []
        let bytes = Array(text.utf8)
        var offset = 0
        while offset < bytes.count {
            let end = min(offset + step, bytes.count)
            var at = offset
            while at < end {
                let r = try bytes[at..<end].withUnsafeBytes { try reader.read($0) }
                at += r.consumed
                if let e = r.event { events.append((e, at)) }
                if r.consumed == 0 { break }
                if case .switched? = r.event { return (events, reader) }
            }
            offset = end
        }
        return (events, reader)
    }

    private func everySplit(_ text: String, _ check: ([(UpgradeResponseReader.Event, Int)], UpgradeResponseReader) -> Void) throws
    {
        for step in 1...text.utf8.count {
            let r = try run(text, step: step)
            check(r.events, r.reader)
        }
    }

    @Test func switchedAfterInterimAnswers() throws {
        let head =
            "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
        let text = head + "\u{81}\u{2}hi"
        try everySplit(text) { events, reader in
            #expect(events.count == 1)
            #expect(events.first?.0 == .switched && events.first?.1 == head.utf8.count)
            #expect(reader.head.status == 101 && reader.head.value("upgrade") == "websocket")
        }
    }

    @Test func lengthFramedAnswerEnds() throws {
        let text = "HTTP/1.1 403 Forbidden\r\nContent-Length: 5\r\n\r\nnope\n"
        try everySplit(text) { events, _ in
            #expect(events.map(\.0) == [.answered(.length(5)), .bodyEnded])
            #expect(events.last?.1 == text.utf8.count)
        }
    }

    @Test func chunkedAnswerEndsAfterTrailers() throws {
        let text = "HTTP/1.1 426 Upgrade Required\r\nTransfer-Encoding: chunked\r\n\r\n5;x=y\r\nhello\r\n0\r\nX-T: 1\r\n\r\n"
        try everySplit(text) { events, _ in
            #expect(events.map(\.0) == [.answered(.chunked), .bodyEnded])
            #expect(events.last?.1 == text.utf8.count)
        }
    }

    /// The body is relayed raw, so it is framed as strictly as any response: a client must
    /// find its end where Sluice did (`ChunkedDecoder`).
    @Test func chunkedAnswersAreFramedStrictly() {
        let head = "HTTP/1.1 426 Upgrade Required\r\nTransfer-Encoding: chunked\r\n\r\n"
        for (body, reason) in [
            ("5 xyz\r\nhello\r\n0\r\n\r\n", "invalid chunk size"),
            ("5;x\u{1}\r\nhello\r\n0\r\n\r\n", "invalid chunk extension"),
            ("5\r\nhello\r\n0\r\nX-T: 1\nY: 2\r\n\r\n", "bare LF in the trailer section"),
            ("5\r\nhello\r\n0\r\nGET / HTTP/1.1\r\n\r\n", "whitespace between a trailer field name and the colon"),
        ] {
            #expect(throws: UpgradeResponseReader.Failure.malformed(reason)) { try run(head + body, step: 7) }
        }
        let huge = head + "0\r\nX: " + String(repeating: "a", count: UpgradeResponseReader.maxHeadBytes) + "\r\n\r\n"
        #expect(throws: UpgradeResponseReader.Failure.headTooLarge) { try run(huge, step: 4096) }
    }

    @Test func bodilessAndCloseDelimitedAnswers() throws {
        let (events, _) = try run("HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n", step: 1000)
        #expect(events.map(\.0) == [.answered(.none)])
        let (close, _) = try run("HTTP/1.1 400 Bad Request\r\n\r\nanything", step: 1000)
        #expect(close.map(\.0) == [.answered(.close)])
    }

    @Test func malformedAnswersAreRefused() {
        #expect(throws: UpgradeResponseReader.Failure.self) { try run("\r\n", step: 10) }
        #expect(throws: UpgradeResponseReader.Failure.self) {
            try run("HTTP/1.1 400 Bad\r\nContent-Length: x\r\n\r\n", step: 100)
        }
        #expect(throws: UpgradeResponseReader.Failure.self) {
            try run("HTTP/1.1 400 Bad\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", step: 100)
        }
        let huge =
            "HTTP/1.1 101 Switching\r\nX: " + String(repeating: "a", count: UpgradeResponseReader.maxHeadBytes) + "\r\n\r\n"
        #expect(throws: UpgradeResponseReader.Failure.headTooLarge) { try run(huge, step: 4096) }
    }

    @Test func switchingHeadKeepsUpgradeAndDropsHopByHop() throws {
        var head = ResponseHeadCollector()
        for line in [
            "HTTP/1.1 101 Switching Protocols", "Upgrade: websocket", "Connection: Upgrade, X-Drop",
            "Keep-Alive: 5", "Sec-WebSocket-Accept: abc=", "",
        ] {
            _ = Array((line + "\r\n").utf8).withUnsafeBytes { head.add($0) }
        }
        let output = evbuffer_new()!
        defer { evbuffer_free(output) }
        try ResponseEncoder.switchingProtocols(head, viaLine: Array("Via: 1.1 test\r\n".utf8), into: output)
        let n = evbuffer_get_length(output)
        var bytes = [UInt8](repeating: 0, count: n)
        evbuffer_copyout(output, &bytes, n)
        #expect(
            String(decoding: bytes, as: UTF8.self) == "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                + "Sec-WebSocket-Accept: abc=\r\nVia: 1.1 test\r\nConnection: Upgrade\r\n\r\n")
    }

    @Test func handshakeIsTheAdaptedRequestWithTheUpgradeFields() throws {
        var builder = RequestHeaderLines.Builder()
        builder.append(name: "X-A".utf8, value: "1".utf8)
        builder.append(name: "X-Empty".utf8, value: "".utf8)
        builder.append(line: Array("Via: 1.1 s\r\n".utf8).dropLast(2).map { $0 })
        let request = UpstreamRequest(
            method: "GET", target: try RequestTarget.absolute("http://h.test/chat?room=1"),
            headers: builder.makeLines(), body: .none)
        let output = evbuffer_new()!
        defer { evbuffer_free(output) }
        UpgradeTransfer.writeHandshake(request, upgrade: "websocket", into: output)
        var bytes = [UInt8](repeating: 0, count: evbuffer_get_length(output))
        evbuffer_copyout(output, &bytes, bytes.count)
        #expect(
            String(decoding: bytes, as: UTF8.self) == "GET /chat?room=1 HTTP/1.1\r\nHost: h.test\r\nX-A: 1\r\n"
                + "X-Empty:\r\nVia: 1.1 s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
        let onPort = UpstreamRequest(
            method: "GET", target: try RequestTarget.absolute("https://[::1]:8443/"),
            headers: RequestHeaderLines.Builder().makeLines(), body: .none)
        let second = evbuffer_new()!
        defer { evbuffer_free(second) }
        UpgradeTransfer.writeHandshake(onPort, upgrade: "websocket", into: second)
        var more = [UInt8](repeating: 0, count: evbuffer_get_length(second))
        evbuffer_copyout(second, &more, more.count)
        #expect(String(decoding: more, as: UTF8.self).hasPrefix("GET / HTTP/1.1\r\nHost: [::1]:8443\r\n"))
    }

    @Test func originFormOfTargets() throws {
        #expect(try RequestTarget.absolute("http://h:1/a/b?c=d").originForm == "/a/b?c=d")
        #expect(try RequestTarget.absolute("http://h:1").originForm == "/")
        #expect(try RequestTarget.absolute("http://h?x").originForm == "/?x")
    }
}
