import CLibEvent
import SluiceCore

#if canImport(Glibc)
    import Glibc
#endif

/// A try held before it goes (docs/configuration.md, "Rate limits" and "Upstream health"): for
/// its turn under its policy's `rate_limit` — on the worker's timer, in the `max_concurrent`
/// line, or while the fleet's Redis decides (`QuotaStage`) — or for the fleet's trial lock of
/// a half-open circuit (`CircuitStage`). It keeps the try, the timer and the ticket, asks the
/// stage again when the wait ends, and hands the try back to its holder when it may go (the
/// try stages resume after the one that held it), or the stage's answer when it may not.
///
/// Threading: the worker's thread. Held by its holder (a driver's phase `.holding`, a shared
/// fill's producer), and by the worker's tables (`quotaWaiters`, `fleetWaiters`) while a
/// ticket is out; `leave` takes it out of both.
final class TryHold {
    // The holder owns this hold; the worker outlives both.
    unowned(unsafe) let holder: any TryHolder
    unowned(unsafe) let worker: Worker
    let exchange: Exchange
    let request: UpstreamRequest
    let kind: TryWait
    private var timer: LoopTimer<TryHold>?
    /// The ticket of the fleet's answer this hold waits for (0: none).
    private var fleetTicket: UInt64 = 0

    init(_ kind: TryWait, request: UpstreamRequest, exchange: Exchange, holder: any TryHolder, worker: Worker) {
        self.kind = kind
        self.request = request
        self.exchange = exchange
        self.holder = holder
        self.worker = worker
    }

    var quotaWait: QuotaWait? {
        if case .quota(let wait) = kind { return wait }
        return nil
    }

    /// Starts the wait. The holder holds this hold already.
    func start() {
        switch kind {
        case .fleetTrial(let origin, let milliseconds): startTrialLock(origin, milliseconds: milliseconds)
        case .quota(let wait): startQuota(wait)
        }
    }

    /// A half-open circuit's trial asks the fleet for its trial lock (at most `fleet.timeout`).
    private func startTrialLock(_ origin: String, milliseconds: Int) {
        guard let fleet = worker.fleet else { return holder.holdReleased(self, request, from: RequestChain.afterCircuit) }
        let ticket = takeFleetTicket()
        let worker = worker
        fleet.lockTrial(origin, milliseconds: milliseconds) { [unowned(unsafe) worker] acquired in
            worker.fleetWaiters.removeValue(forKey: ticket)?.trialLockAnswered(acquired)
        }
    }

    private func takeFleetTicket() -> UInt64 {
        worker.nextFleetTicket &+= 1
        let ticket = worker.nextFleetTicket
        // The worker holds the waiting hold (not a weak reference: that would put a side table
        // on it); leaving takes it out.
        worker.fleetWaiters[ticket] = self
        fleetTicket = ticket
        return ticket
    }

    /// The fleet's answer on the trial lock: this instance sends the trial (or Redis could not
    /// tell: it does, as alone), or another instance does and this try fails fast.
    private func trialLockAnswered(_ acquired: Bool?) {
        fleetTicket = 0
        guard isCurrent else { return }
        if acquired == false {
            ResponseChain.runEnd(.abandoned, exchange, worker)
            SluiceMetrics.shared.recordCircuitFailedFast(origin: request.target.authority)
            return holder.holdEnded(
                self, .failTry(.upstreamCircuitOpen(host: request.target.authority, retryAfter: 1), kind: .other))
        }
        holder.holdReleased(self, request, from: RequestChain.afterCircuit)
    }

    /// Whether this hold is still its holder's wait.
    private var isCurrent: Bool { holder.isHolding(self) }

    // MARK: rate limits

    private func startQuota(_ wait: QuotaWait) {
        let ms: Int
        switch wait.kind {
        case .timer(let delay, _):
            ms = delay
        case .slot(let ticket):
            worker.quotaWaiters[ticket] = self
            ms = Int(max(0, wait.deadline - MonotonicClock.microseconds()) / 1000)
        case .fleet:
            guard let fleet = worker.fleet else { return holder.holdReleased(self, request, from: RequestChain.afterQuota) }
            let maxWait = max(0, wait.deadline - MonotonicClock.microseconds())
            let ticket = takeFleetTicket()
            let worker = worker
            fleet.acquire(policy: wait.policy, limits: wait.settings.limits, key: wait.key, maxWait: maxWait) {
                [unowned(unsafe) worker] answer in
                worker.fleetWaiters.removeValue(forKey: ticket)?.fleetAnswered(wait, answer)
            }
            return
        }
        let timer = LoopTimer(on: worker.base, owner: self) { $0.timerFired() }
        self.timer = timer
        timer.arm(milliseconds: ms)
    }

    private func stopTimer() {
        timer?.stop()
        timer = nil
    }

    /// The timer: the try's turn came, or its wait for a `max_concurrent` place ran out.
    private func timerFired() {
        guard let wait = quotaWait, isCurrent else { return }
        switch wait.kind {
        case .fleet:
            return
        case .timer:
            stopTimer()
            let now = MonotonicClock.microseconds()
            // The origin may have asked for a pause while this try waited: it waits for that
            // too, keeping the place it has (a timer that fires a little early is not a pause).
            let table = worker.rateLimits
            let held = wait.settings.learn ? table.holdRemaining(policy: wait.policy, key: wait.key, now: now) : 0
            if held > 5_000 {
                let reason = table.holdReason(policy: wait.policy, key: wait.key) ?? wait.limit
                guard now + held <= wait.deadline else {
                    table.noteWaiting(policy: wait.policy, -1)
                    let seconds = max(1, Int((held + 999_999) / 1_000_000))
                    let error = ProxyError.originRateLimited(
                        policy: wait.policy, host: exchange.target.authority, retryAfter: seconds)
                    return holder.holdEnded(self, QuotaStage.refuse(error, reason, exchange, worker))
                }
                let again = QuotaWait(
                    .timer(milliseconds: Int((held + 999) / 1000), reservation: nil), wait.limiting, key: wait.key,
                    limit: reason, since: wait.since, deadline: wait.deadline)
                return holder.holdEnded(self, .wait(.quota(again)))
            }
            QuotaStage.waited(wait, now: now, exchange, worker)
            guard wait.scheduleAfter else { return holder.holdReleased(self, request, from: RequestChain.afterQuota) }
            goOn(QuotaStage.schedule(wait.limiting, key: wait.key, now: now, deadline: wait.deadline, exchange, worker))
        case .slot(let ticket):
            if worker.rateLimits.leaveSlot(policy: wait.policy, key: wait.key, ticket: ticket) {
                worker.quotaWaiters[ticket] = nil
                stopTimer()
                worker.rateLimits.noteWaiting(policy: wait.policy, -1)
                let limit = wait.settings.maxConcurrent ?? 0
                holder.holdEnded(
                    self, QuotaStage.refuse(.concurrencyLimited(policy: wait.policy, limit: limit), wait.limit, exchange, worker))
            } else {
                // A place was given to it meanwhile: it holds it now (the wake is ignored).
                slotGranted(ticket)
            }
        }
    }

    /// A `max_concurrent` place was given to the try waiting as `ticket` (in a loop pass of
    /// the worker's own): it holds it, and goes on to the schedule of the rates.
    func slotGranted(_ ticket: UInt64) {
        worker.quotaWaiters[ticket] = nil
        guard let wait = quotaWait, case .slot(ticket) = wait.kind, isCurrent else { return }
        stopTimer()
        holder.quotaSlot = QuotaSlot(policy: wait.policy, key: wait.key, limit: wait.settings.maxConcurrent ?? 1)
        let now = MonotonicClock.microseconds()
        QuotaStage.waited(wait, now: now, exchange, worker)
        goOn(QuotaStage.schedule(wait.limiting, key: wait.key, now: now, deadline: wait.deadline, exchange, worker))
    }

    /// The fleet's Redis decided for the try (or did not answer in time: `fleet.on_redis_down`
    /// decides then). A try that left meanwhile is not told.
    private func fleetAnswered(_ wait: QuotaWait, _ answer: FleetAnswer) {
        fleetTicket = 0
        guard isCurrent else { return }
        let now = MonotonicClock.microseconds()
        let table = worker.rateLimits
        switch answer {
        case .go(let delay, _) where delay < 1000:
            table.count(policy: wait.policy, .allowed)
            if !exchange.summary.hasRateLimitRecord { exchange.summary.rateLimit = .allowed }
            holder.holdReleased(self, request, from: RequestChain.afterQuota)
        case .go(let delay, _):
            table.noteWaiting(policy: wait.policy, 1)
            let limit = wait.settings.limits.map(\.description).joined(separator: " and ") + " (fleet)"
            holder.holdEnded(
                self,
                .wait(
                    .quota(
                        QuotaWait(
                            .timer(milliseconds: Int((delay + 999) / 1000), reservation: nil), wait.limiting, key: wait.key,
                            limit: table.holdReason(policy: wait.policy, key: wait.key) ?? limit, since: now,
                            deadline: wait.deadline))))
        case .refuse(let retryAfter, let limit):
            // Later tries of the key are refused here until they could go.
            let maxWait = wait.deadline - wait.since
            if retryAfter > maxWait {
                table.rememberFleetDenial(
                    policy: wait.policy, key: wait.key, until: now + retryAfter - maxWait, limit: limit, now: now)
            }
            holder.holdEnded(
                self, QuotaStage.refused(wait.limiting, key: wait.key, retryAfter: retryAfter, limit: limit, exchange, worker))
        case .unavailable:
            guard let fleet = worker.fleet else { return }
            goOn(QuotaStage.fallback(wait.limiting, fleet, key: wait.key, now: now, deadline: wait.deadline, exchange, worker))
        }
    }

    /// Performs the schedule's answer for a try that had waited.
    private func goOn(_ verdict: TryVerdict) {
        switch verdict {
        case .proceed: holder.holdReleased(self, request, from: RequestChain.afterQuota)
        default: holder.holdEnded(self, verdict)
        }
    }

    /// The try leaves while it waits (the client went, the operator cancelled it): its timer
    /// goes, its place in the schedule is given back, and a `max_concurrent` place it was given
    /// meanwhile is released. A fleet answer that comes later finds it gone.
    func leave() {
        stopTimer()
        if fleetTicket != 0 {
            worker.fleetWaiters[fleetTicket] = nil
            fleetTicket = 0
        }
        guard let wait = quotaWait else { return }
        let table = worker.rateLimits
        switch wait.kind {
        case .fleet:
            // A place the fleet gives it stays taken.
            table.count(policy: wait.policy, .left)
            return
        case .timer(_, let reservation):
            table.cancel(policy: wait.policy, wait.settings, reservation)
        case .slot(let ticket):
            worker.quotaWaiters[ticket] = nil
            if !table.leaveSlot(policy: wait.policy, key: wait.key, ticket: ticket) {
                table.releaseSlot(policy: wait.policy, key: wait.key, limit: wait.settings.maxConcurrent ?? 1)
            }
        }
        table.noteWaiting(policy: wait.policy, -1)
        table.count(policy: wait.policy, .left)
    }
}

/// What holds a try while it waits (`TryHold`) and takes it back: the exchange's driver, or a
/// shared fill's producer (`FillProducer`) for the resumes it sends.
///
/// Threading: the worker's thread.
protocol TryHolder: ExchangeOwner {
    /// Whether `hold` is still this holder's wait (a hold that was left is not told).
    func isHolding(_ hold: TryHold) -> Bool
    /// The held try may go: the try stages resume at `index`.
    func holdReleased(_ hold: TryHold, _ request: UpstreamRequest, from index: Int)
    /// The held try may not go, or waits again: `verdict` is the stage's answer.
    func holdEnded(_ hold: TryHold, _ verdict: TryVerdict)
}
