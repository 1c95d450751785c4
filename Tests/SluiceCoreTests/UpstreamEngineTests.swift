import Foundation
import Testing

@testable import SluiceCore

/// `UpstreamEngine.choose`: every step of the rule, its order, and the reasons; and the
/// access log's `upstream_engine`.
@Suite struct UpstreamEngineTests {
    /// A plain-http origin reached directly, nothing forced: the baseline each case changes.
    private func choose(
        https: Bool = false, http2: HTTP2Mode = .auto, forced: UpstreamEngine? = nil,
        credentials: Bool = false, parentProxy: Bool = false, upgrade: Bool = false
    ) -> UpstreamEngine.Choice {
        UpstreamEngine.choose(
            https: https, http2: http2, forced: forced, credentials: credentials,
            parentProxy: parentProxy, upgrade: upgrade)
    }

    @Test func yamlNames() {
        #expect(UpstreamEngine.allCases.map(\.rawValue) == ["native", "curl"])
        #expect(UpstreamEngine(rawValue: "libcurl") == nil)
        #expect(UpstreamOverride(scheme: nil).engine == nil)
    }

    @Test func plainHTTPOriginIsNative() {
        #expect(choose() == .init(engine: .native, reason: "plain http origin"))
        #expect(choose(http2: .off) == .init(engine: .native, reason: "plain http origin"))
    }

    @Test func upgradeIsCurlWhateverElse() {
        #expect(choose(upgrade: true) == .init(engine: .curl, reason: "upgrade handshake"))
        #expect(choose(forced: .native, upgrade: true) == .init(engine: .curl, reason: "upgrade handshake"))
        #expect(
            choose(https: true, forced: .curl, credentials: true, parentProxy: true, upgrade: true).reason == "upgrade handshake")
    }

    @Test func forcedCurl() {
        #expect(choose(forced: .curl) == .init(engine: .curl, reason: "upstream.engine: curl"))
        // Before every later step.
        #expect(
            choose(https: true, http2: .priorKnowledge, forced: .curl, credentials: true, parentProxy: true)
                == .init(engine: .curl, reason: "upstream.engine: curl"))
    }

    @Test func httpsIsCurlEvenWhenNativeIsForced() {
        #expect(choose(https: true) == .init(engine: .curl, reason: "https origin"))
        #expect(choose(https: true, http2: .off) == .init(engine: .curl, reason: "https origin"))
        #expect(
            choose(https: true, forced: .native)
                == .init(engine: .curl, reason: "https origin (upstream.engine: native is for http origins)"))
        #expect(choose(https: true, http2: .priorKnowledge, credentials: true, parentProxy: true).reason == "https origin")
    }

    @Test func priorKnowledgeIsCurl() {
        #expect(choose(http2: .priorKnowledge) == .init(engine: .curl, reason: "upstream.http2: prior_knowledge"))
        #expect(choose(http2: .priorKnowledge, forced: .native).reason == "upstream.http2: prior_knowledge")
        #expect(choose(http2: .priorKnowledge, credentials: true, parentProxy: true).reason == "upstream.http2: prior_knowledge")
    }

    @Test func credentialsAreCurl() {
        #expect(choose(credentials: true) == .init(engine: .curl, reason: "credentials (auth challenges)"))
        #expect(choose(forced: .native, credentials: true).engine == .curl)
        #expect(choose(credentials: true, parentProxy: true).reason == "credentials (auth challenges)")
    }

    @Test func parentProxyIsCurl() {
        #expect(choose(parentProxy: true) == .init(engine: .curl, reason: "upstream_proxy"))
        #expect(choose(forced: .native, parentProxy: true) == .init(engine: .curl, reason: "upstream_proxy"))
    }

    @Test func forcedNativeOnPlainHTTP() {
        #expect(choose(forced: .native) == .init(engine: .native, reason: "upstream.engine: native"))
        #expect(choose(http2: .off, forced: .native) == .init(engine: .native, reason: "upstream.engine: native"))
    }

    @Test func everyCombinationFollowsTheRule() {
        for https in [false, true] {
            for http2 in HTTP2Mode.allCases {
                for forced in [nil] + UpstreamEngine.allCases.map(Optional.some) {
                    for credentials in [false, true] {
                        for parentProxy in [false, true] {
                            for upgrade in [false, true] {
                                let c = choose(
                                    https: https, http2: http2, forced: forced, credentials: credentials,
                                    parentProxy: parentProxy, upgrade: upgrade)
                                let curlNeeded =
                                    upgrade || forced == .curl || https || http2 == .priorKnowledge
                                    || credentials || parentProxy
                                #expect(c.engine == (curlNeeded ? .curl : .native))
                                #expect(!c.reason.isEmpty)
                            }
                        }
                    }
                }
            }
        }
    }

    // MARK: access log

    /// One access-log line for `timings`, parsed.
    private func accessLogLine(_ timings: TryTimings?) throws -> (object: [String: Any], text: String) {
        let path = FileManager.default.temporaryDirectory
            .appendingPathComponent("sluice-engine-\(UInt64.random(in: 0 ... .max)).log").path
        defer { try? FileManager.default.removeItem(atPath: path) }
        let sink = try LogSink.shared(path: path)
        let monitor = AccessLogMonitor(sink: sink, redactor: Redactor())
        var summary = ExchangeSummary(id: 1, client: "127.0.0.1:5000", method: "GET", url: "http://a.test/", policy: "default")
        summary.timings = timings
        monitor.handle(.finished(summary))
        sink.flush()
        let text = try String(contentsOfFile: path, encoding: .utf8)
        let object = try #require(try JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any])
        return (object, text)
    }

    @Test func accessLogWritesTheEngineAfterTheConnection() throws {
        var timings = TryTimings()
        timings.httpVersion = .http1_1
        timings.engine = .native
        let native = try accessLogLine(timings)
        #expect(native.object["upstream_engine"] as? String == "native")
        #expect(
            native.text.contains(#""upstream_protocol":"HTTP/1.1","upstream_connection":"reused","upstream_engine":"native""#))

        timings.engine = .curl
        timings.newConnection = true
        #expect(try accessLogLine(timings).text.contains(#""upstream_connection":"new","upstream_engine":"curl""#))
    }

    @Test func accessLogEngineIsNullWhereTheProtocolIs() throws {
        // No connection spoke: null, like upstream_protocol.
        var timings = TryTimings()
        timings.engine = .native
        let unspoken = try accessLogLine(timings)
        #expect(unspoken.object["upstream_engine"] is NSNull && unspoken.object["upstream_protocol"] is NSNull)
        // A try that spoke but did not say its engine.
        timings.httpVersion = .http2
        timings.engine = nil
        #expect(try accessLogLine(timings).object["upstream_engine"] is NSNull)
        // No try: no timings, and neither field.
        let none = try accessLogLine(nil)
        #expect(none.object["upstream_engine"] == nil && none.object["upstream_protocol"] == nil)
    }
}
