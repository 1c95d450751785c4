import Testing

@testable import SluiceCore

/// `UpstreamAdmission` (`limits.max_in_flight_upstream`, `limits.upstream_queue`,
/// `timeouts.upstream_queue`) without sockets: events in, actions out, time by hand.
@Suite struct UpstreamAdmissionTests {
    typealias A = UpstreamAdmission

    private func make(max: Int? = 1, queue: Int = 2, timeout: Int = 1000) -> A {
        A(.init(maxInFlight: max, queueSize: queue, queueTimeout: timeout))
    }

    @Test func startsAtOnceWhileSlotsAreFree() {
        var a = make(max: 2)
        #expect(a.handle(.arrive(1), now: 0) == A.Actions(admitted: true))
        #expect(a.handle(.arrive(2), now: 0).admitted)
        #expect(a.inFlight == 2)
        // The fast path touches no timer and allocates no refusal.
        let third = a.handle(.arrive(3), now: 0)
        #expect(!third.admitted && third.start.isEmpty && third.queued && third.timer == .arm(at: 1000))
    }

    @Test func theFastPathsAnswerOnlyWhenNothingWaits() {
        var a = make(max: 1)
        #expect(a.admitAtOnce() && a.inFlight == 1)
        // The slot is taken: not at once; `handle` queues the next.
        #expect(!a.admitAtOnce() && a.inFlight == 1)
        #expect(a.handle(.arrive(2), now: 0).queued)
        // Someone waits: a release must go through `handle`, which starts it.
        #expect(!a.releaseAtOnce() && a.inFlight == 1)
        #expect(a.handle(.release, now: 10).start == [2])
        #expect(a.inFlight == 1 && a.queued == 0)
        #expect(a.releaseAtOnce() && a.inFlight == 0)
        #expect(a.releaseAtOnce() && a.inFlight == 0)  // never below zero
    }

    @Test func unlimitedNeverQueues() {
        var a = make(max: nil, queue: 0)
        for t in 1...10_000 as ClosedRange<UInt64> {
            let actions = a.handle(.arrive(t), now: 0)
            #expect(actions == A.Actions(admitted: true))
        }
        #expect(a.inFlight == 10_000 && a.queued == 0)
    }

    @Test func releaseStartsTheOldestWaitingRequest() {
        var a = make(max: 1, queue: 3)
        _ = a.handle(.arrive(1), now: 0)
        #expect(a.handle(.arrive(2), now: 10).queued)
        #expect(a.handle(.arrive(3), now: 20).queued)
        let released = a.handle(.release, now: 30)
        #expect(released.start == [2])
        // The timer now follows the next waiting request (3, deadline 1020).
        #expect(released.timer == .arm(at: 1020))
        #expect(a.inFlight == 1 && a.queued == 1)
        let again = a.handle(.release, now: 40)
        #expect(again.start == [3] && again.timer == .cancel)
        #expect(a.handle(.release, now: 50) == A.Actions())
        #expect(a.inFlight == 0)
    }

    @Test func fullQueueRefusesAtOnce() {
        var a = make(max: 1, queue: 1)
        _ = a.handle(.arrive(1), now: 0)
        #expect(a.handle(.arrive(2), now: 0).queued)
        let full = a.handle(.arrive(3), now: 0)
        #expect(full.refuse == [A.Refused(ticket: 3, reason: .queueFull)])
        #expect(!full.queued && full.start.isEmpty && full.timer == .keep)
        #expect(a.queued == 1)
    }

    @Test func zeroQueueRefusesWhenEverySlotIsTaken() {
        var a = make(max: 1, queue: 0)
        _ = a.handle(.arrive(1), now: 0)
        #expect(a.handle(.arrive(2), now: 0).refuse == [A.Refused(ticket: 2, reason: .queueFull)])
        _ = a.handle(.release, now: 1)
        #expect(a.handle(.arrive(3), now: 1).admitted)
    }

    @Test func timerRefusesRequestsThatWaitedTooLong() {
        var a = make(max: 1, queue: 5, timeout: 100)
        _ = a.handle(.arrive(1), now: 0)
        #expect(a.handle(.arrive(2), now: 0).timer == .arm(at: 100))
        #expect(a.handle(.arrive(3), now: 50).timer == .keep)  // later deadline: the timer stays
        let fired = a.handle(.timer, now: 100)
        #expect(fired.refuse == [A.Refused(ticket: 2, reason: .queueTimeout)])
        #expect(fired.timer == .arm(at: 150))
        let second = a.handle(.timer, now: 150)
        // The timer has fired and nothing waits: there is nothing to arm or cancel.
        #expect(second.refuse == [A.Refused(ticket: 3, reason: .queueTimeout)] && second.timer == .keep)
        #expect(a.queued == 0 && a.inFlight == 1)
    }

    @Test func anExpiredRequestIsRefusedRatherThanStartedWhenASlotFrees() {
        // The slot frees in the same loop pass as the deadline, before the timer ran.
        var a = make(max: 1, queue: 5, timeout: 100)
        _ = a.handle(.arrive(1), now: 0)
        _ = a.handle(.arrive(2), now: 0)
        _ = a.handle(.arrive(3), now: 60)
        let released = a.handle(.release, now: 120)
        #expect(released.refuse == [A.Refused(ticket: 2, reason: .queueTimeout)])
        #expect(released.start == [3])
        #expect(released.timer == .cancel)
    }

    @Test func aClientThatLeavesLeavesTheQueue() {
        var a = make(max: 1, queue: 2, timeout: 100)
        _ = a.handle(.arrive(1), now: 0)
        _ = a.handle(.arrive(2), now: 0)
        _ = a.handle(.arrive(3), now: 10)
        let left = a.handle(.leave(2), now: 20)
        #expect(left.timer == .arm(at: 110) && left.start.isEmpty && left.refuse.isEmpty)
        #expect(a.queued == 1)
        // Its place is free again.
        #expect(a.handle(.arrive(4), now: 30).queued)
        #expect(a.handle(.release, now: 40).start == [3])
        #expect(a.handle(.leave(4), now: 41).timer == .cancel)
        #expect(a.handle(.leave(99), now: 42) == A.Actions())  // unknown tickets change nothing
        #expect(a.queued == 0 && a.inFlight == 1)
    }

    @Test func raisingTheLimitStartsWaitingRequests() {
        var a = make(max: 1, queue: 5)
        _ = a.handle(.arrive(1), now: 0)
        _ = a.handle(.arrive(2), now: 0)
        _ = a.handle(.arrive(3), now: 0)
        let raised = a.handle(.reconfigure(.init(maxInFlight: 3, queueSize: 5, queueTimeout: 1000)), now: 5)
        #expect(raised.start == [2, 3] && raised.timer == .cancel)
        #expect(a.inFlight == 3)
        let unlimited = a.handle(.reconfigure(.init(maxInFlight: nil, queueSize: 0, queueTimeout: 1)), now: 6)
        #expect(unlimited == A.Actions())
        #expect(a.handle(.arrive(4), now: 7).admitted)
    }

    @Test func loweringTheLimitLetsRequestsInFlightFinish() {
        var a = make(max: 3, queue: 5)
        for t in 1...3 as ClosedRange<UInt64> { _ = a.handle(.arrive(t), now: 0) }
        _ = a.handle(.reconfigure(.init(maxInFlight: 1, queueSize: 5, queueTimeout: 1000)), now: 0)
        #expect(a.handle(.arrive(4), now: 0).queued)
        #expect(a.handle(.release, now: 1).start.isEmpty)  // 2 still upstream, limit 1
        #expect(a.handle(.release, now: 2).start.isEmpty)
        #expect(a.handle(.release, now: 3).start == [4])
    }

    @Test func aShorterTimeoutAfterReloadExpiresLaterArrivalsFirst() {
        var a = make(max: 1, queue: 5, timeout: 1000)
        _ = a.handle(.arrive(1), now: 0)
        _ = a.handle(.arrive(2), now: 0)  // deadline 1000
        _ = a.handle(.reconfigure(.init(maxInFlight: 1, queueSize: 5, queueTimeout: 100)), now: 0)
        #expect(a.handle(.arrive(3), now: 10).timer == .arm(at: 110))
        let fired = a.handle(.timer, now: 110)
        #expect(fired.refuse == [A.Refused(ticket: 3, reason: .queueTimeout)] && fired.timer == .arm(at: 1000))
        #expect(a.handle(.release, now: 200).start == [2])
    }

    @Test func aLongRunKeepsTheQueueBounded() {
        // Many arrivals and releases: the queue never exceeds its size, every ticket ends
        // exactly once (started or refused), and the count of slots comes back to zero.
        var a = make(max: 4, queue: 8, timeout: 50)
        var started = Set<UInt64>()
        var refused = Set<UInt64>()
        var upstream: [UInt64] = []
        var now = 0
        for t in 1...5000 as ClosedRange<UInt64> {
            now += 1
            var actions = a.handle(.arrive(t), now: now)
            if actions.admitted { actions.start.append(t) }
            if t % 3 == 0, !upstream.isEmpty {
                upstream.removeFirst()
                let r = a.handle(.release, now: now)
                actions.start += r.start
                actions.refuse += r.refuse
            }
            if t % 97 == 0 {
                let r = a.handle(.timer, now: now)
                actions.start += r.start
                actions.refuse += r.refuse
            }
            for s in actions.start {
                #expect(started.insert(s).inserted)
                upstream.append(s)
            }
            for r in actions.refuse { #expect(refused.insert(r.ticket).inserted) }
            #expect(a.queued <= 8 && a.inFlight <= 4)
        }
        while !upstream.isEmpty {
            upstream.removeFirst()
            now += 100
            let r = a.handle(.release, now: now)
            for s in r.start {
                #expect(started.insert(s).inserted)
                upstream.append(s)
            }
            for x in r.refuse { #expect(refused.insert(x.ticket).inserted) }
        }
        #expect(started.isDisjoint(with: refused))
        #expect(started.count + refused.count == 5000)
        #expect(a.inFlight == 0 && a.queued == 0)
    }
}
