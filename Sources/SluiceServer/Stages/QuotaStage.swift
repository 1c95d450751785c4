import SluiceCore

/// `rate_limit` (docs/configuration.md, "Rate limits"): before each try — the first, every
/// retry, every followed redirect; never a cache hit — the policy's limits give the try its
/// turn: now, after a wait on the worker's timer or in the `max_concurrent` line (at most
/// `max_wait`, and never past `timeouts.total`; first come, first served per key), or not at
/// all: `429` with `Retry-After` (and the `RateLimit-Policy` / `RateLimit` fields), and
/// nothing is sent. In order: a `max_concurrent` place (held until the try ends), then the
/// schedule of the rates (GCRA, `RateLimiter`) and the hold the origin asked for
/// (`rate_limit.learn`, `learn` below). It comes after the circuit (a try that fails fast
/// takes no place).
enum QuotaStage: TryStage, ResponseStage {
    static var name: String { "rate_limit" }

    /// `rate_limit.learn`: a 429 or 503 whose pause the policy waits for holds the key's next
    /// tries, and this exchange tries again after it (`ResponseHeadContext.heldByOrigin`).
    static func head(
        _ response: inout ResponseHeadContext, _ exchange: Exchange, _ services: any StageServices
    )
        -> ResponseVerdict
    {
        if exchange.tryPolicy?.rateLimiting != nil, learn(response.response, exchange, services) {
            response.heldByOrigin = true
        }
        return .proceed
    }

    /// The try's `max_concurrent` place goes to the next in line.
    static func end(_ ending: TryEnding, _ exchange: Exchange, _ services: any StageServices) {
        guard let slot = exchange.owner?.takeQuotaSlot() else { return }
        services.rateLimits.releaseSlot(policy: slot.policy, key: slot.key, limit: slot.limit)
    }

    static func enter(_ request: inout UpstreamRequest, _ exchange: Exchange, _ services: any StageServices) -> TryVerdict {
        guard let limiting = exchange.tryPolicy?.rateLimiting else { return .proceed }
        let key = key(limiting.settings.key, request.target, exchange)
        let now = MonotonicClock.microseconds()
        let maxWait = maxWait(limiting, exchange, services)
        if let limit = limiting.settings.maxConcurrent, let owner = exchange.owner, owner.quotaSlot == nil {
            let table = services.rateLimits
            let policy = limiting.policy
            let answer = table.acquireSlot(policy: policy, key: key, limit: limit, queue: maxWait > 0, wake: services.quotaWake)
            switch answer {
            case .go?:
                owner.quotaSlot = QuotaSlot(policy: policy, key: key, limit: limit)
            case .wait(let ticket)?:
                table.noteWaiting(policy: policy, 1)
                return .wait(
                    .quota(
                        QuotaWait(
                            .slot(ticket: ticket), limiting, key: key, limit: "max_concurrent \(limit)", since: now,
                            deadline: now + maxWait)))
            case nil:
                return refuse(.concurrencyLimited(policy: policy, limit: limit), "max_concurrent \(limit)", exchange, services)
            }
        }
        return schedule(limiting, key: key, now: now, deadline: now + maxWait, exchange, services)
    }

    /// A turn for a try that cannot wait (`BackgroundTry`): now, or nil. Its `max_concurrent`
    /// place (if the policy has one) is taken without queueing; in the fleet's scope it goes
    /// only on a lease this worker holds (no round trip, and never a place a waiting request
    /// would have had).
    static func turnWithoutWaiting(
        _ limiting: RateLimiting, _ target: RequestTarget, _ exchange: Exchange, _ services: any StageServices
    ) -> QuotaTurn? {
        let table = services.rateLimits
        let policy = limiting.policy
        let key = key(limiting.settings.key, target, exchange)
        let now = MonotonicClock.microseconds()
        var slot: QuotaSlot?
        if let limit = limiting.settings.maxConcurrent {
            guard case .go? = table.acquireSlot(policy: policy, key: key, limit: limit, queue: false, wake: services.quotaWake)
            else { return nil }
            slot = QuotaSlot(policy: policy, key: key, limit: limit)
        }
        let allowed: Bool
        if limiting.settings.scope == .fleet, let fleet = services.fleet {
            allowed = fleet.takeLease(policy: policy, limits: limiting.settings.limits, key: key, now: now)
            if allowed { table.count(policy: policy, .allowed) }
        } else if case .go = table.acquire(policy: policy, limiting.settings, key: key, now: now, maxWait: 0) {
            allowed = true  // at once (no wait is allowed), counted by the table
        } else {
            allowed = false
        }
        guard allowed else {
            if let slot { table.releaseSlot(policy: policy, key: key, limit: slot.limit) }
            return nil
        }
        return QuotaTurn(slot: slot)
    }

    /// The rates' and the origin's part: go, wait on the timer until `deadline` at most, or 429
    /// — decided by the fleet's Redis when the policy's scope is the fleet (a round trip the
    /// driver waits for: `QuotaWait.Kind.fleet`), else by this process's table.
    static func schedule(
        _ limiting: RateLimiting, key: String, now: Int64, deadline: Int64, _ exchange: Exchange,
        _ services: any StageServices
    ) -> TryVerdict {
        if limiting.settings.scope == .fleet, let fleet = services.fleet {
            if let denial = services.rateLimits.fleetDenial(policy: limiting.policy, key: key, now: now) {
                // Refused by the fleet a moment ago: no round trip until then.
                return refused(limiting, key: key, retryAfter: denial.until - now, limit: denial.limit, exchange, services)
            }
            if limiting.settings.learn,
                case let held = services.rateLimits.holdRemaining(policy: limiting.policy, key: key, now: now), held > 5_000
            {
                // A hold this instance learned itself: waited out here without a round trip; the
                // fleet gives the try its place after it.
                guard now + held <= deadline else {
                    return refused(limiting, key: key, retryAfter: held, limit: nil, exchange, services)
                }
                services.rateLimits.noteWaiting(policy: limiting.policy, 1)
                let reason = services.rateLimits.holdReason(policy: limiting.policy, key: key) ?? "the origin's limit"
                let wait = QuotaWait(
                    .timer(milliseconds: Int((held + 999) / 1000), reservation: nil), limiting, key: key, limit: reason,
                    since: now, deadline: deadline)
                wait.scheduleAfter = true
                return .wait(.quota(wait))
            }
            if fleet.takeLease(policy: limiting.policy, limits: limiting.settings.limits, key: key, now: now) {
                // A place the fleet gave this worker ahead: no round trip.
                services.rateLimits.count(policy: limiting.policy, .allowed)
                if !exchange.summary.hasRateLimitRecord { exchange.summary.rateLimit = .allowed }
                return .proceed
            }
            guard fleet.client.isUsable else {
                return fallback(limiting, fleet, key: key, now: now, deadline: deadline, exchange, services)
            }
            return .wait(.quota(QuotaWait(.fleet, limiting, key: key, limit: "", since: now, deadline: deadline)))
        }
        return local(limiting, key: key, now: now, deadline: deadline, exchange, services)
    }

    /// What a try gets while the fleet's Redis does not answer (`fleet.on_redis_down`):
    /// `local_share` — the limits in this process, divided by the instances last seen alive;
    /// `allow` — no limit; `deny` — 503.
    static func fallback(
        _ limiting: RateLimiting, _ fleet: Fleet, key: String, now: Int64, deadline: Int64, _ exchange: Exchange,
        _ services: any StageServices
    ) -> TryVerdict {
        let mode = fleet.settings.onRedisDown
        fleet.shared.fallbacks.add(1, ordering: .relaxed)
        SluiceMetrics.shared.recordFleetFallback(mode: mode.rawValue)
        switch mode {
        case .allow:
            if !exchange.summary.hasRateLimitRecord { exchange.summary.rateLimit = .allowed }
            return .proceed
        case .deny:
            return refuse(.fleetUnavailable(policy: limiting.policy), "fleet.on_redis_down: deny", exchange, services)
        case .localShare:
            let n = max(1, fleet.shared.instancesAlive.load(ordering: .relaxed))
            var settings = limiting.settings
            settings.scope = .local
            settings.limits = settings.limits.map {
                RateLimit(requests: $0.requests, periodMilliseconds: $0.periodMilliseconds * n, burst: max(1, $0.burst / n))
            }
            let share = RateLimiting(policy: limiting.policy + " (local share)", settings: settings)
            return local(share, key: key, now: now, deadline: deadline, exchange, services)
        }
    }

    /// A try refused by the limit `index` (nil: the origin's hold) for `retryAfter` µs, by this
    /// process's table or (`fleet`) by the fleet's Redis, now or a moment ago: 429.
    static func refused(
        _ limiting: RateLimiting, key: String, retryAfter: Int64, limit index: Int?, fleet: Bool = true,
        _ exchange: Exchange, _ services: any StageServices
    ) -> TryVerdict {
        let seconds = max(1, Int((retryAfter + 999_999) / 1_000_000))
        let policy = limiting.policy
        guard let index, index < limiting.settings.limits.count else {
            let hold =
                services.rateLimits.holdReason(policy: policy, key: key)
                ?? (fleet ? "the origin's limit, learned by the fleet" : "the origin's limit")
            return refuse(
                .originRateLimited(policy: policy, host: exchange.target.authority, retryAfter: seconds), hold, exchange,
                services)
        }
        let limit = limiting.settings.limits[index]
        return refuse(
            .rateLimited(
                policy: policy, requests: limit.requests, windowSeconds: max(1, limit.periodMilliseconds / 1000),
                retryAfter: seconds), limit.description + (fleet ? " (fleet)" : ""), exchange, services)
    }

    /// This process's table decides.
    static func local(
        _ limiting: RateLimiting, key: String, now: Int64, deadline: Int64, _ exchange: Exchange,
        _ services: any StageServices
    ) -> TryVerdict {
        let table = services.rateLimits
        let policy = limiting.policy
        switch table.acquire(policy: policy, limiting.settings, key: key, now: now, maxWait: max(0, deadline - now)) {
        case .go(let delay, _) where delay == 0:
            if !exchange.summary.hasRateLimitRecord { exchange.summary.rateLimit = .allowed }
            return .proceed
        case .go(let delay, let reservation):
            table.noteWaiting(policy: policy, 1)
            let limit = binding(limiting.settings, policy: policy, key: key, now: now, delay: delay, table)
            return .wait(
                .quota(
                    QuotaWait(
                        .timer(milliseconds: Int((delay + 999) / 1000), reservation: reservation), limiting, key: key,
                        limit: limit, since: now, deadline: deadline)))
        case .refuse(let retryAfter, let index):
            return refused(limiting, key: key, retryAfter: retryAfter, limit: index, fleet: false, exchange, services)
        }
    }

    /// A try turned away: nothing is sent, the breaker's admission is returned, and the
    /// access log and the counters say why.
    static func refuse(
        _ error: ProxyError, _ limit: String, _ exchange: Exchange, _ services: any StageServices
    )
        -> TryVerdict
    {
        CircuitStage.reportOutcome(.abandoned, exchange, services.health)
        if let policy = exchange.tryPolicy { services.rateLimits.count(policy: policy.name, .rejected) }
        var record = exchange.summary.rateLimit ?? .allowed
        record.decision = .rejected
        record.limit = limit
        exchange.summary.rateLimit = record
        return .respond(error)
    }

    /// A wait ended with the try's turn: the access log and the histogram record it.
    static func waited(_ wait: QuotaWait, now: Int64, _ exchange: Exchange, _ services: any StageServices) {
        services.rateLimits.noteWaiting(policy: wait.policy, -1)
        services.rateLimits.count(policy: wait.policy, .waited)
        SluiceMetrics.shared.recordRateLimitWait(microseconds: now - wait.since)
        var record = exchange.summary.rateLimit ?? .allowed
        record.decision = .waited
        record.waitedMilliseconds += Int((now - wait.since) / 1000)
        record.limit = wait.limit
        exchange.summary.rateLimit = record
    }

    /// How long a try may wait, in µs: `max_wait` (0 with `on_limit: reject`), and never past
    /// `timeouts.total` counted from the request's arrival.
    static func maxWait(_ limiting: RateLimiting, _ exchange: Exchange, _ services: any StageServices) -> Int64 {
        guard limiting.settings.onLimit == .wait else { return 0 }
        var ms = limiting.settings.maxWait
        if let total = services.totalTimeout { ms = min(ms, max(0, total - exchange.inspect { $0.elapsed })) }
        return Int64(ms) * 1000
    }

    /// What held a waiting try back: the origin's hold when it is the longer, else the limit
    /// with the longest delay.
    private static func binding(
        _ settings: RateLimitSettings, policy: String, key: String, now: Int64, delay: Int64, _ table: RateLimitTable
    ) -> String {
        if settings.learn, table.holdRemaining(policy: policy, key: key, now: now) >= delay,
            let reason = table.holdReason(policy: policy, key: key)
        {
            return reason
        }
        return settings.limits.map(\.description).joined(separator: " and ")
    }

    /// What the request is counted by.
    static func key(_ key: RateLimitSettings.Key, _ target: RequestTarget, _ exchange: Exchange) -> String {
        switch key {
        case .host:
            return target.host
        case .client:
            return exchange.client.address
        case .user:
            return exchange.summary.user ?? ""
        case .header(let name):
            let head = exchange.head
            return head.fields.first { head.field($0, isNamed: name) }.map { head.value($0) } ?? ""
        }
    }

    /// An origin's answer under a policy that learns (`rate_limit.learn`, never a cache hit's):
    /// a hold it asks for is kept for the try's key, so that the requests after it wait (or
    /// are refused) instead of reaching it. True when the answer was a 429 or 503 whose hold may
    /// be waited for — within `max_wait` and the retry policy's deadline — (the exchange may
    /// then try again when it ends: `ExchangeMachine.Event.heldByOrigin`).
    static func learn(_ response: UpstreamResponseHead, _ exchange: Exchange, _ services: any StageServices) -> Bool {
        guard let limiting = exchange.tryPolicy?.rateLimiting, limiting.settings.learn else { return false }
        let collected = response.collected
        let status = response.status
        guard status == 429 || status == 503 || collected.mentionsRateLimit() else { return false }
        guard
            let hold = RateLimitLearning.hold(
                status: response.status, wallClockNow: SystemClock().wallClockMilliseconds(), { collected.value($0) })
        else { return false }
        let now = MonotonicClock.microseconds()
        let key = key(limiting.settings.key, exchange.target, exchange)
        services.rateLimits.learn(policy: limiting.policy, key: key, hold: hold, now: now)
        if limiting.settings.scope == .fleet, let fleet = services.fleet {
            fleet.learn(policy: limiting.policy, key: key, milliseconds: hold.milliseconds)
        }
        Log.info(
            "rate_limit: \(exchange.target.authority) asked for no requests for \(hold.milliseconds) ms (\(hold.reason)); policy \(limiting.policy) holds them"
        )
        guard status == 429 || status == 503, limiting.settings.onLimit == .wait,
            Int64(hold.milliseconds) * 1000 <= maxWait(limiting, exchange, services)
        else { return false }
        if let deadline = exchange.policy.retryPolicy?.deadline {
            return exchange.inspect { $0.elapsed } + hold.milliseconds < deadline
        }
        return true
    }

}
