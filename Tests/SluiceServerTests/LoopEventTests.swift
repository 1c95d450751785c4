import CLibEvent
import Foundation
import SluiceCore
import Synchronization
import Testing

@testable import SluiceServer

#if canImport(Glibc)
    import Glibc
#endif

/// `LoopTimer`, `LoopWake` and `SocketEvent` on a real `event_base`, run pass by pass.
@Suite struct LoopEventTests {
    /// What the events' closures did, and the events it owns.
    final class Owner {
        var fired = 0
        /// When `timerFired` ran (monotonic microseconds).
        var firedAt: [Int64] = []
        var timedOut: [Bool] = []
        var threads: [pthread_t] = []
        var timer: LoopTimer<Owner>?
        var wake: LoopWake<Owner>?
        var socket: SocketEvent<Owner>?
        /// Drops the event that fires, from within its own closure.
        var dropsOnFire = false

        func timerFired() {
            fired += 1
            firedAt.append(MonotonicClock.microseconds())
            if dropsOnFire { timer = nil }
        }

        func woken() {
            fired += 1
            threads.append(pthread_self())
            if dropsOnFire { wake = nil }
        }

        /// `LoopClock` read twice in one callback, a millisecond of work apart, and what the
        /// clock itself says after that work.
        var clockReadings: [(first: Int64, second: Int64, fresh: Int64)] = []

        func readLoopClock() {
            fired += 1
            let first = LoopClock.microseconds()
            let fresh = LoopEventTests.work(microseconds: 1000)
            clockReadings.append((first, LoopClock.microseconds(), fresh))
        }

        /// A descriptor `ready` reads a byte from (-1: none).
        var drains: Int32 = -1

        func ready(timedOut: Bool) {
            if drains >= 0 {
                var byte: UInt8 = 0
                _ = Glibc.read(drains, &byte, 1)
            }
            fired += 1
            self.timedOut.append(timedOut)
            if dropsOnFire { socket = nil }
        }
    }

    /// A loop and an owner: a worker's loop, without a lock (`LoopBase.make()`), unless
    /// `locked` (libevent's pthreads locking, as the admin loop has).
    final class Fixture {
        let base: OpaquePointer
        let owner = Owner()
        /// Bounds each pass of `spin` (a loop with nothing armed would block).
        private var tick: LoopTimer<Owner>?

        init(locked: Bool = false, tickMilliseconds: Int = 2) {
            evthread_use_pthreads()
            base = locked ? event_base_new()! : LoopBase.make()!
            tick = LoopTimer(on: base, owner: owner, repeating: true) { _ in }
            tick?.arm(milliseconds: tickMilliseconds)
        }

        /// Runs the loop for `milliseconds`, or until `done` (checked after each pass).
        func spin(milliseconds: Int, until done: () -> Bool = { false }) {
            let deadline = MonotonicClock.milliseconds() + milliseconds
            while !done() && MonotonicClock.milliseconds() < deadline { _ = event_base_loop(base, EVLOOP_ONCE) }
        }

        /// Drops every event, then the loop (events must go first).
        func close() {
            owner.timer = nil
            owner.wake = nil
            owner.socket = nil
            tick = nil
            event_base_free(base)
        }
    }

    @Test func aTimerFiresOnce() {
        let f = Fixture()
        defer { f.close() }
        f.owner.timer = LoopTimer(on: f.base, owner: f.owner) { $0.timerFired() }
        f.owner.timer?.arm(milliseconds: 5)
        f.spin(milliseconds: 60)
        #expect(f.owner.fired == 1)
    }

    @Test(arguments: [false, true]) func rearmingMovesTheDeadline(lazy: Bool) {
        let f = Fixture()
        defer { f.close() }
        f.owner.timer = LoopTimer(on: f.base, owner: f.owner, lazy: lazy) { $0.timerFired() }
        // Later: nothing at the first deadline.
        f.owner.timer?.arm(milliseconds: 10)
        f.owner.timer?.arm(milliseconds: 400)
        f.spin(milliseconds: 60)
        #expect(f.owner.fired == 0)
        // Sooner: it fires long before the first one.
        f.owner.timer?.arm(milliseconds: 5_000)
        let start = MonotonicClock.milliseconds()
        f.owner.timer?.arm(milliseconds: 5)
        f.spin(milliseconds: 2_000) { f.owner.fired > 0 }
        #expect(f.owner.fired == 1)
        #expect(MonotonicClock.milliseconds() - start < 1_000)
    }

    @Test(arguments: [false, true]) func stopAndDropPreventFiring(lazy: Bool) {
        let f = Fixture()
        defer { f.close() }
        f.owner.timer = LoopTimer(on: f.base, owner: f.owner, lazy: lazy) { $0.timerFired() }
        f.owner.timer?.arm(milliseconds: 5)
        f.owner.timer?.stop()
        f.spin(milliseconds: 40)
        #expect(f.owner.fired == 0)
        // Armed, then dropped: freed in its deinit, it never fires.
        f.owner.timer?.arm(milliseconds: 5)
        f.owner.timer = nil
        f.spin(milliseconds: 40)
        #expect(f.owner.fired == 0)
    }

    // A lazy timer: the same promises (the tests above run for both kinds), with libevent's
    // event moved only when it must be.

    @Test func aLazyTimerFiresOnceAndNeverBeforeItsDeadline() {
        let f = Fixture()
        defer { f.close() }
        f.owner.timer = LoopTimer(on: f.base, owner: f.owner, lazy: true) { $0.timerFired() }
        let start = MonotonicClock.microseconds()
        f.owner.timer?.arm(milliseconds: 20)
        expectOneFiring(f, notBefore: start + 20_000)
        #expect(f.owner.timer?.isArmed == false)
    }

    @Test func aLazyTimerMovedLaterWaitsForTheNewDeadline() {
        let f = Fixture()
        defer { f.close() }
        f.owner.timer = LoopTimer(on: f.base, owner: f.owner, lazy: true) { $0.timerFired() }
        f.owner.timer?.arm(milliseconds: 10)
        let start = MonotonicClock.microseconds()
        f.owner.timer?.arm(milliseconds: 150)
        // The event wakes the loop at 10 ms, and the timer waits for the rest.
        f.spin(milliseconds: 60)
        #expect(f.owner.fired == 0)
        expectOneFiring(f, notBefore: start + 150_000)
    }

    @Test func aStoppedLazyTimerDoesNotFireAndRearmsLater() {
        let f = Fixture()
        defer { f.close() }
        f.owner.timer = LoopTimer(on: f.base, owner: f.owner, lazy: true) { $0.timerFired() }
        f.owner.timer?.arm(milliseconds: 5)
        f.owner.timer?.stop()
        #expect(f.owner.timer?.isArmed == false)
        f.spin(milliseconds: 40)
        #expect(f.owner.fired == 0)
        // Stopped while its event is still pending, armed again for later: it fires once,
        // at the later deadline.
        f.owner.timer?.arm(milliseconds: 20)
        f.owner.timer?.stop()
        let start = MonotonicClock.microseconds()
        f.owner.timer?.arm(milliseconds: 80)
        expectOneFiring(f, notBefore: start + 80_000)
    }

    /// Runs `f`'s loop until its timer fired, and 30 ms more: it fired once, not before
    /// `deadline` (monotonic microseconds).
    private func expectOneFiring(_ f: Fixture, notBefore deadline: Int64) {
        f.spin(milliseconds: 2_000) { f.owner.fired > 0 }
        f.spin(milliseconds: 30)
        #expect(f.owner.fired == 1)
        #expect(f.owner.firedAt.first.map { $0 >= deadline } == true)
    }

    @Test func armAndStopPerRequestLeaveLibeventsEventAlone() throws {
        let f = Fixture()
        defer { f.close() }
        f.owner.timer = LoopTimer(on: f.base, owner: f.owner, lazy: true) { $0.timerFired() }
        f.owner.timer?.arm(milliseconds: 60_000)
        let first = try #require(f.owner.timer?.pendingTimeout)
        for _ in 0..<3 {
            usleep(10_000)  // more than the coarse clock's tick: a new arm means a later deadline
            f.owner.timer?.stop()
            f.owner.timer?.arm(milliseconds: 60_000)
        }
        let after = try #require(f.owner.timer?.pendingTimeout)
        #expect(after.tv_sec == first.tv_sec && after.tv_usec == first.tv_usec)
        // A plain timer moves the event on every arm.
        f.owner.timer = LoopTimer(on: f.base, owner: f.owner) { $0.timerFired() }
        f.owner.timer?.arm(milliseconds: 60_000)
        usleep(10_000)
        f.owner.timer?.stop()
        f.owner.timer?.arm(milliseconds: 60_000)
        let moved = try #require(f.owner.timer?.pendingTimeout)
        #expect(moved.tv_sec * 1_000_000 + moved.tv_usec > first.tv_sec * 1_000_000 + first.tv_usec + 20_000)
    }

    @Test func aRepeatingTimerFiresUntilStopped() {
        let f = Fixture()
        defer { f.close() }
        f.owner.timer = LoopTimer(on: f.base, owner: f.owner, repeating: true) { $0.timerFired() }
        f.owner.timer?.arm(milliseconds: 3)
        f.spin(milliseconds: 2_000) { f.owner.fired >= 3 }
        #expect(f.owner.fired >= 3)
        f.owner.timer?.stop()
        let count = f.owner.fired
        f.spin(milliseconds: 30)
        #expect(f.owner.fired == count)
    }

    @Test func eachKindMayBeDroppedFromItsOwnClosure() throws {
        let f = Fixture()
        defer { f.close() }
        f.owner.dropsOnFire = true
        // A repeating timer: dropped at its first firing, it never fires again.
        f.owner.timer = LoopTimer(on: f.base, owner: f.owner, repeating: true) { $0.timerFired() }
        f.owner.timer?.arm(milliseconds: 2)
        f.spin(milliseconds: 60)
        #expect(f.owner.fired == 1)
        #expect(f.owner.timer == nil)
        f.owner.wake = LoopWake(on: f.base, owner: f.owner) { $0.woken() }
        f.owner.wake?.activate()
        f.spin(milliseconds: 20)
        #expect(f.owner.fired == 2)
        #expect(f.owner.wake == nil)
        let (reader, writer) = try Self.pipe()
        defer {
            Glibc.close(reader)
            Glibc.close(writer)
        }
        f.owner.socket = SocketEvent(on: f.base, fd: reader, .read, owner: f.owner) { $0.ready(timedOut: $1) }
        f.owner.socket?.arm()
        _ = Glibc.write(writer, "x", 1)
        f.spin(milliseconds: 40)
        #expect(f.owner.fired == 3)
        #expect(f.owner.socket == nil)
    }

    /// Busy for `microseconds` on the monotonic clock; returns its reading at the end.
    static func work(microseconds: Int64) -> Int64 {
        let start = MonotonicClock.microseconds()
        var now = start
        while now - start < microseconds { now = MonotonicClock.microseconds() }
        return now
    }

    /// A callback's reads of `LoopClock` are its first (the timers a request arms share one
    /// `clock_gettime`); the next callback reads again, and so does code outside callbacks.
    /// Without `open`/`close` around the callback, the second reading would be the later one.
    @Test func theLoopClockIsReadOncePerCallback() {
        let f = Fixture()
        defer { f.close() }
        f.owner.wake = LoopWake(on: f.base, owner: f.owner) { $0.readLoopClock() }
        for _ in 0..<2 {
            f.owner.wake?.activate()
            _ = event_base_loop(f.base, EVLOOP_NONBLOCK)
        }
        #expect(f.owner.fired == 2)
        let readings = f.owner.clockReadings
        #expect(readings.count == 2)
        for r in readings {
            #expect(r.second == r.first)
            #expect(r.fresh - r.first >= 1000)
        }
        if readings.count == 2 { #expect(readings[1].first >= readings[0].fresh) }
        // Outside a callback, every call reads the clock.
        let outside = LoopClock.microseconds()
        let later = Self.work(microseconds: 500)
        #expect(LoopClock.microseconds() >= later)
        #expect(outside >= (readings.last?.fresh ?? 0))
    }

    @Test func activateRunsInThisPass() {
        let f = Fixture()
        defer { f.close() }
        f.owner.timer = LoopTimer(on: f.base, owner: f.owner) { $0.timerFired() }
        f.owner.timer?.arm(milliseconds: 10_000)
        f.owner.timer?.activate()
        _ = event_base_loop(f.base, EVLOOP_NONBLOCK)
        #expect(f.owner.fired == 1)
    }

    @Test(arguments: [false, true]) func aWakeFromAnotherThreadRunsOnTheLoopsThread(locked: Bool) {
        let f = Fixture(locked: locked)
        defer { f.close() }
        f.owner.wake = LoopWake(on: f.base, owner: f.owner, crossThread: true) { $0.woken() }
        let handle = f.owner.wake!.handle
        let loopThread = pthread_self()
        let other = Thread { handle.activate() }
        other.start()
        f.spin(milliseconds: 2_000) { f.owner.fired > 0 }
        #expect(f.owner.fired == 1)
        #expect(f.owner.threads.count == 1 && pthread_equal(f.owner.threads[0], loopThread) != 0)
        // Activations before it runs are one.
        handle.activate()
        handle.activate()
        f.spin(milliseconds: 20)
        #expect(f.owner.fired == 2)
        // Nothing since: it does not run again.
        f.spin(milliseconds: 20)
        #expect(f.owner.fired == 2)
        // Activated on the loop's own thread, as any wake: it runs once, in this pass.
        f.owner.wake?.activate()
        _ = event_base_loop(f.base, EVLOOP_NONBLOCK)
        #expect(f.owner.fired == 3)
        f.spin(milliseconds: 20)
        #expect(f.owner.fired == 3)
    }

    /// On a loop without a lock, asleep in `epoll_wait` (its only timer is 1 s away): each of
    /// 200 wakes from other threads, one at a time, runs the owner at once — an activation
    /// that did not wake the loop would wait for the timer — and none is lost between the
    /// loop's drain of the eventfd and its next wait; then 1,000 from four threads at once run
    /// it only on the loop's thread, and once more after the last of them at the latest.
    @Test func wakesFromOtherThreadsReachALoopWithoutALock() {
        let f = Fixture(tickMilliseconds: 1_000)
        defer { f.close() }
        f.owner.wake = LoopWake(on: f.base, owner: f.owner, crossThread: true) { $0.woken() }
        let handle = f.owner.wake!.handle
        var slowest: Int64 = 0
        for round in 1...200 {
            let start = MonotonicClock.microseconds()
            let other = Thread { handle.activate() }
            other.start()
            f.spin(milliseconds: 3_000) { f.owner.fired == round }
            slowest = max(slowest, MonotonicClock.microseconds() - start)
            guard f.owner.fired == round else {
                Issue.record("wake \(round) did not run the owner")
                return
            }
        }
        #expect(slowest < 500_000, "a wake took \(slowest) µs to run")
        let done = Mutex(0)
        let threads = (0..<4).map { _ in
            Thread {
                for _ in 0..<250 { handle.activate() }
                done.withLock { $0 += 1 }
            }
        }
        for thread in threads { thread.start() }
        f.spin(milliseconds: 5_000) { done.withLock { $0 } == 4 }
        #expect(done.withLock { $0 } == 4)
        let afterBurst = f.owner.fired
        // A write after the pass that drained the eventfd wakes it once more; none is left over.
        f.spin(milliseconds: 50)
        #expect(f.owner.fired > 200 && f.owner.fired <= afterBurst + 1)
        let loopThread = pthread_self()
        #expect(f.owner.threads.allSatisfy { pthread_equal($0, loopThread) != 0 })
        let settled = f.owner.fired
        f.spin(milliseconds: 20)
        #expect(f.owner.fired == settled)
    }

    @Test func aSocketEventReportsReadinessOrItsTimeout() throws {
        let f = Fixture()
        defer { f.close() }
        let (reader, writer) = try Self.pipe()
        defer {
            Glibc.close(reader)
            Glibc.close(writer)
        }
        // Persistent: every time there is something to read, until stopped.
        f.owner.drains = reader
        f.owner.socket = SocketEvent(on: f.base, fd: reader, .read, owner: f.owner) { $0.ready(timedOut: $1) }
        f.owner.socket?.arm()
        f.spin(milliseconds: 20)
        #expect(f.owner.fired == 0)
        _ = Glibc.write(writer, "a", 1)
        f.spin(milliseconds: 500) { f.owner.fired == 1 }
        _ = Glibc.write(writer, "b", 1)
        f.spin(milliseconds: 500) { f.owner.fired == 2 }
        #expect(f.owner.timedOut == [false, false])
        f.owner.socket?.stop()
        _ = Glibc.write(writer, "c", 1)
        f.spin(milliseconds: 20)
        #expect(f.owner.fired == 2)
        // Once, with a timeout: nothing to read (the byte is taken first), so it times out.
        var byte: UInt8 = 0
        _ = Glibc.read(reader, &byte, 1)
        f.owner.drains = -1
        f.owner.socket = SocketEvent(on: f.base, fd: reader, .read, persistent: false, owner: f.owner) {
            $0.ready(timedOut: $1)
        }
        f.owner.socket?.arm(timeoutMilliseconds: 10)
        f.spin(milliseconds: 2_000) { f.owner.fired == 3 }
        #expect(f.owner.timedOut == [false, false, true])
    }

    /// A non-blocking pipe: (read end, write end).
    private static func pipe() throws -> (Int32, Int32) {
        var fds: [Int32] = [0, 0]
        guard Glibc.pipe(&fds) == 0 else { throw POSIXError(.EMFILE) }
        for fd in fds { _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) }
        return (fds[0], fds[1])
    }
}
