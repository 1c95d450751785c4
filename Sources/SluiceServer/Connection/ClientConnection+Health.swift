import SluiceCore

/// A try's side of circuit breaking (`health:`): before a try to an origin whose policy has
/// `health:`, its `CircuitBreaker` (in the process-wide `UpstreamHealth`) says whether it may
/// go — or the request is answered `503` at once (`ProxyError.upstreamCircuitOpen`); when the
/// try ends, how it ended is reported back (`HealthOutcome`). Every try is an event: a retry
/// asks again, so a retry scheduled before the circuit opened fails fast instead of reaching
/// the origin, and a redirect hop asks the breaker of the origin it goes to.
///
/// Threading: the connection's worker thread; `UpstreamHealth` takes its own lock.
extension ClientConnection {
    /// One try admitted by a breaker, until its outcome is reported.
    struct CircuitTry {
        let origin: UpstreamHealth.Origin
        let settings: Health
        /// The half-open circuit's one trial.
        let trial: Bool
    }

    /// Asks `target`'s breaker; false when the request was answered `503` instead.
    func admitToOrigin(_ target: RequestTarget, _ settings: Health, _ exchange: Exchange) -> Bool {
        let origin = UpstreamHealth.Origin(
            scheme: target.scheme == .https ? "https" : "http", host: target.host, port: target.port)
        let answer = worker.health.handle(.attempt, for: origin, settings: settings, now: MonotonicClock.milliseconds())
        exchange.summary.circuit = answer.state.rawValue
        Self.log(answer.change, probe: settings.probe != nil)
        switch answer.action {
        case .failFast(let seconds):
            SluiceMetrics.shared.recordCircuitFailedFast(origin: origin.name)
            transferFailed(.upstreamCircuitOpen(host: target.authority, retryAfter: seconds), kind: .other)
            return false
        case .allowTrial:
            exchange.circuitTry = CircuitTry(origin: origin, settings: settings, trial: true)
        default:
            exchange.circuitTry = CircuitTry(origin: origin, settings: settings, trial: false)
        }
        return true
    }

    /// Reports how the current try ended to its breaker (nothing when none admitted it).
    func reportTryOutcome(_ outcome: HealthOutcome) {
        guard let exchange, let attempt = exchange.circuitTry else { return }
        exchange.circuitTry = nil
        let answer = worker.health.handle(
            .ended(outcome, trial: attempt.trial), for: attempt.origin,
            settings: attempt.settings, now: MonotonicClock.milliseconds())
        exchange.summary.circuit = answer.state.rawValue
        Self.log(answer.change, probe: attempt.settings.probe != nil)
    }

    /// A warning when a circuit opens (and the `opened` counter), a line when it closes; the
    /// trials and probes in between (every cooldown or interval while the origin is down) at
    /// debug level. `probe`: the origin's circuit is probed.
    static func log(_ change: UpstreamHealth.Change?, probe: Bool = false) {
        guard let change else { return }
        let name = change.origin.name
        switch (change.from, change.to) {
        case (.closed, .open):
            SluiceMetrics.shared.recordCircuitOpened(origin: name)
            let failures = change.consecutiveFailures == 1 ? "1 failure" : "\(change.consecutiveFailures) failures in a row"
            Log.warning("upstream \(name): circuit open after \(failures); requests fail fast with 503")
        case (.halfOpen, .open):
            Log.debug("upstream \(name): the \(probe ? "probe" : "trial request") failed; circuit open again")
        case (_, .halfOpen):
            Log.debug("upstream \(name): circuit half-open; \(probe ? "probing" : "the next request tries") the origin")
        case (_, .closed):
            Log.info("upstream \(name): circuit closed; the origin answers again")
        default:
            break
        }
    }
}
