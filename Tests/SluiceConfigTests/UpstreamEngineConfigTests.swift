import SluiceCore
import Testing

@testable import SluiceConfig

/// A policy's `upstream.engine`: parsed values, the section merge, where a mistake is
/// reported, and what `sluice check --host` says about the engine.
@Suite struct UpstreamEngineConfigTests {
    private func issue(_ yaml: String) -> ConfigIssue? {
        do {
            _ = try ConfigLoader.parse(yaml: yaml, file: "t.yaml")
            return nil
        } catch let error as ConfigError {
            return error.issues.first
        } catch {
            return nil
        }
    }

    private func policies(_ yaml: String) throws -> PolicyTable {
        try ConfigLoader.parse(yaml: yaml, file: "t.yaml").pipeline.policies
    }

    private func described(_ yaml: String, host: String) throws -> String {
        PolicyDescription.describe(try ConfigLoader.parse(yaml: yaml, file: "t.yaml").pipeline, host: host)
    }

    @Test func engineIsReadAndDefaultsToNil() throws {
        let table = try policies(
            """
            policies:
              n.test: { upstream: { engine: native } }
              c.test: { upstream: { engine: curl } }
              h.test: { upstream: { scheme: https, engine: curl } }
              p.test: { upstream: { http2: prior_knowledge, engine: curl } }
              o.test: { upstream: { scheme: http, port: 8080, http2: off, engine: native } }
              none.test: { upstream: { http2: off } }
            """)
        #expect(table.match(host: "n.test").upstreamEngine == .native)
        #expect(table.match(host: "n.test").upstream == UpstreamOverride(scheme: nil, engine: .native))
        #expect(table.match(host: "c.test").upstreamEngine == .curl)
        #expect(table.match(host: "h.test").upstream == UpstreamOverride(scheme: .https, engine: .curl))
        #expect(table.match(host: "p.test").upstream == UpstreamOverride(scheme: nil, http2: .priorKnowledge, engine: .curl))
        #expect(table.match(host: "o.test").upstream == UpstreamOverride(scheme: .http, port: 8080, http2: .off, engine: .native))
        #expect(table.match(host: "none.test").upstreamEngine == nil)
        #expect(table.match(host: "other.test").upstreamEngine == nil)
    }

    @Test func aHostsUpstreamReplacesTheDefaultsEngine() throws {
        let table = try policies(
            """
            policies:
              default: { upstream: { engine: curl } }
              a.test: { upstream: { http2: off } }
              b.test: { adapters: [] }
            """)
        #expect(table.match(host: "a.test").upstreamEngine == nil)
        #expect(table.match(host: "b.test").upstreamEngine == .curl)
    }

    @Test func aWrongValueIsLocated() {
        let wrong = issue("policies:\n  h.test:\n    upstream: { engine: libcurl }\n")
        #expect(wrong?.line == 3 && wrong?.column == 25)
        #expect(wrong?.message == "engine must be native or curl")
        let list = issue("policies:\n  h.test:\n    upstream:\n      engine: [native]\n")
        #expect(list?.line == 4 && list?.message == "engine must be native or curl")
        let typo = issue("policies:\n  h.test:\n    upstream: { engin: curl }\n")
        #expect(typo?.line == 3 && typo?.message.contains("did you mean 'engine'") == true)
    }

    @Test func nativeServesHTTPSButNotH2C() {
        // HTTP/1.1 over TLS is native's too.
        #expect(issue("policies:\n  h.test:\n    upstream:\n      scheme: https\n      engine: native\n") == nil)
        let h2c = issue("policies:\n  h.test:\n    upstream: { engine: native, http2: prior_knowledge }\n")
        #expect(h2c?.line == 3)
        #expect(h2c?.message.contains("engine: native speaks HTTP/1.1 only") == true)
        #expect(h2c?.message.contains("http2: prior_knowledge") == true)
        // Only in the same section: another entry's scheme is no conflict.
        #expect(
            issue("policies:\n  default: { upstream: { scheme: https } }\n  h.test: { upstream: { engine: native } }\n") == nil)
        #expect(issue("policies:\n  h.test: { upstream: { scheme: http, http2: off, engine: native } }\n") == nil)
    }

    @Test func checkHostShowsTheEngineForAPlainHTTPRequest() throws {
        let yaml = """
            policies:
              plain.test: { adapters: [] }
              native.test: { upstream: { engine: native } }
              curl.test: { upstream: { engine: curl } }
              tls.test: { upstream: { scheme: https, port: 8443 } }
              tls1.test: { upstream: { scheme: https, http2: "off" } }
              tlscurl.test: { upstream: { scheme: https, engine: curl } }
              h2c.test: { upstream: { http2: prior_knowledge } }
              auth.test: { credentials: { username: u, password: "p" } }
              parent.test: { upstream_proxy: { url: "http://proxy.test:3128" } }
            """
        func engineLine(_ host: String) throws -> String? {
            try described(yaml, host: host).split(separator: "\n").first { $0.hasPrefix("  upstream engine: ") }.map(String.init)
        }
        #expect(try engineLine("plain.test") == "  upstream engine: native (plain http origin)")
        #expect(try engineLine("elsewhere.test") == "  upstream engine: native (plain http origin)")
        #expect(try engineLine("native.test") == "  upstream engine: native (upstream.engine: native)")
        #expect(try engineLine("curl.test") == "  upstream engine: curl (upstream.engine: curl)")
        #expect(
            try engineLine("tls.test")
                == "  upstream engine: curl (https origin, HTTP/2 offered by ALPN), then native (https origin that chose HTTP/1.1 by ALPN)"
        )
        #expect(try engineLine("tls1.test") == "  upstream engine: native (https origin, upstream.http2: off)")
        #expect(try engineLine("tlscurl.test") == "  upstream engine: curl (upstream.engine: curl)")
        #expect(try engineLine("h2c.test") == "  upstream engine: curl (upstream.http2: prior_knowledge)")
        #expect(try engineLine("auth.test") == "  upstream engine: curl (credentials (auth challenges))")
        #expect(try engineLine("parent.test") == "  upstream engine: curl (upstream_proxy)")
        #expect(try described(yaml, host: "native.test").contains("  upstream: http2 auto, engine native\n"))
        #expect(try described(yaml, host: "tlscurl.test").contains("  upstream: scheme https, http2 auto, engine curl\n"))
    }
}
