/// One origin's circuit breaker (`health:`), as a value type: events in, actions out, the
/// clock passed in with every event (monotonic milliseconds), no I/O.
///
/// ```
///            N consecutive failures                   cooldown passed
///  closed ─────────────────────────────► open ──────────────────────────────► half_open
///    ▲  success: count back to 0        │  requests fail fast (503,          │ no probe: one request
///    │                                  │  Retry-After = cooldown left)      │ goes as the trial, the
///    │                                  ▲                                    │ others fail fast;
///    │                                  │ trial or probe failed:             │ probe: the probe is the
///    │                                  └── open again (a failed trial for   │ trial, requests fail fast
///    │                                      `cooldown`, a failed probe for   │
///    │                                      the probe's `interval`)          │
///    └───────────────── trial or probe succeeded ────────────────────────────┘
/// ```
///
/// A failure is a connect-side transport failure or a `5xx` head (`HealthOutcome`); anything
/// else that reached the origin is a success. Only the outcomes of tries the breaker admitted
/// while closed, and of the trial, count: a try admitted before the circuit opened that ends
/// while it is open changes nothing. At most one trial (or probe) is out at a time; a trial
/// that has not ended after `cooldown` (its client went away unnoticed) frees the slot.
///
/// Threading: a plain value; `UpstreamHealth` keeps one per origin behind its lock.
public struct CircuitBreaker: Sendable, Equatable {
    public enum State: String, Sendable, CaseIterable {
        case closed, open
        case halfOpen = "half_open"

        /// The `sluice_upstream_circuit_state` gauge's value.
        public var gauge: Int {
            switch self {
            case .closed: return 0
            case .open: return 1
            case .halfOpen: return 2
            }
        }
    }

    public enum Event: Sendable, Equatable {
        /// A try is about to start.
        case attempt
        /// A try admitted with `.allow` (`trial: false`) or `.allowTrial` (`trial: true`) ended:
        /// it succeeded, failed, or ended without telling anything (`.abandoned`).
        case ended(HealthOutcome, trial: Bool)
        /// Time passed (the probe timer): may answer `.startProbe`.
        case tick
        /// The probe `.startProbe` asked for answered (true: it succeeded).
        case probeEnded(success: Bool)
        /// Another instance of the fleet opened its circuit to this origin for `milliseconds`
        /// (`fleet:`): this one opens too, until then (a circuit already open keeps the later
        /// end).
        case openedElsewhere(milliseconds: Int)
        /// Another instance's trial (or probe) found the origin well and closed its circuit:
        /// this one closes too.
        case closedElsewhere
    }

    public enum Action: Sendable, Equatable {
        /// Nothing to do (an outcome recorded, a tick with no probe due).
        case none
        /// The try may go.
        case allow
        /// The try goes as the half-open circuit's one trial: report its end with `trial: true`.
        case allowTrial
        /// Answer `503` without trying (`ProxyError.upstreamCircuitOpen`); the client may try
        /// again after `retryAfter` seconds.
        case failFast(retryAfter: Int)
        /// Send one probe (`GET probe.path`) and report `.probeEnded`.
        case startProbe
    }

    public let settings: Health
    public private(set) var state: State = .closed
    /// Failures in a row while closed.
    public private(set) var consecutiveFailures = 0
    /// When the circuit last opened from closed (monotonic ms; nil: never); a failed trial or
    /// probe keeps it.
    public private(set) var openedAt: Int?
    /// How many times the circuit opened from closed.
    public private(set) var opens = 0
    /// Requests answered with `503` without a try.
    public private(set) var failedFast = 0
    /// Open: when it turns half-open (monotonic ms).
    private var openUntil = 0
    /// Half-open: when the trial or the probe out now started (nil: none out).
    private var trialSince: Int?
    /// When the breaker last handled an event other than `.tick` (monotonic ms): how the
    /// registry picks the origins to forget when it is full.
    public private(set) var lastUsed = 0

    public init(settings: Health) { self.settings = settings }

    public mutating func handle(_ event: Event, now: Int) -> Action {
        if case .tick = event {} else { lastUsed = now }
        if state == .open, now >= openUntil {
            state = .halfOpen
            trialSince = nil
        }
        switch event {
        case .attempt:
            return attempt(now: now)
        case .ended(let outcome, let trial):
            ended(outcome, trial: trial, now: now)
            return .none
        case .tick:
            guard settings.probe != nil, state == .halfOpen, trialSince == nil else { return .none }
            trialSince = now
            return .startProbe
        case .closedElsewhere:
            if state != .closed { close() }
            return .none
        case .openedElsewhere(let milliseconds):
            // An opening that has ended already leaves the circuit half-open (its trial next).
            if state != .open || now + milliseconds > openUntil {
                state = .open
                openUntil = max(openUntil, now + milliseconds)
                trialSince = nil
            }
            return .none
        case .probeEnded(let success):
            guard let probe = settings.probe, state == .halfOpen, trialSince != nil else { return .none }
            if success {
                close()
            } else {
                open(now: now, for: probe.interval)
            }
            return .none
        }
    }

    private mutating func attempt(now: Int) -> Action {
        switch state {
        case .closed:
            return .allow
        case .open:
            failedFast += 1
            return .failFast(retryAfter: Self.seconds(openUntil - now))
        case .halfOpen:
            if settings.probe == nil, trialSince.map({ now - $0 >= settings.cooldown }) ?? true {
                trialSince = now
                return .allowTrial
            }
            failedFast += 1
            return .failFast(retryAfter: 1)
        }
    }

    private mutating func ended(_ outcome: HealthOutcome, trial: Bool, now: Int) {
        if trial {
            guard state == .halfOpen, settings.probe == nil, trialSince != nil else { return }
            switch outcome {
            case .success: close()
            case .failure: open(now: now, for: settings.cooldown)
            case .abandoned: trialSince = nil
            }
            return
        }
        guard state == .closed else { return }
        switch outcome {
        case .success:
            consecutiveFailures = 0
        case .failure:
            consecutiveFailures += 1
            if consecutiveFailures >= settings.consecutiveFailures { open(now: now, for: settings.cooldown) }
        case .abandoned:
            break
        }
    }

    private mutating func open(now: Int, for milliseconds: Int) {
        if state == .closed {
            opens += 1
            openedAt = now
        }
        state = .open
        openUntil = now + milliseconds
        trialSince = nil
    }

    private mutating func close() {
        state = .closed
        consecutiveFailures = 0
        trialSince = nil
    }

    /// Milliseconds as whole seconds for `Retry-After`, rounded up, at least 1.
    static func seconds(_ milliseconds: Int) -> Int { max(1, (milliseconds + 999) / 1000) }
}
