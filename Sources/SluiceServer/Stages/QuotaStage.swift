import SluiceCore

/// `rate_limit` (docs/configuration.md, "Rate limits"): before each try — the first, every
/// retry, every followed redirect; never a cache hit — the policy's limits (GCRA,
/// `RateLimiter`) give the try its turn: now, after an exact wait on the worker's timer (at
/// most `max_wait`; first come, first served per key), or not at all: `429` with
/// `Retry-After` and the `RateLimit-Policy` / `RateLimit` fields, and nothing is sent. It
/// comes after the circuit (a try that fails fast takes no place in the schedule).
enum QuotaStage: TryStage {
    static var name: String { "rate_limit" }

    static func enter(_ request: inout UpstreamRequest, _ exchange: Exchange, _ services: any StageServices) -> StageVerdict {
        guard let policy = exchange.tryPolicy, let settings = policy.rateLimit else { return .proceed }
        let maxWait: Int64 = settings.onLimit == .reject ? 0 : Int64(settings.maxWait) * 1000
        let decision = services.rateLimits.acquire(
            policy: policy.name, settings, key: key(settings.key, request, exchange),
            now: MonotonicClock.microseconds(), maxWait: maxWait)
        switch decision {
        case .go(let delay, _) where delay == 0:
            return .proceed
        case .go(let delay, let reservation):
            return .wait(
                .quota(
                    QuotaWait(
                        milliseconds: Int((delay + 999) / 1000), policy: policy.name, settings: settings,
                        reservation: reservation)))
        case .refuse(let retryAfter, let index):
            CircuitStage.reportOutcome(.abandoned, exchange, services.health)
            let limit = settings.limits[index]
            return .respond(
                .rateLimited(
                    policy: policy.name, requests: limit.requests, windowSeconds: max(1, limit.periodMilliseconds / 1000),
                    retryAfter: max(1, Int((retryAfter + 999_999) / 1_000_000))))
        }
    }

    /// What the request is counted by.
    static func key(_ key: RateLimitSettings.Key, _ request: UpstreamRequest, _ exchange: Exchange) -> String {
        switch key {
        case .host:
            return request.target.host
        case .client:
            return exchange.client.address
        case .user:
            return exchange.summary.user ?? ""
        case .header(let name):
            let head = exchange.head
            return head.fields.first { head.field($0, isNamed: name) }.map { head.value($0) } ?? ""
        }
    }
}
