/// The transport one upstream try runs on, `upstream.engine:` in a policy's `upstream:`
/// section (docs/configuration.md, "Upstream engine").
///
/// Sluice has two:
/// - `native`: its own HTTP/1.1 client, for plain-http origins reached directly;
/// - `curl`: libcurl, for everything else: https (TLS, ALPN, HTTP/2), h2c prior knowledge,
///   Basic/Digest challenges (`credentials:`), upgrade handshakes (WebSocket…) and parent
///   proxies (`upstream_proxy:`).
///
/// The choice is made per try by `choose(https:http2:forced:credentials:parentProxy:upgrade:)`
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
    /// 3. https → curl, "https origin" (forced `native` does not change this, and the reason
    ///    says so: "https origin (upstream.engine: native is for http origins)");
    /// 4. `http2 == .priorKnowledge` → curl, "upstream.http2: prior_knowledge";
    /// 5. credentials → curl, "credentials (auth challenges)";
    /// 6. a parent proxy → curl, "upstream_proxy";
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
    public static func choose(
        https: Bool, http2: HTTP2Mode, forced: UpstreamEngine?, credentials: Bool,
        parentProxy: Bool, upgrade: Bool
    ) -> Choice {
        if upgrade { return Choice(engine: .curl, reason: "upgrade handshake") }
        if forced == .curl { return Choice(engine: .curl, reason: "upstream.engine: curl") }
        if https {
            return Choice(
                engine: .curl,
                reason: forced == .native
                    ? "https origin (upstream.engine: native is for http origins)" : "https origin")
        }
        if http2 == .priorKnowledge { return Choice(engine: .curl, reason: "upstream.http2: prior_knowledge") }
        if credentials { return Choice(engine: .curl, reason: "credentials (auth challenges)") }
        if parentProxy { return Choice(engine: .curl, reason: "upstream_proxy") }
        return Choice(engine: .native, reason: forced == .native ? "upstream.engine: native" : "plain http origin")
    }
}
