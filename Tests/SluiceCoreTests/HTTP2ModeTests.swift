import Testing

@testable import SluiceCore

/// `upstream.http2`'s decision: the HTTP version and multiplexing wait per mode and scheme.
@Suite struct HTTP2ModeTests {
    @Test func choices() {
        #expect(HTTP2Mode.auto.protocolChoice(https: true) == .init(version: .negotiated, waitsForMultiplexing: true))
        #expect(HTTP2Mode.auto.protocolChoice(https: false) == .init(version: .http1, waitsForMultiplexing: false))
        #expect(HTTP2Mode.off.protocolChoice(https: true) == .init(version: .http1, waitsForMultiplexing: false))
        #expect(HTTP2Mode.off.protocolChoice(https: false) == .init(version: .http1, waitsForMultiplexing: false))
        #expect(
            HTTP2Mode.priorKnowledge.protocolChoice(https: false) == .init(version: .priorKnowledge, waitsForMultiplexing: true))
        #expect(HTTP2Mode.priorKnowledge.protocolChoice(https: true) == .init(version: .negotiated, waitsForMultiplexing: true))
    }

    @Test func yamlNamesAndDefaults() {
        #expect(HTTP2Mode.allCases.map(\.rawValue) == ["auto", "off", "prior_knowledge"])
        #expect(UpstreamPoolLimits() == UpstreamPoolLimits(maxConnectionsPerHost: 0, maxStreams: 100))
        #expect(UpstreamOverride(scheme: .https).http2 == .auto)
    }
}
