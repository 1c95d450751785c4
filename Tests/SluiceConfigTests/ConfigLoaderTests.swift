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
        #expect(
            c.timeouts
                == .init(
                    clientHeader: 500, clientIdle: 120_000, upstreamConnect: 3000,
                    upstreamPerTry: 3_600_000, total: 90_000, drain: 5000))
        #expect(c.access.connectPorts == [443, 8443])
        #expect(c.access.allowClients == [IPNetwork("10.0.0.0/8")!])
    }

    @Test func loadLimitsParseWithDefaultsAndWords() throws {
        let defaults = try ConfigLoader.parse(yaml: "workers: 1", file: "t.yaml").server
        #expect(defaults.limits.maxConnections == nil && defaults.limits.maxConnectionsPerClient == nil)
        #expect(defaults.limits.maxInFlightUpstream == 1000 && defaults.limits.upstreamQueue == 1000)
        #expect(defaults.timeouts.upstreamQueue == 10_000)
        let yaml = """
            limits: { max_connections: 500, max_connections_per_client: 20, max_in_flight_upstream: unlimited, upstream_queue: 0 }
            timeouts: { upstream_queue: 250ms }
            """
        let c = try ConfigLoader.parse(yaml: yaml, file: "t.yaml").server
        #expect(c.limits.maxConnections == 500 && c.limits.maxConnectionsPerClient == 20)
        #expect(c.limits.maxInFlightUpstream == nil && c.limits.upstreamQueue == 0)
        #expect(c.timeouts.upstreamQueue == 250)
        let auto = try ConfigLoader.parse(
            yaml: "limits: { max_connections: auto, max_connections_per_client: unlimited }", file: "t.yaml")
        #expect(auto.server.limits.maxConnections == nil && auto.server.limits.maxConnectionsPerClient == nil)
    }

    @Test func badLoadLimitsAreLocated() {
        let yaml = """
            limits:
              max_connections: unlimited
              max_connections_per_client: 0
              max_in_flight_upstream: lots
              upstream_queue: -1
            """
        #expect {
            try ConfigLoader.parse(yaml: yaml, file: "f.yaml")
        } throws: { error in
            let issues = (error as? ConfigError)?.issues ?? []
            return issues.map(\.line) == [2, 3, 4, 5]
                && issues[0].message == "max_connections must be 'auto' or a number from 1 to 10000000"
                && issues[1].message == "max_connections_per_client must be 'unlimited' or a number from 1 to 10000000"
                && issues[3].message == "upstream_queue must be a number from 0 to 10000000"
        }
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

    /// Found by the `config` fuzz target: bytes libyaml refused to read (a control character,
    /// here DEL) were reported at 0:0; `YAMLReader` refuses them at their line and column.
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

    /// Deep nesting, which a recursive reader would overflow the stack on: `YAMLReader` stops at
    /// 1000 levels (as libyaml did) with a located error, and the 999 levels below that are read without
    /// recursion trouble (checked with the `config` fuzz target's 64 KiB inputs too).
    @Test func deepNestingIsALocatedErrorNotACrash() {
        #expect {
            try ConfigLoader.parse(yaml: "listen: " + String(repeating: "[", count: 100_000), file: "f.yaml")
        } throws: { error in
            guard let issue = (error as? ConfigError)?.issues.first else { return false }
            return issue.line == 1 && issue.column > 1 && issue.message.contains("nesting")
        }
        let deep =
            "policies: { h.test: { trust: { composite: " + String(repeating: "[", count: 990)
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

    @Test func routeForwardedAndTrustedClients() throws {
        let config = try ConfigLoader.parse(
            yaml: """
                routes:
                  - { listen: "127.0.0.1:8080", upstream: "http://127.0.0.1:9000" }
                  - { listen: "127.0.0.1:8081", upstream: "http://127.0.0.1:9000", forwarded: rfc7239, trusted_clients: [10.0.0.0/8] }
                """, file: "f")
        #expect(config.server.routes[0].forwarded == .xForwarded && config.server.routes[0].trustedClients.isEmpty)
        #expect(config.server.routes[1].forwarded == .rfc7239)
        #expect(config.server.routes[1].trustedClients == [IPNetwork("10.0.0.0/8")!])
        #expect {
            try ConfigLoader.parse(
                yaml: "routes:\n  - listen: 127.0.0.1:8080\n    upstream: http://a\n    forwarded: x-forwarded\n", file: "f")
        } throws: { error in
            guard let issue = (error as? ConfigError)?.issues.first else { return false }
            return issue.line == 4 && issue.column == 16 && issue.message.contains("rfc7239, x_forwarded, none")
        }
    }

    @Test func upstreamProxyIsMergedLikeEverySection() throws {
        let config = try ConfigLoader.parse(
            yaml: """
                policies:
                  default:
                    upstream_proxy:
                      url: http://proxy.example:3128
                      no_proxy: [.corp.example, 10.0.0.0/8, 192.0.2.1]
                      auth: { username: svc, password: s3cret }
                  direct.example: { upstream_proxy: none }
                  other.example: { upstream_proxy: { url: "http://[::1]:8080/" } }
                """, file: "f")
        let parent = try #require(config.pipeline.policies.match(host: "any.example").upstreamProxy)
        #expect(parent.url == "http://proxy.example:3128")
        #expect(parent.noProxy == [".corp.example", "10.0.0.0/8", "192.0.2.1"])
        #expect(parent.auth?.username == "svc" && parent.auth?.password.value == "s3cret")
        #expect(config.pipeline.policies.match(host: "direct.example").upstreamProxy == nil)
        #expect(config.pipeline.policies.match(host: "other.example").upstreamProxy?.url == "http://[::1]:8080")
    }

    @Test func upstreamProxyErrorsAreLocated() {
        let cases: [(String, Int, String)] = [
            ("upstream_proxy: { url: https://p.example:3128 }", 3, "http://host:port"),
            ("upstream_proxy: { url: http://p.example }", 3, "explicit port"),
            ("upstream_proxy: { url: http://u:pw@p.example:3128 }", 3, "credentials go in auth"),
            ("upstream_proxy: { url: http://p.example:3128/path }", 3, "http://host:port"),
            (
                "upstream_proxy: { url: http://p.example:3128, no_proxy: [a.example, 10.0.0.0/99] }", 3,
                "invalid no_proxy entry '10.0.0.0/99'"
            ),
            ("upstream_proxy: { no_proxy: [a.example] }", 3, "needs url"),
            ("upstream_proxy: { url: http://p.example:3128, auth: { username: svc } }", 3, "needs username and password"),
            ("upstream_proxy: direct", 3, "none or a map"),
        ]
        for (section, line, phrase) in cases {
            #expect {
                try ConfigLoader.parse(yaml: "policies:\n  default:\n    \(section)\n", file: "f")
            } throws: { error in
                guard let issue = (error as? ConfigError)?.issues.first else { return false }
                return issue.line == line && issue.message.contains(phrase)
            }
        }
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
