/// `http2:` in a policy's `upstream:` section, and the server's `upstream:` section
/// (`max_connections_per_host`, `max_streams`): which HTTP version Sluice speaks to an origin
/// and how many connections and streams a worker opens to it.
///
/// Value types only: the decision (`HTTP2Mode.protocolChoice(https:)`) is made here and
/// unit-tested; `Sources/SluiceServer/Upstream/CurlUpstreamTransfer.swift` hands the choice to
/// libcurl (`CURLOPT_HTTP_VERSION`, `CURLOPT_PIPEWAIT`) and `UpstreamSession` the pool
/// limits (`CURLMOPT_MAX_HOST_CONNECTIONS`, `CURLMOPT_MAX_CONCURRENT_STREAMS`).
///
/// Threading: immutable values, shared read-only by every worker.
public enum HTTP2Mode: String, Sendable, Equatable, CaseIterable {
    /// The default: HTTP/2 when a TLS origin selects it by ALPN (`h2`, else `http/1.1`);
    /// HTTP/1.1 on plain http (no `Upgrade: h2c`).
    case auto
    /// HTTP/1.1 only (ALPN offers `http/1.1` alone).
    case off
    /// HTTP/2 from the first byte on plain http (h2c, RFC 9113 §3.3), for an origin known to
    /// speak it; on https the same as `auto` (TLS always negotiates by ALPN).
    case priorKnowledge = "prior_knowledge"

    /// What one try asks libcurl for.
    ///
    /// Threading: a value, made and used on the try's worker thread.
    public struct ProtocolChoice: Sendable, Equatable {
        public init(version: Version, waitsForMultiplexing: Bool) {
            self.version = version
            self.waitsForMultiplexing = waitsForMultiplexing
        }
        public enum Version: Sendable, Equatable {
            /// HTTP/1.1 only.
            case http1
            /// ALPN offers `h2` and `http/1.1` (libcurl's `CURL_HTTP_VERSION_2TLS`).
            case negotiated
            /// HTTP/2 without negotiation on plain http (`CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE`).
            case priorKnowledge
        }
        public var version: Version
        /// A try that may be multiplexed waits for a connection to the same origin that is
        /// still being set up to learn whether it speaks HTTP/2, instead of opening one of
        /// its own (`CURLOPT_PIPEWAIT`): 64 requests arriving at once share one connection.
        /// Against an HTTP/1.1-only TLS origin the waiting tries then open their own
        /// connections once the first handshake has told.
        public var waitsForMultiplexing: Bool
    }

    public func protocolChoice(https: Bool) -> ProtocolChoice {
        switch (self, https) {
        case (.off, _): return ProtocolChoice(version: .http1, waitsForMultiplexing: false)
        case (.auto, false): return ProtocolChoice(version: .http1, waitsForMultiplexing: false)
        case (.auto, true), (.priorKnowledge, true): return ProtocolChoice(version: .negotiated, waitsForMultiplexing: true)
        case (.priorKnowledge, false): return ProtocolChoice(version: .priorKnowledge, waitsForMultiplexing: true)
        }
    }
}

/// The server's `upstream:` section: limits on each worker's pool of origin connections.
/// libcurl keeps one pool per worker (its multi handle), so both limits count per worker:
/// with `workers: 4` and `max_connections_per_host: 8`, up to 32 connections reach a host.
///
/// Threading: an immutable part of `ServerConfiguration`, read by each worker when its
/// `UpstreamSession` is created.
public struct UpstreamPoolLimits: Sendable, Equatable {
    /// Connections one worker opens to one origin (`host:port`) at most; 0 = no limit (the
    /// default). A try beyond the limit waits inside libcurl for a free connection (or a free
    /// HTTP/2 stream), and its per-try timeout runs while it waits.
    public var maxConnectionsPerHost: Int
    /// Concurrent streams on one HTTP/2 connection at most (default 100; the origin's
    /// `SETTINGS_MAX_CONCURRENT_STREAMS` lowers it further). A try beyond it opens another
    /// connection, unless `maxConnectionsPerHost` stops that.
    public var maxStreams: Int

    public static let defaultMaxStreams = 100

    public init(maxConnectionsPerHost: Int = 0, maxStreams: Int = UpstreamPoolLimits.defaultMaxStreams) {
        self.maxConnectionsPerHost = maxConnectionsPerHost
        self.maxStreams = maxStreams
    }
}
