import Testing

@testable import SluiceServer

/// `UpstreamPoolState`, the native keep-alive pool's rules, without sockets: most recently
/// used first, the per-origin limit with its queue, and what a closed idle connection frees.
@Suite struct UpstreamPoolStateTests {
    final class Conn {
        let name: String
        init(_ name: String) { self.name = name }
    }
    final class Try {}

    typealias State = UpstreamPoolState<String, String, Conn, Try>

    private func reused(_ grant: State.Grant) -> Conn? {
        if case .reuse(let c) = grant { return c }
        return nil
    }

    private func isOpen(_ grant: State.Grant) -> Bool {
        if case .open = grant { return true }
        return false
    }

    private func isWait(_ grant: State.Grant) -> Bool {
        if case .wait = grant { return true }
        return false
    }

    @Test func withoutLimitEveryTryMayOpenAndIdleOnesAreReusedNewestFirst() {
        var s = State(maxPerOrigin: 0, maxIdle: 10)
        #expect(isOpen(s.acquire(origin: "a:80", key: "a:80@1", for: Try())))
        #expect(isOpen(s.acquire(origin: "a:80", key: "a:80@1", for: Try())))
        let c1 = Conn("1")
        let c2 = Conn("2")
        #expect(s.release(c1, key: "a:80@1", origin: "a:80", reusable: true).0 == .park)
        #expect(s.release(c2, key: "a:80@1", origin: "a:80", reusable: true).0 == .park)
        #expect(s.idleCount == 2)
        #expect(reused(s.acquire(origin: "a:80", key: "a:80@1", for: Try())) === c2)
        #expect(reused(s.acquire(origin: "a:80", key: "a:80@1", for: Try())) === c1)
        #expect(isOpen(s.acquire(origin: "a:80", key: "a:80@1", for: Try())))
        #expect(s.idleCount == 0)
    }

    @Test func connectionsAreKeptPerKey() {
        var s = State(maxPerOrigin: 0, maxIdle: 10)
        let c = Conn("a")
        _ = s.release(c, key: "a:80@10.0.0.1", origin: "a:80", reusable: true)
        // Another address of the same origin (DNS changed): not this connection.
        #expect(isOpen(s.acquire(origin: "a:80", key: "a:80@10.0.0.2", for: Try())))
        #expect(isOpen(s.acquire(origin: "b:80", key: "b:80@10.0.0.1", for: Try())))
        #expect(reused(s.acquire(origin: "a:80", key: "a:80@10.0.0.1", for: Try())) === c)
    }

    @Test func emptiedKeysAreKeptForReuseButBounded() {
        var s = State(maxPerOrigin: 0, maxIdle: 10_000)
        // One origin used over and over: its entry stays (no allocation per request).
        for _ in 0..<100 {
            let c = reused(s.acquire(origin: "a:80", key: "a:80@1", for: Try())) ?? Conn("a")
            #expect(s.release(c, key: "a:80@1", origin: "a:80", reusable: true).0 == .park)
        }
        #expect(s.idleCount == 1 && s.keyCount == 1)
        // A thousand origins used once each, their connections then gone: the emptied
        // entries do not accumulate.
        for i in 0..<1000 {
            let c = Conn("\(i)")
            _ = s.release(c, key: "h\(i):80@1", origin: "h\(i):80", reusable: true)
            #expect(reused(s.acquire(origin: "h\(i):80", key: "h\(i):80@1", for: Try())) === c)
            _ = s.release(c, key: "h\(i):80@1", origin: "h\(i):80", reusable: true)
            #expect(s.closedIdle(c, key: "h\(i):80@1", origin: "h\(i):80").removed)
            #expect(s.keyCount <= 2 * s.idleCount + 64 + 1)
        }
        #expect(s.idleCount == 1)
        #expect(reused(s.acquire(origin: "a:80", key: "a:80@1", for: Try())) != nil)
    }

    /// The memo of the key looked up last must never hand out another key's connection:
    /// new keys grow and rehash the table, pruning rebuilds it, and after each the hot key
    /// still finds its own connection and a cold key finds its own.
    @Test func theLastKeyLookedUpStaysRightAcrossGrowthAndPruning() {
        var s = State(maxPerOrigin: 0, maxIdle: 10_000)
        let hot = Conn("hot")
        _ = s.release(hot, key: "hot", origin: "o", reusable: true)
        for i in 0..<500 {
            #expect(reused(s.acquire(origin: "o", key: "hot", for: Try())) === hot)
            let cold = Conn("\(i)")
            // A new key (the table grows), released while the memo names "hot".
            _ = s.release(cold, key: "k\(i)", origin: "o", reusable: true)
            _ = s.release(hot, key: "hot", origin: "o", reusable: true)
            // The cold key's connection, then gone (its entry is emptied, later pruned).
            #expect(reused(s.acquire(origin: "o", key: "k\(i)", for: Try())) === cold)
            #expect(!s.closedIdle(cold, key: "k\(i)", origin: "o").removed)
            #expect(s.idleCount == 1)
        }
        #expect(s.keyCount <= 2 * s.idleCount + 64 + 1)
        #expect(reused(s.acquire(origin: "o", key: "hot", for: Try())) === hot)
        #expect(isOpen(s.acquire(origin: "o", key: "k3", for: Try())))
        _ = s.release(hot, key: "hot", origin: "o", reusable: true)
        #expect(s.drainIdle().count == 1)
        #expect(isOpen(s.acquire(origin: "o", key: "hot", for: Try())))
    }

    @Test func aConnectionNotReusableOrBeyondTheIdleBoundIsClosed() {
        var s = State(maxPerOrigin: 0, maxIdle: 1)
        #expect(s.release(Conn("x"), key: "k", origin: "o", reusable: false).0 == .close)
        #expect(s.release(Conn("y"), key: "k", origin: "o", reusable: true).0 == .park)
        #expect(s.release(Conn("z"), key: "k", origin: "o", reusable: true).0 == .close)
        #expect(s.idleCount == 1)
    }

    @Test func theLimitQueuesTriesFirstComeFirstServed() {
        var s = State(maxPerOrigin: 2, maxIdle: 10)
        let t1 = Try()
        let t2 = Try()
        let t3 = Try()
        let t4 = Try()
        #expect(isOpen(s.acquire(origin: "o", key: "k", for: t1)))
        #expect(isOpen(s.acquire(origin: "o", key: "k", for: t2)))
        #expect(isWait(s.acquire(origin: "o", key: "k", for: t3)))
        #expect(isWait(s.acquire(origin: "o", key: "k", for: t4)))
        #expect(s.places(for: "o") == 2)
        #expect(s.waiters(for: "o") == 2)
        // Another origin is not held up.
        #expect(isOpen(s.acquire(origin: "p", key: "kp", for: Try())))

        // t1's connection goes idle: t3 (first in line) is told to ask again, and gets it.
        let c1 = Conn("1")
        let (action, wake) = s.release(c1, key: "k", origin: "o", reusable: true)
        #expect(action == .park)
        #expect(wake?.waiter === t3 && wake?.opening == false)
        #expect(reused(s.acquire(origin: "o", key: "k", for: t3)) === c1)
        #expect(s.places(for: "o") == 2)

        // t2's connection closes: t4 takes its place with a new connection.
        let (closeAction, wake2) = s.release(Conn("2"), key: "k", origin: "o", reusable: false)
        #expect(closeAction == .close)
        #expect(wake2?.waiter === t4 && wake2?.opening == true)
        #expect(s.places(for: "o") == 2)
        #expect(s.waiters(for: "o") == 0)
    }

    @Test func aTryThatGivesUpLeavesTheQueue() {
        var s = State(maxPerOrigin: 1, maxIdle: 10)
        let t1 = Try()
        let t2 = Try()
        let t3 = Try()
        #expect(isOpen(s.acquire(origin: "o", key: "k", for: t1)))
        #expect(isWait(s.acquire(origin: "o", key: "k", for: t2)))
        #expect(isWait(s.acquire(origin: "o", key: "k", for: t3)))
        s.cancelWait(origin: "o", for: t2)
        let (_, wake) = s.release(nil, key: "", origin: "o", reusable: false)  // t1's connect failed
        #expect(wake?.waiter === t3 && wake?.opening == true)
        #expect(s.places(for: "o") == 1)
    }

    @Test func aClosedIdleConnectionFreesItsPlace() {
        var s = State(maxPerOrigin: 1, maxIdle: 10)
        let t1 = Try()
        let t2 = Try()
        #expect(isOpen(s.acquire(origin: "o", key: "k", for: t1)))
        let c = Conn("1")
        #expect(s.release(c, key: "k", origin: "o", reusable: true).1 == nil)  // nobody waits
        #expect(s.places(for: "o") == 1)  // the idle connection still holds it
        // A try for another address of the origin waits: the place is the idle one's.
        #expect(isWait(s.acquire(origin: "o", key: "k2", for: t2)))
        let (removed, wake) = s.closedIdle(c, key: "k", origin: "o")
        #expect(removed)
        #expect(wake?.waiter === t2 && wake?.opening == true)
        #expect(s.idleCount == 0)
        // Not idle any more: a second report changes nothing.
        #expect(s.closedIdle(c, key: "k", origin: "o").removed == false)
    }

    @Test func drainIdleEmptiesThePool() {
        var s = State(maxPerOrigin: 0, maxIdle: 10)
        _ = s.release(Conn("1"), key: "a", origin: "a", reusable: true)
        _ = s.release(Conn("2"), key: "b", origin: "b", reusable: true)
        #expect(s.drainIdle().count == 2)
        #expect(s.idleCount == 0)
        #expect(isOpen(s.acquire(origin: "a", key: "a", for: Try())))
    }

    /// A burst's surplus halves every period; what a period used is kept; one idle connection
    /// is never surplus.
    @Test func theSurplusOfAPeriodIsHalvedOldestFirst() {
        var s = State(maxPerOrigin: 0, maxIdle: 10_000)
        let burst = (0..<100).map { Conn("\($0)") }
        for c in burst { _ = s.release(c, key: "a", origin: "a", reusable: true) }
        // The period began with nothing idle: nothing was surplus for all of it.
        #expect(s.purgeCandidates().isEmpty)
        // A quiet period: all 100 were idle throughout; half go, the oldest.
        let first = s.purgeCandidates()
        #expect(first.count == 50)
        #expect(first.allSatisfy { c in burst.prefix(50).contains { $0 === c } })
        for c in first { #expect(s.closedIdle(c, key: "a", origin: "a").removed) }
        #expect(s.idleCount == 50)
        // A period in which 40 of the 50 were in use at once: only 10 were surplus, 5 go.
        var used: [Conn] = []
        for _ in 0..<40 { used.append(reused(s.acquire(origin: "a", key: "a", for: Try()))!) }
        for c in used { _ = s.release(c, key: "a", origin: "a", reusable: true) }
        let second = s.purgeCandidates()
        #expect(second.count == 5)
        for c in second { _ = s.closedIdle(c, key: "a", origin: "a") }
        // Down to one, which stays.
        while s.idleCount > 1 {
            let next = s.purgeCandidates()
            #expect(!next.isEmpty)
            for c in next { _ = s.closedIdle(c, key: "a", origin: "a") }
        }
        #expect(s.purgeCandidates().isEmpty)
        #expect(s.idleCount == 1)
    }

    /// Many origins with one idle connection each: the surplus is still found.
    @Test func theSurplusSpansKeys() {
        var s = State(maxPerOrigin: 0, maxIdle: 10_000)
        for i in 0..<10 { _ = s.release(Conn("\(i)"), key: "k\(i)", origin: "k\(i)", reusable: true) }
        _ = s.purgeCandidates()
        #expect(s.purgeCandidates().count == 5)
    }
}
