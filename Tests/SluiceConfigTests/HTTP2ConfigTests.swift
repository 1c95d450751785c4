import SluiceCore
import Testing

@testable import SluiceConfig

/// A policy's `upstream.http2` and the server's `upstream:` section: parsed values, defaults,
/// and where a mistake is reported.
@Suite struct HTTP2ConfigTests {
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

    @Test func http2IsPerHostAndDefaultsToAuto() throws {
        let config = try ConfigLoader.parse(
            yaml: """
                policies:
                  a.test: { upstream: { http2: off } }
                  b.test: { upstream: { scheme: http, http2: prior_knowledge } }
                  c.test: { upstream: { scheme: https, port: 8443 } }
                """, file: "t.yaml")
        let table = config.pipeline.policies
        #expect(table.match(host: "a.test").http2 == .off)
        #expect(table.match(host: "a.test").upstream == UpstreamOverride(scheme: nil, http2: .off))
        #expect(table.match(host: "b.test").http2 == .priorKnowledge)
        #expect(table.match(host: "c.test").http2 == .auto)
        #expect(table.match(host: "other.test").http2 == .auto)
        #expect(config.server.upstream == UpstreamPoolLimits(maxConnectionsPerHost: 0, maxStreams: 100))
    }

    @Test func serverUpstreamLimits() throws {
        let config = try ConfigLoader.parse(yaml: "upstream: { max_connections_per_host: 4, max_streams: 8 }\n", file: "t.yaml")
        #expect(config.server.upstream == UpstreamPoolLimits(maxConnectionsPerHost: 4, maxStreams: 8))
    }

    @Test func mistakesAreLocated() {
        let mode = issue("policies:\n  h.test:\n    upstream: { http2: yes }\n")
        #expect(mode?.line == 3 && mode?.message.contains("auto, off or prior_knowledge") == true)
        let port = issue("policies:\n  h.test:\n    upstream: { port: 8443 }\n")
        #expect(port?.line == 3 && port?.message.contains("needs scheme") == true)
        let empty = issue("policies:\n  h.test:\n    upstream: {}\n")
        #expect(empty?.message.contains("scheme (http or https), http2 or engine") == true)
        let streams = issue("upstream:\n  max_streams: 0\n")
        #expect(streams?.line == 2 && streams?.message.contains("max_streams") == true)
        let big = issue("upstream:\n  max_streams: 5000\n")
        #expect(big?.line == 2 && big?.message.contains("1 to 1000") == true)
        let cap = issue("upstream:\n  max_connections_per_host: -1\n")
        #expect(cap?.line == 2 && cap?.message.contains("max_connections_per_host") == true)
        let unknown = issue("upstream:\n  max_stream: 4\n")
        #expect(unknown?.message.contains("max_streams") == true)
    }
}
