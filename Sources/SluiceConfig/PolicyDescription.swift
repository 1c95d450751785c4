import SluiceCore

/// Human-readable effective policies for `sluice check --host`. Secrets print as
/// `<redacted>` (through `Secret`'s description and a final scrub).
public enum PolicyDescription {
    public static func describe(_ pipeline: Pipeline, host: String) -> String {
        let policy = pipeline.policies.match(host: host)
        var lines = ["policy for \(host): \(policy.name)"]
        if policy.adapters.isEmpty {
            lines.append("  adapters: none")
        } else {
            lines.append("  adapters (in order):")
            for (i, sourced) in policy.adapters.enumerated() {
                let timing = sourced.adapter.timing == .everyTry ? " (every try)" : ""
                lines.append("    \(i + 1). \(pipeline.describeAdapter(sourced.adapter))\(timing)  [from \(sourced.entry)]")
            }
        }
        if let reader = policy.bodyReader {
            lines.append("  max_body: \(policy.maxBody) bytes (the request body is read whole for \(reader))")
        }
        lines.append("  redirect: \(describe(policy.redirector))")
        if let retry = policy.retryPolicy {
            lines.append(
                "  retry: limit \(retry.limit), backoff \(retry.base)^n x \(retry.scale) ms (max \(retry.maxDelay) ms, "
                    + "jitter \(retry.jitter.rawValue)), methods \(retry.methods.sorted().joined(separator: " ")), "
                    + "statuses \(retry.statuses.sorted().map(String.init).joined(separator: " "))")
        } else {
            lines.append("  retry: none")
        }
        if let v = policy.validator {
            lines.append(
                "  validate: status \(v.statuses.map { "\($0.lowerBound)-\($0.upperBound)" }.joined(separator: ", "))"
                    + (v.contentTypes.isEmpty ? "" : ", content_type \(v.contentTypes.joined(separator: ", "))"))
        }
        if let c = policy.credentials {
            lines.append("  credentials: username \(c.username), password \(c.password) (\(c.password.source))")
        }
        lines.append("  trust: \(describe(policy.trust))")
        if let up = policy.upstream {
            var parts: [String] = []
            if let scheme = up.scheme { parts.append("scheme \(scheme.rawValue)") }
            if let port = up.port { parts.append("port \(port)") }
            parts.append("http2 \(up.http2.rawValue)")
            if let engine = up.engine { parts.append("engine \(engine.rawValue)") }
            lines.append("  upstream: " + parts.joined(separator: ", "))
        }
        lines.append("  upstream engine: \(describeEngine(policy))")
        if let parent = policy.upstreamProxy {
            lines.append(
                "  upstream_proxy: \(parent.url)"
                    + (parent.noProxy.isEmpty ? "" : ", no_proxy \(parent.noProxy.joined(separator: " "))")
                    + (parent.auth.map { ", username \($0.username), password \($0.password) (\($0.password.source))" } ?? ""))
        }
        if let cert = policy.clientCertificate {
            lines.append(
                "  client_certificate: \(cert.certificate), key \(cert.key)"
                    + (cert.passphrase.map { ", passphrase \($0) (\($0.source))" } ?? ""))
        }
        if let health = policy.health {
            lines.append(
                "  health: circuit opens after \(health.consecutiveFailures) failures in a row, cooldown \(health.cooldown) ms, "
                    + (health.probe.map { "probe GET \($0.path) every \($0.interval) ms" }
                        ?? "no probe (a trial request closes it)"))
        }
        if let limit = policy.rateLimit {
            var parts: [String] = []
            if !limit.limits.isEmpty {
                parts.append(limit.limits.map { "\($0) (burst \($0.burst))" }.joined(separator: " and "))
            }
            if let n = limit.maxConcurrent { parts.append("at most \(n) upstream at once") }
            if parts.isEmpty { parts.append("only the origin's own limit") }
            let onLimit =
                limit.onLimit == .wait
                ? "over it a request waits up to \(limit.maxWait) ms for its turn, then 429"
                : "over it a request is answered 429 at once"
            let learn = limit.learn ? "; learns the origin's own limit (429/503 Retry-After, RateLimit, X-RateLimit-*)" : ""
            lines.append(
                "  rate_limit: \(parts.joined(separator: ", ")) per \(limit.key), in this process; \(onLimit)\(learn)")
        }
        if policy.intercept { lines.append("  intercept: true (CONNECTs answered with Sluice's TLS)") }
        let upgrades = policy.upgrades
        lines.append(
            upgrades.allowed.isEmpty
                ? "  upgrades: none"
                : "  upgrades: \(upgrades.allowed.joined(separator: ", ")), idle timeout \(upgrades.idleTimeout) ms")
        lines.append("  cache: \(describe(policy.cache))")
        if policy.resume {
            let limit = policy.retryPolicy.map { "\($0.limit) (retry.limit)" } ?? "\(Resume.defaultLimit)"
            lines.append(
                "  resume: a GET cut mid-body with a strong validator is resumed (Range + If-Range), up to \(limit) times")
        } else {
            lines.append("  resume: false (a GET cut mid-body ends incomplete)")
        }
        let monitors = pipeline.monitors.map(\.summary)
        lines.append("  monitors: \(monitors.isEmpty ? "none" : monitors.joined(separator: ", "))")
        return pipeline.redactor.scrub(lines.joined(separator: "\n"))
    }

    /// The engine a plain-http request to the host (not an upgrade) is sent with, and why:
    /// `UpstreamEngine.choose` with the policy's values. https when its `upstream` sends such
    /// requests over TLS — then also what happens once the origin chose HTTP/1.1 by ALPN; the
    /// parent proxy counts whatever its `no_proxy` says (libcurl matches it per request).
    static func describeEngine(_ policy: HostPolicy) -> String {
        let https = policy.upstream?.scheme == .https
        func choice(originChoseHTTP1: Bool) -> UpstreamEngine.Choice {
            UpstreamEngine.choose(
                https: https, http2: policy.http2,
                forced: policy.upstreamEngine, credentials: policy.credentials != nil,
                parentProxy: policy.upstreamProxy != nil, upgrade: false,
                requiresOCSP: https && policy.trust.requirements.requireOCSP, originChoseHTTP1: originChoseHTTP1)
        }
        let first = choice(originChoseHTTP1: false)
        let learned = choice(originChoseHTTP1: true)
        guard learned != first else { return "\(first.engine.rawValue) (\(first.reason))" }
        return "\(first.engine.rawValue) (\(first.reason)), then \(learned.engine.rawValue) (\(learned.reason))"
    }

    /// `cache` (RFC 9111 shared cache, when a cache_store exists), `do_not_cache`, or the
    /// `modify` rules.
    static func describe(_ cache: CacheBehavior) -> String {
        switch cache {
        case .cache: return "cache (RFC 9111 shared cache, when cache_store is set)"
        case .doNotCache: return "do_not_cache"
        case .modify(let m):
            var parts: [String] = []
            if let f = m.freshness { parts.append("freshness \(f) s") }
            if let f = m.maxFreshness { parts.append("max_freshness \(f) s") }
            if !m.ignoredDirectives.isEmpty {
                parts.append("IGNORES origin " + m.ignoredDirectives.map(\.rawValue).sorted().joined(separator: ", "))
            }
            if !m.dropResponseHeaders.isEmpty { parts.append("drops " + m.dropResponseHeaders.joined(separator: ", ")) }
            if !m.keyRequestHeaders.isEmpty { parts.append("keys on " + m.keyRequestHeaders.joined(separator: ", ")) }
            return "modify" + (parts.isEmpty ? "" : ": " + parts.joined(separator: "; "))
        }
    }

    static func describe(_ trust: ServerTrust) -> String {
        guard trust.isAllowed else { return "none: refused (tls.all_hosts_must_be_evaluated)" }
        let r = trust.requirements
        if r.insecure { return "disabled (INSECURE: certificates are not verified)" }
        var parts = [trust.evaluatorName]
        parts.append(r.validateChain ? "chain against \(r.caFile ?? "tls.ca_file or the system store")" : "chain not validated")
        parts.append(r.validateHost ? "host validated" : "host not validated")
        if !r.crls.isEmpty { parts.append("\(r.crls.count) CRL(s)") }
        if r.requireOCSP { parts.append("OCSP stapling required") }
        if !r.certificatePins.isEmpty { parts.append("\(r.certificatePins.map(\.count).reduce(0, +)) pinned certificate(s)") }
        if !r.publicKeyPins.isEmpty {
            let pins = r.publicKeyPins.flatMap { $0 }.map { "sha256/" + Base64.encode($0) }.sorted()
            parts.append("public key pins " + pins.joined(separator: " "))
        }
        return parts.joined(separator: "; ")
    }

    static func describe(_ redirector: Redirector) -> String {
        switch redirector.behavior {
        case .doNotFollow: return "do_not_follow"
        case .follow(let max): return "follow (max \(max))"
        case .modify(let max, let rewrites):
            return "modify (max \(max); " + rewrites.map { "\($0.from) -> \($0.to)" }.joined(separator: ", ") + ")"
        }
    }
}
