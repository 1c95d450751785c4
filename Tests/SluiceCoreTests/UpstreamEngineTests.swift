import Foundation
import Testing

@testable import SluiceCore

/// `UpstreamEngine.choose`: every step of the rule, its order, and the reasons; and the
/// access log's `upstream_engine`.
@Suite struct UpstreamEngineTests {
    /// A plain-http origin reached directly, nothing forced: the baseline each case changes.
    private func choose(
        https: Bool = false, http2: HTTP2Mode = .auto, forced: UpstreamEngine? = nil,
        credentials: Bool = false, parentProxy: Bool = false, upgrade: Bool = false,
        requiresOCSP: Bool = false, originChoseHTTP1: Bool = false
    ) -> UpstreamEngine.Choice {
        UpstreamEngine.choose(
            https: https, http2: http2, forced: forced, credentials: credentials,
            parentProxy: parentProxy, upgrade: upgrade, requiresOCSP: requiresOCSP,
            originChoseHTTP1: originChoseHTTP1)
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

    @Test func httpsIsCurlUntilTheOriginChoseHTTP1() {
        #expect(choose(https: true) == .init(engine: .curl, reason: "https origin, HTTP/2 offered by ALPN"))
        #expect(
            choose(https: true, originChoseHTTP1: true)
                == .init(engine: .native, reason: "https origin that chose HTTP/1.1 by ALPN"))
        // prior_knowledge means auto over TLS.
        #expect(choose(https: true, http2: .priorKnowledge).engine == .curl)
        #expect(choose(https: true, http2: .priorKnowledge, originChoseHTTP1: true).engine == .native)
    }

    @Test func httpsWithoutHTTP2OrForcedIsNative() {
        #expect(choose(https: true, http2: .off) == .init(engine: .native, reason: "https origin, upstream.http2: off"))
        #expect(
            choose(https: true, forced: .native)
                == .init(engine: .native, reason: "upstream.engine: native (HTTP/1.1 over TLS)"))
    }

    @Test func ocspStaplingIsCurl() {
        #expect(choose(https: true, requiresOCSP: true) == .init(engine: .curl, reason: "OCSP stapling (trust)"))
        #expect(choose(https: true, http2: .off, forced: .native, requiresOCSP: true, originChoseHTTP1: true).engine == .curl)
        // Only over TLS.
        #expect(choose(requiresOCSP: true).engine == .native)
    }

    @Test func memoryOfALPNAnswersExpires() {
        var memory = TLSProtocolMemory()
        #expect(!memory.choseHTTP1(host: "a.test", port: 443, now: 0))
        memory.learn(host: "a.test", port: 443, spokeHTTP2: false, now: 1000)
        #expect(memory.choseHTTP1(host: "a.test", port: 443, now: 1000))
        #expect(!memory.choseHTTP1(host: "a.test", port: 8443, now: 1000))
        #expect(memory.choseHTTP1(host: "a.test", port: 443, now: 1000 + TLSProtocolMemory.ttlMilliseconds - 1))
        #expect(!memory.choseHTTP1(host: "a.test", port: 443, now: 1000 + TLSProtocolMemory.ttlMilliseconds))
        // An origin that then chose h2 is forgotten at once.
        memory.learn(host: "a.test", port: 443, spokeHTTP2: false, now: 2000)
        memory.learn(host: "a.test", port: 443, spokeHTTP2: true, now: 2001)
        #expect(!memory.choseHTTP1(host: "a.test", port: 443, now: 2002))
        // A native failure before the origin spoke: ask through libcurl again.
        memory.learn(host: "a.test", port: 443, spokeHTTP2: false, now: 3000)
        memory.forget(host: "a.test", port: 443)
        #expect(!memory.choseHTTP1(host: "a.test", port: 443, now: 3001))
        // Bounded: a full table starts over.
        for i in 0..<TLSProtocolMemory.capacity { memory.learn(host: "h\(i).test", port: 443, spokeHTTP2: false, now: 0) }
        #expect(memory.count == TLSProtocolMemory.capacity)
        memory.learn(host: "one-more.test", port: 443, spokeHTTP2: false, now: 0)
        #expect(memory.count == 1)
    }

    @Test func priorKnowledgeIsCurl() {
        #expect(choose(http2: .priorKnowledge) == .init(engine: .curl, reason: "upstream.http2: prior_knowledge"))
        #expect(choose(http2: .priorKnowledge, forced: .native).reason == "upstream.http2: prior_knowledge")
        // Credentials and a parent proxy come first.
        #expect(choose(http2: .priorKnowledge, credentials: true).reason == "credentials (auth challenges)")
    }

    @Test func credentialsAreCurl() {
        #expect(choose(credentials: true) == .init(engine: .curl, reason: "credentials (auth challenges)"))
        #expect(choose(forced: .native, credentials: true).engine == .curl)
        #expect(choose(credentials: true, parentProxy: true).reason == "credentials (auth challenges)")
        #expect(choose(https: true, http2: .off, credentials: true).reason == "credentials (auth challenges)")
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
                                for (ocsp, learned) in [(false, false), (true, false), (false, true), (true, true)] {
                                    let c = choose(
                                        https: https, http2: http2, forced: forced, credentials: credentials,
                                        parentProxy: parentProxy, upgrade: upgrade, requiresOCSP: ocsp,
                                        originChoseHTTP1: learned)
                                    let tlsNeedsCurl = ocsp || (forced != .native && http2 != .off && !learned)
                                    let curlNeeded =
                                        upgrade || forced == .curl || credentials || parentProxy
                                        || (https ? tlsNeedsCurl : http2 == .priorKnowledge)
                                    #expect(c.engine == (curlNeeded ? .curl : .native))
                                    #expect(!c.reason.isEmpty)
                                }
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
