/// The transport one upstream try runs on, `upstream.engine:` in a policy's `upstream:`
/// section (docs/configuration.md, "Upstream engine").
///
/// Sluice has two:
/// - `native`: its own HTTP/1.1 client, for origins reached directly over plain http, and over
///   TLS when the origin speaks HTTP/1.1;
/// - `curl`: libcurl, for everything else: HTTP/2 (by ALPN or h2c prior knowledge),
///   Basic/Digest challenges (`credentials:`), upgrade handshakes (WebSocket…), parent
///   proxies (`upstream_proxy:`) and OCSP stapling.
///
/// The choice is made per try by `choose(https:http2:forced:credentials:parentProxy:upgrade:requiresOCSP:originChoseHTTP1:)`
/// (the rule is listed there), which also gives the reason. `upstream.engine: native | curl`
/// forces one where the rule allows it; without the key the rule decides alone. The try's
/// engine is in the access log (`upstream_engine`) and `sluice check --host` prints the
/// choice for a plain-http request to the host.
///
/// Threading: values, computed on the try's worker thread (and by `sluice check`).
public enum UpstreamEngine: String, Sendable, Equatable, CaseIterable {
    /// Sluice's own HTTP/1.1 client (plain http only).
    case native
    /// libcurl.
    case curl
}

extension UpstreamEngine {
    /// The engine for one try, and why: a short phrase for `sluice check --host` and
    /// diagnostics.
    ///
    /// Threading: a value.
    public struct Choice: Sendable, Equatable {
        public let engine: UpstreamEngine
        public let reason: String
        public init(engine: UpstreamEngine, reason: String) {
            self.engine = engine
            self.reason = reason
        }
    }

    /// The rule, first match wins:
    /// 1. an upgrade handshake (WebSocket…) → curl, "upgrade handshake";
    /// 2. `forced == .curl` → curl, "upstream.engine: curl";
    /// 3. credentials → curl, "credentials (auth challenges)";
    /// 4. a parent proxy → curl, "upstream_proxy";
    /// 5. plain http with `http2: prior_knowledge` → curl, "upstream.http2: prior_knowledge";
    /// 6. https:
    ///    - the trust requires a stapled OCSP response → curl, "OCSP stapling (trust)";
    ///    - `forced == .native` → native, "upstream.engine: native (HTTP/1.1 over TLS)";
    ///    - `http2: off` → native, "https origin, upstream.http2: off";
    ///    - the origin chose HTTP/1.1 by ALPN when this worker last asked it (`originChoseHTTP1`,
    ///      `TLSProtocolMemory`) → native, "https origin that chose HTTP/1.1 by ALPN";
    ///    - otherwise → curl, "https origin, HTTP/2 offered by ALPN" (libcurl negotiates; what the
    ///      origin chooses is remembered for the next tries);
    /// 7. otherwise native: "upstream.engine: native" when forced, else "plain http origin".
    ///
    /// - Parameters:
    ///   - https: the try goes to the origin over TLS (an `https://` URL, or
    ///     `upstream: { scheme: https }`).
    ///   - http2: the policy's `upstream.http2`.
    ///   - forced: the policy's `upstream.engine`, nil when not written.
    ///   - credentials: the policy has `credentials:` (Basic/Digest challenges are libcurl's).
    ///   - parentProxy: the try goes through an `upstream_proxy`.
    ///   - upgrade: the request is an upgrade handshake carried to the origin.
    ///   - requiresOCSP: the host's trust demands a stapled OCSP response.
    ///   - originChoseHTTP1: this worker saw the origin choose HTTP/1.1 by ALPN lately.
    public static func choose(
        https: Bool, http2: HTTP2Mode, forced: UpstreamEngine?, credentials: Bool,
        parentProxy: Bool, upgrade: Bool, requiresOCSP: Bool = false, originChoseHTTP1: Bool = false
    ) -> Choice {
        if upgrade { return Choice(engine: .curl, reason: "upgrade handshake") }
        if forced == .curl { return Choice(engine: .curl, reason: "upstream.engine: curl") }
        if credentials { return Choice(engine: .curl, reason: "credentials (auth challenges)") }
        if parentProxy { return Choice(engine: .curl, reason: "upstream_proxy") }
        if https {
            if requiresOCSP { return Choice(engine: .curl, reason: "OCSP stapling (trust)") }
            if forced == .native { return Choice(engine: .native, reason: "upstream.engine: native (HTTP/1.1 over TLS)") }
            if http2 == .off { return Choice(engine: .native, reason: "https origin, upstream.http2: off") }
            if originChoseHTTP1 { return Choice(engine: .native, reason: "https origin that chose HTTP/1.1 by ALPN") }
            return Choice(engine: .curl, reason: "https origin, HTTP/2 offered by ALPN")
        }
        if http2 == .priorKnowledge { return Choice(engine: .curl, reason: "upstream.http2: prior_knowledge") }
        return Choice(engine: .native, reason: forced == .native ? "upstream.engine: native" : "plain http origin")
    }
}

/// What https origins chose by ALPN when libcurl offered them HTTP/2 and HTTP/1.1
/// (`upstream.http2: auto`), per worker: an origin that chose HTTP/1.1 is reached by the
/// native transport for `ttlMilliseconds` (10 minutes); then one try goes through libcurl
/// again and asks anew, so an origin that starts to speak HTTP/2 is noticed. An origin that
/// chose HTTP/2 is forgotten (it stays libcurl's).
///
/// Threading: a value owned by one worker; the clock is the caller's (monotonic ms).
public struct TLSProtocolMemory: Sendable {
    public static let ttlMilliseconds = 600_000
    /// Origins remembered at most; the table is emptied when it is full (each then asks once
    /// more through libcurl).
    public static let capacity = 4096

    private struct Origin: Hashable {
        let host: String
        let port: Int
    }
    /// When each origin's answer stops counting.
    private var http1Until: [Origin: Int] = [:]

    public init() {}

    /// A try through libcurl over TLS ended having spoken `version` to `host:port`.
    public mutating func learn(host: String, port: Int, spokeHTTP2: Bool, now: Int) {
        let origin = Origin(host: host, port: port)
        if spokeHTTP2 {
            http1Until[origin] = nil
            return
        }
        if http1Until.count >= Self.capacity, http1Until[origin] == nil { http1Until.removeAll() }
        http1Until[origin] = now + Self.ttlMilliseconds
    }

    /// A native try to the origin failed before it spoke (connect, handshake, trust): the next
    /// try asks through libcurl again, so a failure of the native path alone does not persist.
    public mutating func forget(host: String, port: Int) {
        guard !http1Until.isEmpty else { return }
        http1Until[Origin(host: host, port: port)] = nil
    }

    /// The origin chose HTTP/1.1 within the last `ttlMilliseconds`.
    public func choseHTTP1(host: String, port: Int, now: Int) -> Bool {
        guard !http1Until.isEmpty, let until = http1Until[Origin(host: host, port: port)] else { return false }
        return now < until
    }

    public var count: Int { http1Until.count }
}
