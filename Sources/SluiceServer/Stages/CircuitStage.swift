import SluiceCore

/// `health` (docs/configuration.md, "Upstream health and circuit breaking"): before a try to
/// an origin whose policy has `health:`, its `CircuitBreaker` (in the process-wide
/// `UpstreamHealth`) says whether it may go — or the try fails at once with `503`
/// (`ProxyError.upstreamCircuitOpen`); when the try ends, how it ended is reported back
/// (`reportOutcome`). Every try asks: a retry scheduled before the circuit opened fails fast
/// instead of reaching the origin, and a redirect hop asks the breaker of the origin it goes to.
///
/// Threading: the worker's thread; `UpstreamHealth` takes its own lock.
enum CircuitStage: TryStage, ResponseStage {
    static var name: String { "health" }

    /// The try's outcome by its response's status (a 5xx counts against the origin).
    static func head(
        _ response: inout ResponseHeadContext, _ exchange: Exchange, _ services: any StageServices
    )
        -> ResponseVerdict
    {
        reportOutcome(HealthOutcome(status: response.response.status), exchange, services.health, fleet: services.fleet)
        return .proceed
    }

    /// A try that ended without a head reports its failure (or nothing, abandoned).
    static func end(_ ending: TryEnding, _ exchange: Exchange, _ services: any StageServices) {
        reportOutcome(ending.healthOutcome, exchange, services.health, fleet: services.fleet)
    }

    /// One try admitted by a breaker, until its outcome is reported (boxed: only policies with
    /// `health:` have one, and an exchange's size is watched).
    final class Admitted {
        let origin: UpstreamHealth.Origin
        let settings: Health
        /// The half-open circuit's one trial.
        let trial: Bool

        init(origin: UpstreamHealth.Origin, settings: Health, trial: Bool) {
            self.origin = origin
            self.settings = settings
            self.trial = trial
        }
    }

    static func enter(_ request: inout UpstreamRequest, _ exchange: Exchange, _ services: any StageServices) -> TryVerdict {
        guard let settings = exchange.tryPolicy?.health else { return .proceed }
        let target = request.target
        let origin = origin(of: target)
        let answer = services.health.handle(.attempt, for: origin, settings: settings, now: MonotonicClock.milliseconds())
        exchange.summary.circuit = answer.state.rawValue
        Self.log(answer.change, probe: settings.probe != nil)
        switch answer.action {
        case .failFast(let seconds):
            SluiceMetrics.shared.recordCircuitFailedFast(origin: origin.name)
            return .failTry(.upstreamCircuitOpen(host: target.authority, retryAfter: seconds), kind: .other)
        case .allowTrial:
            exchange.circuitTry = Admitted(origin: origin, settings: settings, trial: true)
            if let fleet = services.fleet, fleet.client.isUsable {
                // One trial for the whole fleet: this try goes only if it takes the lock.
                return .wait(.fleetTrial(origin: origin.name, milliseconds: settings.cooldown))
            }
        default:
            exchange.circuitTry = Admitted(origin: origin, settings: settings, trial: false)
        }
        return .proceed
    }

    /// Reports how the exchange's current try ended to its breaker (nothing when none
    /// admitted it).
    static func reportOutcome(
        _ outcome: HealthOutcome, _ exchange: Exchange, _ health: UpstreamHealth, fleet: Fleet? = nil
    ) {
        guard let attempt = exchange.circuitTry else { return }
        exchange.circuitTry = nil
        exchange.summary.circuit = report(outcome, attempt, health, fleet: fleet).rawValue
    }

    /// Reports how a try `attempt` admitted ended to its breaker; returns the circuit's state.
    @discardableResult
    static func report(
        _ outcome: HealthOutcome, _ attempt: Admitted, _ health: UpstreamHealth, fleet: Fleet?
    ) -> CircuitBreaker.State {
        let answer = health.handle(
            .ended(outcome, trial: attempt.trial), for: attempt.origin,
            settings: attempt.settings, now: MonotonicClock.milliseconds())
        log(answer.change, probe: attempt.settings.probe != nil)
        if let change = answer.change { tellFleet(change, cooldown: attempt.settings.cooldown, fleet) }
        return answer.state
    }

    /// The breaker's key for a try to `target`: scheme, host and port.
    static func origin(of target: RequestTarget) -> UpstreamHealth.Origin {
        UpstreamHealth.Origin(scheme: target.scheme == .https ? "https" : "http", host: target.host, port: target.port)
    }

    /// Admits a try that cannot wait (`BackgroundTry`) to `target`: only while its circuit is
    /// closed (it must not take a half-open circuit's one trial); nil otherwise.
    static func admitWithoutWaiting(
        _ target: RequestTarget, _ settings: Health, _ services: any StageServices
    ) -> Admitted? {
        let origin = origin(of: target)
        guard (services.health.state(of: origin) ?? .closed) == .closed else { return nil }
        let answer = services.health.handle(.attempt, for: origin, settings: settings, now: MonotonicClock.milliseconds())
        switch answer.action {
        case .failFast, .allowTrial:
            // Changed meanwhile (another thread's outcome): a trial stays the next request's.
            return nil
        default:
            return Admitted(origin: origin, settings: settings, trial: false)
        }
    }

    /// The fleet's other instances open their circuit too when this one opens (for the same
    /// cooldown), and close it when this one's trial or probe closed it.
    static func tellFleet(_ change: UpstreamHealth.Change, cooldown: Int, _ fleet: Fleet?) {
        guard let fleet else { return }
        switch change.to {
        case .open: fleet.circuitOpened(change.origin.name, milliseconds: cooldown)
        case .closed where change.from != .closed: fleet.circuitOpened(change.origin.name, milliseconds: 0)
        default: break
        }
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
