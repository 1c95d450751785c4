import SluiceCore
import Testing

@testable import SluiceConfig

@Suite struct ConfigLoaderTests {
    @Test func embeddedDefaultLoadsAndIsSafe() throws {
        let config = try ConfigLoader.parse(yaml: ConfigLoader.embeddedDefault, file: "default").server
        #expect(config == ServerConfiguration())
        #expect(config.listen == ["127.0.0.1:3128"])
        #expect(config.workers == nil)
        #expect(config.access.connectPorts == [443])
        #expect(config.access.allowClients.allSatisfy { $0.description.hasPrefix("127.") || $0.description.hasPrefix("0:0:") })
    }

    @Test func everyKeyParsesWithUnits() throws {
        let yaml = """
            listen: ["127.0.0.1:8080", "[::1]:8080"]
            workers: 3
            limits: { request_line: 4KiB, header_section: 16KiB, header_count: 50, request_body: 10MiB }
            timeouts: { client_header: 500ms, client_idle: 2m, upstream_connect: 3s, upstream_per_try: 1h, total: 90s, drain: 5s }
            access: { allow_clients: [10.0.0.0/8], connect_ports: [443, 8443], deny: ["169.254.169.254/32"] }
            """
        let c = try ConfigLoader.parse(yaml: yaml, file: "t.yaml").server
        #expect(c.listen == ["127.0.0.1:8080", "[::1]:8080"])
        #expect(c.workers == 3)
        #expect(c.limits == .init(requestLine: 4096, headerSection: 16384, headerCount: 50, requestBody: 10 << 20))
        #expect(c.timeouts == .init(clientHeader: 500, clientIdle: 120_000, upstreamConnect: 3000,
                                    upstreamPerTry: 3_600_000, total: 90_000, drain: 5000))
        #expect(c.access.connectPorts == [443, 8443])
        #expect(c.access.allowClients == [IPNetwork("10.0.0.0/8")!])
    }

    @Test func unknownKeyNamesLineColumnAndSuggests() {
        let yaml = "workers: 2\nlistn: [\"127.0.0.1:1\"]\n"
        #expect {
            try ConfigLoader.parse(yaml: yaml, file: "f.yaml")
        } throws: { error in
            let issue = (error as? ConfigError)?.issues.first
            return issue?.line == 2 && issue?.column == 1 && issue?.message.contains("did you mean 'listen'") == true
                && issue?.description.hasPrefix("f.yaml:2:1: error:") == true
        }
    }

    @Test func badValuesAreAllReported() {
        let yaml = """
            workers: -3
            limits:
              request_line: lots
            timeouts:
              client_idle: 10parsecs
            access:
              allow_clients: [300.1.1.1/8]
            listen: ["localhost:80"]
            """
        #expect {
            try ConfigLoader.parse(yaml: yaml, file: "f.yaml")
        } throws: { error in
            guard let issues = (error as? ConfigError)?.issues else { return false }
            let lines = issues.map(\.line)
            return lines == [1, 3, 5, 7, 8]
        }
    }

    /// Found by the `config` fuzz target: bytes libyaml refuses to read (a control character,
    /// here DEL) were reported at 0:0.
    @Test(arguments: [
        ("p\u{7F}licies: { a.test: { adapters: [] } }\n", 1, 2),
        ("workers: 2\nlisten: [\"a\u{1}\"]\n", 2, 12),
        ("# é\r\nworkers: 2\r\n\u{7}", 3, 1),
    ])
    func unreadableBytesAreLocated(yaml: String, line: Int, column: Int) {
        #expect {
            try ConfigLoader.parse(yaml: yaml, file: "f.yaml")
        } throws: { error in
            guard let issues = (error as? ConfigError)?.issues, issues.count == 1 else { return false }
            return issues[0].line == line && issues[0].column == column
                && issues[0].message == "invalid YAML: control characters are not allowed"
        }
    }

    /// Deep nesting, which a recursive reader would overflow the stack on: libyaml stops at
    /// 1000 levels with a located error, and the 999 levels below that are read without
    /// recursion trouble (checked with the `config` fuzz target's 64 KiB inputs too).
    @Test func deepNestingIsALocatedErrorNotACrash() {
        #expect {
            try ConfigLoader.parse(yaml: "listen: " + String(repeating: "[", count: 100_000), file: "f.yaml")
        } throws: { error in
            guard let issue = (error as? ConfigError)?.issues.first else { return false }
            return issue.line == 1 && issue.column > 1 && issue.message.contains("nesting")
        }
        let deep = "policies: { h.test: { trust: { composite: " + String(repeating: "[", count: 990)
            + String(repeating: "]", count: 990) + " } } }\n"
        #expect(throws: ConfigError.self) { try ConfigLoader.parse(yaml: deep, file: "f.yaml") }
    }

    @Test func yamlSyntaxErrorHasLocation() {
        #expect {
            try ConfigLoader.parse(yaml: "listen: [\"a\"\nworkers: 2\n", file: "f.yaml")
        } throws: { error in
            guard let issue = (error as? ConfigError)?.issues.first else { return false }
            return issue.line > 0 && issue.message.contains("invalid YAML")
        }
    }

    @Test func laterPolicySectionsAreRejectedNotIgnored() {
        #expect(throws: ConfigError.self) { try ConfigLoader.parse(yaml: "policies: { default: { cache: {} } }\n", file: "f") }
    }

    @Test func units() {
        #expect(Units.bytes("8KiB") == 8192)
        #expect(Units.bytes("1GB") == 1_000_000_000)
        #expect(Units.bytes("12") == 12)
        #expect(Units.bytes("1.5MiB") == nil)
        #expect(Units.milliseconds("500ms") == 500)
        #expect(Units.milliseconds("2m") == 120_000)
        #expect(Units.milliseconds("30") == nil)
        #expect(DidYouMean.closest(to: "conect_ports", among: ["connect_ports", "deny"]) == "connect_ports")
        #expect(DidYouMean.closest(to: "zzzz", among: ["listen"]) == nil)
    }
}

@Suite struct IPNetworkTests {
    @Test func containment() {
        let v4 = IPNetwork("127.0.0.0/8")!
        #expect(v4.contains([127, 1, 2, 3]))
        #expect(!v4.contains([128, 0, 0, 1]))
        // An IPv4-mapped IPv6 client is checked as IPv4.
        #expect(v4.contains([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 127, 0, 0, 1]))
        let v6 = IPNetwork("::1/128")!
        #expect(v6.contains([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]))
        #expect(!v6.contains([127, 0, 0, 1]))
        #expect(IPNetwork("fe80::/10")!.contains(IPNetwork.parseAddress("fe80::1234")!))
        #expect(IPNetwork("10.1.2.3/33") == nil)
        #expect(IPNetwork("1::2::3") == nil)
        #expect(IPNetwork("0.0.0.0/0")!.contains([8, 8, 8, 8]))
    }
}
