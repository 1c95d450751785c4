import CLibEvent
import Testing

@testable import SluiceServer

/// The native transport's request head, from the same header lines libcurl gets converted:
/// the lines as they are, `Host` derived from the target, framing from the body.
@Suite struct UpstreamRequestEncoderTests {
    private func head(
        method: String = "GET", url: String, lines: [String], body: UpstreamRequest.Body = .none, absoluteForm: Bool = false
    ) throws -> String {
        var builder = RequestHeaderLines.Builder()
        for line in lines { builder.append(line: Array(line.utf8)) }
        var request = UpstreamRequest(
            method: method, target: try RequestTarget.absolute(url),
            headers: builder.makeLines(), body: body)
        let out = evbuffer_new()!
        defer { evbuffer_free(out) }
        UpstreamRequestEncoder.writeHead(&request, into: out, absoluteForm: absoluteForm)
        let n = evbuffer_get_length(out)
        var bytes = [UInt8](repeating: 0, count: n)
        evbuffer_remove(out, &bytes, n)
        return String(decoding: bytes, as: UTF8.self)
    }

    @Test func originFormTheLinesAndHostFromTheTarget() throws {
        let text = try head(url: "http://example.com/a/b?x=1", lines: ["X-A: 1", "X-Empty:", "Via: 1.1 sluice-x"])
        #expect(text == "GET /a/b?x=1 HTTP/1.1\r\nX-A: 1\r\nX-Empty:\r\nVia: 1.1 sluice-x\r\nHost: example.com\r\n\r\n")
    }

    @Test func toAPeerOfTheFleetTheRequestLineHasTheAbsoluteForm() throws {
        #expect(
            try head(url: "http://example.com/a?x=1", lines: [], absoluteForm: true)
                == "GET http://example.com/a?x=1 HTTP/1.1\r\nHost: example.com\r\n\r\n")
        #expect(
            try head(url: "https://example.com:8443", lines: [], absoluteForm: true)
                == "GET https://example.com:8443 HTTP/1.1\r\nHost: example.com:8443\r\n\r\n")
    }

    @Test func aPortOtherThanTheDefaultIsInHostAndIPv6IsBracketed() throws {
        #expect(try head(url: "http://127.0.0.1:8080/", lines: []) == "GET / HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\r\n")
        #expect(try head(url: "http://[::1]:81/", lines: []) == "GET / HTTP/1.1\r\nHost: [::1]:81\r\n\r\n")
    }

    @Test func aHostInTheListWins() throws {
        let text = try head(url: "http://10.0.0.1:8443/", lines: ["HOST: api.example.com"])
        #expect(text == "GET / HTTP/1.1\r\nHOST: api.example.com\r\n\r\n")
    }

    @Test func framingComesFromTheBody() throws {
        #expect(
            try head(method: "PUT", url: "http://h/", lines: [], body: .length(5))
                == "PUT / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\n")
        #expect(
            try head(method: "POST", url: "http://h/", lines: [], body: .streamed)
                == "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n")
    }
}
