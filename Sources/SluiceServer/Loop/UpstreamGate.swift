import CLibEvent
import SluiceCore

#if canImport(Glibc)
    import Glibc
#endif

/// A worker's side of its `UpstreamAdmission` (`limits.max_in_flight_upstream`,
/// `limits.upstream_queue`, `timeouts.upstream_queue`): asks it whether a forwarded request
/// may go upstream, and performs what it answers — starts a waiting connection's request when
/// a slot frees, answers `503` with `Retry-After` when the queue is full or the wait ran out,
/// and keeps the one timer for the earliest wait. Requests that were waiting start (or are
/// refused) in a loop pass of their own, never inside the callback that freed the slot
/// (which may be libcurl's).
///
/// Threading: one per worker, touched only on that worker's thread. Its timer and wake hold
/// it unretained: the worker keeps it and drops both (`close()`) before it frees its loop.
final class UpstreamGate {
    enum Answer {
        /// Go upstream now; the connection holds a slot until it calls `release()`.
        case go
        /// Wait: `UpstreamSlotWaiter.upstreamSlotGranted` or `upstreamSlotRefused` follows,
        /// unless the connection leaves first (`leave`).
        case wait(UInt64)
        case refuse(ProxyError)
    }

    private var admission: UpstreamAdmission
    private let base: OpaquePointer
    private let workerIndex: Int
    private var timer: LoopTimer<UpstreamGate>!
    private var runEvent: LoopWake<UpstreamGate>!
    private var nextTicket: UInt64 = 0
    /// Connections waiting, by ticket.
    private var waiting: [UInt64: any UpstreamSlotWaiter] = [:]
    /// Decisions for waiting connections, performed in the next loop pass.
    private var decided: [(any UpstreamSlotWaiter, UInt64, ProxyError?)] = []
    /// Requests refused in the current episode (0: none going on), for one log line each way.
    private var refusedInEpisode = 0

    init(base: OpaquePointer, workerIndex: Int, limits: ServerConfiguration.Limits, timeouts: ServerConfiguration.Timeouts) {
        self.base = base
        self.workerIndex = workerIndex
        admission = UpstreamAdmission(Self.settings(limits, timeouts))
        timer = LoopTimer(on: base, owner: self) { gate in
            gate.perform(gate.admission.handle(.timer, now: MonotonicClock.milliseconds()))
        }
        runEvent = LoopWake(on: base, owner: self) { $0.runDecided() }
    }

    static func settings(
        _ limits: ServerConfiguration.Limits, _ timeouts: ServerConfiguration.Timeouts
    ) -> UpstreamAdmission.Settings {
        .init(maxInFlight: limits.maxInFlightUpstream, queueSize: limits.upstreamQueue, queueTimeout: timeouts.upstreamQueue)
    }

    /// Requests upstream now and waiting now (for the admin API and tests).
    var inFlight: Int { admission.inFlight }
    var queued: Int { admission.queued }

    /// A reload: new limits apply to the requests that arrive from now on; raised limits
    /// start waiting requests at once.
    func reconfigure(_ limits: ServerConfiguration.Limits, _ timeouts: ServerConfiguration.Timeouts) {
        let new = Self.settings(limits, timeouts)
        guard new != admission.settings else { return }
        perform(admission.handle(.reconfigure(new), now: MonotonicClock.milliseconds()))
    }

    /// May `connection`'s request go upstream?
    func admit(_ connection: any UpstreamSlotWaiter) -> Answer {
        nextTicket += 1
        let ticket = nextTicket
        // The common case without a clock read or an `Actions` to make and destroy.
        if admission.admitAtOnce() {
            endEpisode()
            return .go
        }
        let actions = admission.handle(.arrive(ticket), now: MonotonicClock.milliseconds())
        let answer: Answer
        if actions.admitted || actions.start.contains(ticket) {
            endEpisode()
            answer = .go
        } else if let refused = actions.refuse.first(where: { $0.ticket == ticket }) {
            answer = .refuse(refusal(refused.reason))
        } else {
            waiting[ticket] = connection
            SluiceMetrics.shared.recordQueued()
            answer = .wait(ticket)
        }
        perform(actions, except: ticket)
        return answer
    }

    /// The request that held a slot has ended.
    func release() {
        if admission.releaseAtOnce() { return }
        perform(admission.handle(.release, now: MonotonicClock.milliseconds()))
    }

    /// A waiting connection closed (or was cancelled).
    func leave(_ ticket: UInt64) {
        guard waiting.removeValue(forKey: ticket) != nil else { return }
        perform(admission.handle(.leave(ticket), now: MonotonicClock.milliseconds()))
    }

    private func refusal(_ reason: UpstreamAdmission.Refusal) -> ProxyError {
        let settings = admission.settings
        switch reason {
        case .queueFull:
            SluiceMetrics.shared.recordRefusal(.queueFull)
            startEpisode("the upstream queue is full")
            return .upstreamQueueFull(limit: settings.queueSize)
        case .queueTimeout:
            SluiceMetrics.shared.recordRefusal(.queueTimeout)
            startEpisode("requests waited \(settings.queueTimeout) ms for an upstream slot")
            return .upstreamQueueTimeout(milliseconds: settings.queueTimeout)
        }
    }

    private func startEpisode(_ why: String) {
        refusedInEpisode += 1
        guard refusedInEpisode == 1 else { return }
        let max = admission.settings.maxInFlight.map(String.init) ?? "unlimited"
        Log.warning(
            "worker \(workerIndex): refusing requests with 503: \(why) (limits.max_in_flight_upstream \(max), limits.upstream_queue \(admission.settings.queueSize))"
        )
    }

    private func endEpisode() {
        guard refusedInEpisode > 0 else { return }
        Log.info("worker \(workerIndex): requests go upstream without waiting again (\(refusedInEpisode) refused with 503)")
        refusedInEpisode = 0
    }

    private func perform(_ actions: UpstreamAdmission.Actions, except own: UInt64? = nil) {
        for ticket in actions.start where ticket != own {
            if let connection = waiting.removeValue(forKey: ticket) {
                decided.append((connection, ticket, nil))
            } else {
                release()
            }
        }
        for refused in actions.refuse where refused.ticket != own {
            let error = refusal(refused.reason)
            if let connection = waiting.removeValue(forKey: refused.ticket) {
                decided.append((connection, refused.ticket, error))
            }
        }
        if !decided.isEmpty { runEvent.activate() }
        switch actions.timer {
        case .keep: break
        case .cancel: timer.stop()
        case .arm(let at): timer.arm(milliseconds: max(0, at - MonotonicClock.milliseconds()))
        }
    }

    private func runDecided() {
        let batch = decided
        decided.removeAll()
        for (connection, ticket, error) in batch {
            if let error {
                connection.upstreamSlotRefused(ticket, error)
            } else if !connection.upstreamSlotGranted(ticket) {
                release()  // it left between the decision and now: the slot goes to the next one
            }
        }
    }

    /// Drops the events (the worker's loop has ended).
    func close() {
        timer = nil
        runEvent = nil
        waiting.removeAll()
        decided.removeAll()
    }
}
