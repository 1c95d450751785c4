import CLibEvent
import Foundation
import SluiceCore
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

    /// A loop (with pthreads locking, so other threads may activate its events) and an owner.
    final class Fixture {
        let base: OpaquePointer
        let owner = Owner()
        /// Bounds each pass of `spin` (a loop with nothing armed would block).
        private var tick: LoopTimer<Owner>?

        init() {
            evthread_use_pthreads()
            base = event_base_new()!
            tick = LoopTimer(on: base, owner: owner, repeating: true) { _ in }
            tick?.arm(milliseconds: 2)
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

    @Test func activateRunsInThisPass() {
        let f = Fixture()
        defer { f.close() }
        f.owner.timer = LoopTimer(on: f.base, owner: f.owner) { $0.timerFired() }
        f.owner.timer?.arm(milliseconds: 10_000)
        f.owner.timer?.activate()
        _ = event_base_loop(f.base, EVLOOP_NONBLOCK)
        #expect(f.owner.fired == 1)
    }

    @Test func aWakeFromAnotherThreadRunsOnTheLoopsThread() {
        let f = Fixture()
        defer { f.close() }
        f.owner.wake = LoopWake(on: f.base, owner: f.owner) { $0.woken() }
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
