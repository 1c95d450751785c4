#if canImport(Glibc)
    import Glibc
#endif

/// The time an `ExchangeMachine` reads: a monotonic clock for deadlines, delays and budget
/// windows, and the wall clock for an HTTP-date `Retry-After`. Injected so that tests drive
/// time by hand; Sluice itself uses `SystemClock`.
public protocol ExchangeClock {
    /// Milliseconds on a monotonic clock (`MonotonicClock` in production).
    func monotonicMilliseconds() -> Int
    /// Milliseconds since the Unix epoch (CLOCK_REALTIME in production).
    func wallClockMilliseconds() -> Int
}

/// CLOCK_MONOTONIC and CLOCK_REALTIME, read when asked (each a vDSO call, no system call).
public struct SystemClock: ExchangeClock {
    public init() {}

    public func monotonicMilliseconds() -> Int { MonotonicClock.milliseconds() }

    public func wallClockMilliseconds() -> Int {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        return ts.tv_sec * 1000 + ts.tv_nsec / 1_000_000
    }
}
