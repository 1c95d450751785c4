import Testing

@testable import SluiceCore

/// `CircuitBreaker` (`health:`) without sockets: every transition, time by hand.
@Suite struct CircuitBreakerTests {
    typealias B = CircuitBreaker

    private func make(failures: Int = 3, cooldown: Int = 10_000, probe: Health.Probe? = nil) -> B {
        B(settings: Health(consecutiveFailures: failures, cooldown: cooldown, probe: probe))
    }

    /// Admits a try at `now` and ends it with `outcome`.
    private func tryOnce(_ b: inout B, _ outcome: HealthOutcome, now: Int) -> B.Action {
        let action = b.handle(.attempt, now: now)
        if action == .allow || action == .allowTrial {
            _ = b.handle(.ended(outcome, trial: action == .allowTrial), now: now)
        }
        return action
    }

    @Test func opensAfterNConsecutiveFailures() {
        var b = make(failures: 3)
        #expect(tryOnce(&b, .failure, now: 0) == .allow)
        #expect(tryOnce(&b, .failure, now: 1) == .allow)
        #expect(b.state == .closed && b.consecutiveFailures == 2)
        #expect(tryOnce(&b, .failure, now: 2) == .allow)
        #expect(b.state == .open && b.opens == 1 && b.openedAt == 2)
        #expect(b.handle(.attempt, now: 3) == .failFast(retryAfter: 10))
        #expect(b.failedFast == 1)
    }

    @Test func aSuccessResetsTheCount() {
        var b = make(failures: 3)
        _ = tryOnce(&b, .failure, now: 0)
        _ = tryOnce(&b, .failure, now: 0)
        _ = tryOnce(&b, .success, now: 0)
        #expect(b.consecutiveFailures == 0)
        _ = tryOnce(&b, .failure, now: 0)
        _ = tryOnce(&b, .failure, now: 0)
        #expect(b.state == .closed)
        // An abandoned try (the client left) neither counts nor resets.
        _ = tryOnce(&b, .abandoned, now: 0)
        #expect(b.consecutiveFailures == 2)
        _ = tryOnce(&b, .failure, now: 0)
        #expect(b.state == .open)
    }

    @Test func retryAfterIsTheCooldownLeftRoundedUp() {
        var b = make(failures: 1, cooldown: 10_000)
        _ = tryOnce(&b, .failure, now: 1_000)
        #expect(b.handle(.attempt, now: 1_001) == .failFast(retryAfter: 10))
        #expect(b.handle(.attempt, now: 9_500) == .failFast(retryAfter: 2))
        #expect(b.handle(.attempt, now: 10_999) == .failFast(retryAfter: 1))
    }

    @Test func halfOpenAfterTheCooldownLetsOneTrialGo() {
        var b = make(failures: 1, cooldown: 1_000)
        _ = tryOnce(&b, .failure, now: 0)
        #expect(b.handle(.attempt, now: 999) == .failFast(retryAfter: 1))
        #expect(b.handle(.attempt, now: 1_000) == .allowTrial)
        #expect(b.state == .halfOpen)
        // One trial at a time: the others fail fast while it is out.
        #expect(b.handle(.attempt, now: 1_001) == .failFast(retryAfter: 1))
        #expect(b.handle(.attempt, now: 1_500) == .failFast(retryAfter: 1))
    }

    @Test func aTrialSuccessCloses() {
        var b = make(failures: 1, cooldown: 1_000)
        _ = tryOnce(&b, .failure, now: 0)
        #expect(b.handle(.attempt, now: 1_000) == .allowTrial)
        _ = b.handle(.ended(.success, trial: true), now: 1_050)
        #expect(b.state == .closed && b.consecutiveFailures == 0)
        #expect(b.handle(.attempt, now: 1_051) == .allow)
    }

    @Test func aTrialFailureReopensForTheCooldownAgain() {
        var b = make(failures: 1, cooldown: 1_000)
        _ = tryOnce(&b, .failure, now: 0)
        #expect(b.handle(.attempt, now: 1_000) == .allowTrial)
        _ = b.handle(.ended(.failure, trial: true), now: 1_200)
        #expect(b.state == .open && b.opens == 1 && b.openedAt == 0)
        #expect(b.handle(.attempt, now: 1_300) == .failFast(retryAfter: 1))
        #expect(b.handle(.attempt, now: 2_199) == .failFast(retryAfter: 1))
        #expect(b.handle(.attempt, now: 2_200) == .allowTrial)
    }

    @Test func anAbandonedTrialFreesTheSlot() {
        var b = make(failures: 1, cooldown: 1_000)
        _ = tryOnce(&b, .failure, now: 0)
        #expect(b.handle(.attempt, now: 1_000) == .allowTrial)
        _ = b.handle(.ended(.abandoned, trial: true), now: 1_010)
        #expect(b.state == .halfOpen)
        #expect(b.handle(.attempt, now: 1_020) == .allowTrial)
    }

    @Test func aTrialThatNeverEndsFreesTheSlotAfterTheCooldown() {
        var b = make(failures: 1, cooldown: 1_000)
        _ = tryOnce(&b, .failure, now: 0)
        #expect(b.handle(.attempt, now: 1_000) == .allowTrial)
        #expect(b.handle(.attempt, now: 1_999) == .failFast(retryAfter: 1))
        #expect(b.handle(.attempt, now: 2_000) == .allowTrial)
    }

    @Test func outcomesOfTriesAdmittedBeforeItOpenedChangeNothing() {
        var b = make(failures: 2, cooldown: 1_000)
        #expect(b.handle(.attempt, now: 0) == .allow)  // still out when the circuit opens
        _ = tryOnce(&b, .failure, now: 0)
        _ = tryOnce(&b, .failure, now: 0)
        #expect(b.state == .open)
        _ = b.handle(.ended(.success, trial: false), now: 10)
        #expect(b.state == .open)
        // Nor in half-open: only the trial decides.
        #expect(b.handle(.attempt, now: 1_000) == .allowTrial)
        _ = b.handle(.ended(.success, trial: false), now: 1_001)
        _ = b.handle(.ended(.failure, trial: false), now: 1_001)
        #expect(b.state == .halfOpen)
    }

    @Test func withAProbeTheProbeIsTheTrial() {
        var b = make(failures: 1, cooldown: 1_000, probe: .init(path: "/healthz", interval: 500))
        _ = tryOnce(&b, .failure, now: 0)
        #expect(b.handle(.tick, now: 999) == .none)
        #expect(b.state == .open)
        #expect(b.handle(.tick, now: 1_000) == .startProbe)
        #expect(b.state == .halfOpen)
        // Requests never go as trials; one probe at a time.
        #expect(b.handle(.attempt, now: 1_001) == .failFast(retryAfter: 1))
        #expect(b.handle(.tick, now: 1_250) == .none)
        // A failed probe: open again for the probe's interval, then the next probe.
        _ = b.handle(.probeEnded(success: false), now: 1_300)
        #expect(b.state == .open)
        #expect(b.handle(.attempt, now: 1_301) == .failFast(retryAfter: 1))
        #expect(b.handle(.tick, now: 1_799) == .none)
        #expect(b.handle(.tick, now: 1_800) == .startProbe)
        _ = b.handle(.probeEnded(success: true), now: 1_810)
        #expect(b.state == .closed)
        #expect(b.handle(.attempt, now: 1_811) == .allow)
        #expect(b.opens == 1)
    }

    @Test func aProbeAnswerWithoutAProbeOutIsIgnored() {
        var b = make(failures: 1, cooldown: 1_000, probe: .init(path: "/healthz"))
        _ = tryOnce(&b, .failure, now: 0)
        _ = b.handle(.probeEnded(success: true), now: 10)
        #expect(b.state == .open)
        // Trial outcomes do not apply when a probe decides.
        _ = b.handle(.ended(.success, trial: true), now: 2_000)
        #expect(b.state == .halfOpen)
    }

    @Test func ticksDoNothingWithoutAProbe() {
        var b = make(failures: 1, cooldown: 1_000)
        _ = tryOnce(&b, .failure, now: 0)
        #expect(b.handle(.tick, now: 5_000) == .none)
        #expect(b.handle(.attempt, now: 5_000) == .allowTrial)
    }

    @Test func outcomesOfErrorsAndStatuses() {
        #expect(HealthOutcome(status: 200) == .success)
        #expect(HealthOutcome(status: 404) == .success)
        #expect(HealthOutcome(status: 499) == .success)
        #expect(HealthOutcome(status: 500) == .failure)
        #expect(HealthOutcome(status: 503) == .failure)
        #expect(HealthOutcome(error: .upstreamRefused(host: "h:1")) == .failure)
        #expect(HealthOutcome(error: .dnsFailure(host: "h")) == .failure)
        #expect(HealthOutcome(error: .upstreamTimeout(host: "h:1", phase: .connect)) == .failure)
        #expect(HealthOutcome(error: .upstreamTimeout(host: "h:1", phase: .noResponseHead)) == .failure)
        #expect(HealthOutcome(error: .upstreamProtocol(host: "h:1", reason: "empty reply")) == .failure)
        #expect(HealthOutcome(error: .upstreamTimeout(host: "h:1", phase: .retryDeadlinePassed)) == .abandoned)
        #expect(HealthOutcome(error: .trustFailure(host: "h", evaluator: "pinned", reason: "x")) == .abandoned)
        #expect(HealthOutcome(error: .parentProxyFailed(proxy: "p", reason: "x")) == .abandoned)
        #expect(HealthOutcome(error: .upstreamCircuitOpen(host: "h:1", retryAfter: 3)) == .abandoned)
        #expect(HealthOutcome(error: .socketUnavailable(host: "h:1", reason: "EMFILE")) == .abandoned)
    }

    @Test func theFailFastError() {
        let e = ProxyError.upstreamCircuitOpen(host: "api.example:443", retryAfter: 7)
        #expect(e.status == 503 && !e.closesConnection && e.retryAfterSeconds == 7)
        #expect(e.message == "upstream api.example:443 is failing: its circuit is open (health); retry in 7 s")
    }
}

/// `UpstreamHealth`: one breaker per origin, shared; reload keeps unchanged state.
@Suite struct UpstreamHealthTests {
    let a = UpstreamHealth.Origin(scheme: "http", host: "A.example", port: 80)
    let b = UpstreamHealth.Origin(scheme: "https", host: "a.example", port: 443)
    let settings = Health(consecutiveFailures: 1, cooldown: 1_000)

    @Test func perOriginState() {
        let health = UpstreamHealth()
        #expect(a.name == "http://a.example:80")
        #expect(UpstreamHealth.Origin(scheme: "http", host: "::1", port: 8080).name == "http://[::1]:8080")
        _ = health.handle(.attempt, for: a, settings: settings, now: 0)
        let opened = health.handle(.ended(.failure, trial: false), for: a, settings: settings, now: 0)
        #expect(opened.state == .open && opened.change == .init(origin: a, from: .closed, to: .open, consecutiveFailures: 1))
        #expect(health.handle(.attempt, for: a, settings: settings, now: 1).action == .failFast(retryAfter: 1))
        // Same host, other scheme and port: its own breaker.
        #expect(health.handle(.attempt, for: b, settings: settings, now: 1).action == .allow)
        #expect(health.statuses().map(\.origin.name) == ["http://a.example:80", "https://a.example:443"])
    }

    @Test func aCircuitOpenedElsewhereOpensAtTheOriginsNextTry() {
        let health = UpstreamHealth()
        // Never tried here: kept until the first try, which fails fast for the rest of it.
        health.openedElsewhere(a.name, milliseconds: 5_000, now: 0)
        let first = health.handle(.attempt, for: a, settings: settings, now: 1_000)
        #expect(first.action == .failFast(retryAfter: 4) && first.state == .open)
        #expect(first.change == nil, "not this instance's change (the subscriber logs it)")
        #expect(health.handle(.attempt, for: b, settings: settings, now: 1_000).action == .allow, "other origins go")
        // After it, one trial as usual.
        #expect(health.handle(.attempt, for: a, settings: settings, now: 5_000).action == .allowTrial)
        // News that ended before the next try leaves the circuit half-open: its trial next.
        health.openedElsewhere(b.name, milliseconds: 100, now: 2_000)
        #expect(health.handle(.attempt, for: b, settings: settings, now: 3_000).action == .allowTrial)
        // News of a closing closes it.
        health.closedElsewhere(b.name)
        #expect(health.handle(.attempt, for: b, settings: settings, now: 3_001).action == .allow)
        // A circuit open here keeps the later end.
        var breaker = CircuitBreaker(settings: settings)
        _ = breaker.handle(.openedElsewhere(milliseconds: 3_000), now: 0)
        _ = breaker.handle(.openedElsewhere(milliseconds: 1_000), now: 0)
        #expect(breaker.handle(.attempt, now: 2_000) == .failFast(retryAfter: 1) && breaker.state == .open)
    }

    @Test func changedSettingsStartClosedAndUnchangedOnesKeepTheirState() {
        let health = UpstreamHealth()
        _ = health.handle(.attempt, for: a, settings: settings, now: 0)
        _ = health.handle(.ended(.failure, trial: false), for: a, settings: settings, now: 0)
        _ = health.handle(.attempt, for: b, settings: settings, now: 0)
        _ = health.handle(.ended(.failure, trial: false), for: b, settings: settings, now: 0)
        let changed = Health(consecutiveFailures: 2, cooldown: 1_000)
        health.reconcile { $0 == a ? settings : $0 == b ? changed : nil }
        #expect(health.statuses().map(\.origin) == [a])
        #expect(health.handle(.attempt, for: a, settings: settings, now: 1).state == .open)
        // A try admitted under the old settings that ends after the reload changes nothing.
        #expect(health.handle(.ended(.success, trial: false), for: a, settings: changed, now: 2).state == .open)
        #expect(health.handle(.ended(.failure, trial: false), for: b, settings: changed, now: 2).change == nil)
        #expect(health.statuses().map(\.origin) == [a])
        // A new try under other settings than the breaker's (a reload raced it) starts afresh.
        #expect(health.handle(.attempt, for: a, settings: changed, now: 2).action == .allow)
        #expect(health.statuses().first?.breaker.settings == changed)
    }

    @Test func aFullTableForgetsTheLeastRecentlyUsedEvenWhenOpen() {
        let health = UpstreamHealth()
        func origin(_ i: Int) -> UpstreamHealth.Origin { .init(scheme: "http", host: "h\(i).example", port: 80) }
        // Every origin fails once and opens (the DNS failures of endless made-up names).
        for i in 0..<UpstreamHealth.maxOrigins {
            _ = health.handle(.attempt, for: origin(i), settings: settings, now: i)
            _ = health.handle(.ended(.failure, trial: false), for: origin(i), settings: settings, now: i)
        }
        // Origin 0 is used again, so it is the most recently used.
        _ = health.handle(.attempt, for: origin(0), settings: settings, now: 20_000)
        #expect(health.statuses().count == UpstreamHealth.maxOrigins)
        _ = health.handle(.attempt, for: origin(-1), settings: settings, now: 20_001)
        let kept = Set(health.statuses().map(\.origin))
        #expect(kept.count == UpstreamHealth.maxOrigins * 9 / 10 + 1)
        #expect(kept.contains(origin(0)) && kept.contains(origin(-1)))
        #expect(!kept.contains(origin(1)) && kept.contains(origin(UpstreamHealth.maxOrigins - 1)))
    }

    @Test func probesAreDueOncePerHalfOpenCircuit() {
        let health = UpstreamHealth()
        let probing = Health(consecutiveFailures: 1, cooldown: 1_000, probe: .init(path: "/h", interval: 500))
        _ = health.handle(.attempt, for: a, settings: probing, now: 0)
        _ = health.handle(.ended(.failure, trial: false), for: a, settings: probing, now: 0)
        #expect(health.probesDue(now: 500).isEmpty)
        let due = health.probesDue(now: 1_000)
        #expect(due.map(\.origin) == [a] && due.first?.change?.to == .halfOpen)
        #expect(health.probesDue(now: 1_100).isEmpty)
        _ = health.handle(.probeEnded(success: true), for: a, settings: probing, now: 1_200)
        #expect(health.statuses().first?.breaker.state == .closed)
    }
}
