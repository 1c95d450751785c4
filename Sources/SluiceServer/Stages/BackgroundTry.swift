import SluiceCore

/// A request Sluice sends upstream for itself on a client's behalf — a background revalidation
/// (stale-while-revalidate, `CacheRevalidation`) — as a try like any other, though no client
/// waits for it: its origin's circuit admits it and hears its outcome (`CircuitStage`), it
/// takes its `rate_limit` turn (`QuotaStage`) and holds its `max_concurrent` place until it
/// ends, and it is counted (`sluice_upstream_tries_total{kind="revalidation"}`). It never
/// waits: when its circuit is not closed (it would neither be a trial nor tell the breaker
/// anything) or its turn is not now, it is not sent — the stale response stays, and the
/// blocking revalidation once the window ends is a try of its own exchange.
///
/// Threading: made and finished on the worker's thread (the revalidation's completion).
final class BackgroundTry {
    private let circuit: CircuitStage.Admitted?
    private let slot: QuotaSlot?
    private let health: UpstreamHealth
    private let rateLimits: RateLimitTable
    private let fleet: Fleet?
    private var finished = false

    private init(circuit: CircuitStage.Admitted?, slot: QuotaSlot?, _ services: any StageServices) {
        self.circuit = circuit
        self.slot = slot
        health = services.health
        rateLimits = services.rateLimits
        fleet = services.fleet
    }

    /// The try stages' admission of a background request to `exchange`'s current target, by
    /// its policy; nil when it may not go now.
    static func admit(_ exchange: Exchange, _ services: any StageServices) -> BackgroundTry? {
        let policy = exchange.tryPolicy ?? exchange.policy
        var circuit: CircuitStage.Admitted?
        if let settings = policy.health {
            guard let admitted = CircuitStage.admitWithoutWaiting(exchange.target, settings, services) else { return nil }
            circuit = admitted
        }
        var slot: QuotaSlot?
        if let limiting = policy.rateLimiting {
            guard let turn = QuotaStage.turnWithoutWaiting(limiting, exchange.target, exchange, services) else {
                if let circuit { CircuitStage.report(.abandoned, circuit, services.health, fleet: services.fleet) }
                return nil
            }
            slot = turn.slot
        }
        SluiceMetrics.shared.recordTry(.revalidation)
        return BackgroundTry(circuit: circuit, slot: slot, services)
    }

    /// The request ended (`outcome`; `.abandoned` when it was not sent after all): the breaker
    /// hears it and the place goes to the next in line. Once.
    func finish(_ outcome: HealthOutcome) {
        guard !finished else { return }
        finished = true
        if let circuit { CircuitStage.report(outcome, circuit, health, fleet: fleet) }
        if let slot { rateLimits.releaseSlot(policy: slot.policy, key: slot.key, limit: slot.limit) }
    }

    deinit { finish(.abandoned) }
}
