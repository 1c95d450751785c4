#if canImport(Glibc)
    import Glibc
#endif

/// Milliseconds on CLOCK_MONOTONIC: for timeouts, deadlines, windows and budgets, never for
/// wall-clock times (those come from CLOCK_REALTIME where a log line needs one).
public enum MonotonicClock {
    public static func milliseconds() -> Int {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return ts.tv_sec * 1000 + ts.tv_nsec / 1_000_000
    }

    public static func microseconds() -> Int64 {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return Int64(ts.tv_sec) * 1_000_000 + Int64(ts.tv_nsec / 1000)
    }
}
