import Testing

@testable import SluiceCore

/// `LoopClock` without a loop: what a callback's `open` and `close` do, and the reading a
/// script's call leaves (`LuaState.resume`). Each test closes what it opened: the reading is
/// the thread's, and the test runner's threads run other tests after.
@Suite struct LoopClockTests {
    /// Busy for `microseconds`; returns the monotonic clock's reading at the end.
    static func work(microseconds: Int64) -> Int64 {
        let start = MonotonicClock.microseconds()
        var now = start
        while now - start < microseconds { now = MonotonicClock.microseconds() }
        return now
    }

    /// After a callback closed its reading, calls read the clock again.
    @Test func outsideACallbackEveryCallReadsTheClock() {
        LoopClock.open()
        _ = LoopClock.microseconds()
        LoopClock.close()
        let first = LoopClock.microseconds()
        let later = Self.work(microseconds: 1000)
        let second = LoopClock.microseconds()
        #expect(second >= later)
        #expect(second - first >= 1000)
    }

    @Test func insideACallbackTheFirstReadingIsKeptUntilItCloses() {
        LoopClock.open()
        let first = LoopClock.microseconds()
        let later = Self.work(microseconds: 1000)
        let second = LoopClock.microseconds()
        LoopClock.close()
        #expect(second == first)
        #expect(later - first >= 1000)
        #expect(LoopClock.microseconds() >= later)
    }

    /// A script that runs for a while moves the kept reading to its end, so a deadline armed
    /// after it (the try's wait for its response head) counts from then, not from before it.
    @Test func aScriptsCallReplacesTheKeptReadingWithItsEnd() throws {
        let state = try LuaTest.load(
            "return { on_request = function(req) local n = 0 for i = 1, 200000 do n = n + i end end }")
        var request = LuaTest.get()
        LoopClock.open()
        let before = LoopClock.microseconds()
        let result = state.makeExchange().onRequest(&request)
        let after = LoopClock.microseconds()
        LoopClock.close()
        #expect(result.outcome == .ok)
        #expect(result.microseconds > 0)
        #expect(after - before >= result.microseconds)
        #expect(after <= MonotonicClock.microseconds())
    }

    /// A state on a test's clock leaves the loop's reading alone.
    @Test func aTestClockDoesNotReachTheLoopClock() throws {
        let clock = LuaClock(monotonic: { 5 })
        let state = try LuaTest.load("return { on_request = function(req) end }", clock: clock)
        var request = LuaTest.get()
        LoopClock.open()
        let before = LoopClock.microseconds()
        _ = state.makeExchange().onRequest(&request)
        let after = LoopClock.microseconds()
        LoopClock.close()
        #expect(after == before)
    }
}
