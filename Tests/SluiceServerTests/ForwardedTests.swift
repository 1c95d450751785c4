import Testing

@testable import SluiceServer

/// `routes[].forwarded` and `trusted_clients` (Forwarded.swift): the lines added and the
/// client's own fields removed, for every style.
@Suite struct ForwardedTests {
    static func head(_ fields: String) throws -> HTTPRequestHead {
        try HTTPRequestParser.parseHeadBytes(
            Array("GET /x HTTP/1.1\r\nHost: gw.example:8080\r\n\(fields)\r\n".utf8),
            limits: defaultLimits)
    }

    static func removed(_ f: ForwardingFields, _ name: String) -> Bool {
        var name = name
        return name.withUTF8 { f.removes($0) }
    }

    @Test func xForwardedFromAnUntrustedClient() throws {
        let f = ForwardingFields(style: .xForwarded, trusted: false, clientAddress: "192.0.2.7")
        let lines = f.lines(for: try Self.head("X-Forwarded-For: 6.6.6.6\r\nX-Forwarded-Proto: https\r\n"))
        #expect(lines.map(\.name) == ["X-Forwarded-For", "X-Forwarded-Proto", "X-Forwarded-Host"])
        #expect(lines.map(\.value) == ["192.0.2.7", "http", "gw.example:8080"])
        for name in ["forwarded", "X-Forwarded-For", "x-forwarded-proto", "X-FORWARDED-HOST"] {
            #expect(Self.removed(f, name), "\(name)")
        }
        #expect(!Self.removed(f, "x-forwarded-port") && !Self.removed(f, "via"))
    }

    @Test func aTrustedClientKeepsItsChainAndFirstHop() throws {
        let f = ForwardingFields(style: .xForwarded, trusted: true, clientAddress: "10.0.0.2")
        #expect(!Self.removed(f, "X-Forwarded-For") && !Self.removed(f, "Forwarded"))
        let lines = f.lines(for: try Self.head("X-Forwarded-For: 203.0.113.9\r\nX-Forwarded-Proto: https\r\n"))
        // Its For chain gets one more hop; its Proto stays the first hop's; Host is added.
        #expect(lines.map(\.name) == ["X-Forwarded-For", "X-Forwarded-Host"])
        #expect(lines.map(\.value) == ["10.0.0.2", "gw.example:8080"])
        let withHost = f.lines(for: try Self.head("X-Forwarded-Host: public.example\r\n"))
        #expect(withHost.map(\.name) == ["X-Forwarded-For", "X-Forwarded-Proto"])
    }

    @Test func rfc7239QuotesWhatIsNotAToken() throws {
        let v4 = ForwardingFields(style: .rfc7239, trusted: false, clientAddress: "192.0.2.7")
        #expect(v4.lines(for: try Self.head("")).map(\.value) == ["for=192.0.2.7;proto=http;host=\"gw.example:8080\""])
        let v6 = ForwardingFields(style: .rfc7239, trusted: false, clientAddress: "2001:db8::1")
        let lines = v6.lines(host: "plain.example", present: [])
        #expect(lines.count == 1 && lines[0].name == "Forwarded")
        #expect(lines[0].value == "for=\"[2001:db8::1]\";proto=http;host=plain.example")
        #expect(ForwardingFields.token(orQuoted: "a\"b\\c") == "\"a\\\"b\\\\c\"")
    }

    @Test func noneAddsNothingButStillRemovesForgeries() throws {
        let f = ForwardingFields(style: .none, trusted: false, clientAddress: "192.0.2.7")
        #expect(f.lines(for: try Self.head("Forwarded: for=6.6.6.6\r\n")).isEmpty)
        #expect(Self.removed(f, "Forwarded"))
        let trusted = ForwardingFields(style: .none, trusted: true, clientAddress: "192.0.2.7")
        #expect(!Self.removed(trusted, "Forwarded"))
    }

    @Test func theRequestListCarriesTheFields() throws {
        let head = try Self.head("X-Forwarded-For: 6.6.6.6\r\nAccept: */*\r\n")
        var builder = RequestHeaderLines.Builder()
        let f = ForwardingFields(style: .xForwarded, trusted: false, clientAddress: "127.0.0.5")
        let list = ForwardedHeaders.requestLines(for: head, viaLine: Array("Via: 1.1 t".utf8), forwarding: f, builder: &builder)
        #expect(!list.lines.contains("X-Forwarded-For: 6.6.6.6"))
        #expect(list.lines.contains("X-Forwarded-For: 127.0.0.5"))
        #expect(list.lines.contains("X-Forwarded-Proto: http"))
        let fields = ForwardedHeaders.forwardedFields(of: head, forwarding: f)
        #expect(fields[values: .init("X-Forwarded-For")!] == ["127.0.0.5"])
    }
}
