import CLoopClock

/// The monotonic clock as a worker's loop reads it for deadlines: at most once per loop
/// event's callback, as nginx reads its clock once per pass of its loop.
///
/// A kept-alive request arms four lazy timers (`LoopTimer`: the connection's idle and header
/// deadlines, the try's wait for its response head, the pooled connection's idle time), each
/// from a clock read of its own: four `clock_gettime` calls of about 22 ns each on this
/// project's machines (a vDSO call that reads the TSC), which `perf` put at 0.8 % of a
/// worker's time under the `lua` benchmark's load. Here the first read in a callback is
/// kept, and later reads in the same callback reuse it.
///
/// What that costs: a reading taken later in a callback is as old as the work done in it
/// before, so a deadline armed from it falls that much early. That work is microseconds,
/// save a script's: a call of a `lua` script (`LuaState.resume`) puts the reading it takes
/// when it returns in place of the kept one (`keep`). Durations that are measured — a try's
/// timings, a script's `us` — read `MonotonicClock`, never this.
///
/// Threading: each thread has its own reading (`sluice_loop_clock`, thread-local). A loop
/// event's callback opens it on entry and closes it on return (`open`, `close`); outside one
/// — a thread without a loop, a loop not yet running or stopped — every call reads the clock.
public enum LoopClock {
    /// Monotonic microseconds, `MonotonicClock.microseconds()`'s clock.
    @inlinable
    public static func microseconds() -> Int64 {
        let kept = sluice_loop_clock_get()
        if kept > 0 { return Int64(kept) }
        return read(keeping: kept == 0)
    }

    @usableFromInline
    static func read(keeping: Bool) -> Int64 {
        let now = MonotonicClock.microseconds()
        if keeping { sluice_loop_clock_set(CLongLong(now)) }
        return now
    }

    /// A loop event's callback starts: the next reading is kept until it returns.
    @inlinable
    public static func open() { sluice_loop_clock_set(0) }

    /// The callback returned: every call reads the clock again.
    @inlinable
    public static func close() { sluice_loop_clock_set(-1) }

    /// A fresh reading `now` (of `MonotonicClock`), taken after long work in a callback,
    /// replaces the kept one; outside a callback it changes nothing.
    @inlinable
    public static func keep(_ now: Int64) {
        if sluice_loop_clock_get() >= 0 { sluice_loop_clock_set(CLongLong(now)) }
    }
}
