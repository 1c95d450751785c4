#if canImport(Glibc)
import Glibc
#endif

/// A `Retry-After` value (RFC 9110 §10.2.3): delay-seconds or an HTTP-date (IMF-fixdate).
/// `RetryPolicy` honours it on 429 and 503 when `retry_after` is on.
public enum RetryAfter: Sendable, Equatable {
    /// `Retry-After: 120`, in milliseconds.
    case delay(milliseconds: Int)
    /// `Retry-After: Sun, 06 Nov 1994 08:49:37 GMT`, as seconds since the Unix epoch.
    case date(epochSeconds: Int)

    /// Delays longer than a day are not believed (the value is ignored: the backoff applies).
    public static let maxDelaySeconds = 86_400

    /// nil for a value that is neither form (or a delay over `maxDelaySeconds`): the backoff
    /// applies then.
    public init?(_ value: String) {
        let value = Self.trimmed(value)
        guard !value.isEmpty else { return nil }
        if value.allSatisfy(\.isNumber) {
            guard let seconds = Int(value), seconds <= Self.maxDelaySeconds else { return nil }
            self = .delay(milliseconds: seconds * 1000)
            return
        }
        // IMF-fixdate: "Sun, 06 Nov 1994 08:49:37 GMT"
        let parts = value.split(separator: " ")
        let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
        guard parts.count == 6, parts[5] == "GMT", let day = Int(parts[1]),
              let month = months.firstIndex(of: String(parts[2])), let year = Int(parts[3]) else { return nil }
        let clock = parts[4].split(separator: ":").compactMap { Int($0) }
        guard clock.count == 3 else { return nil }
        var tm = Glibc.tm()
        tm.tm_year = Int32(year - 1900)
        tm.tm_mon = Int32(month)
        tm.tm_mday = Int32(day)
        tm.tm_hour = Int32(clock[0])
        tm.tm_min = Int32(clock[1])
        tm.tm_sec = Int32(clock[2])
        self = .date(epochSeconds: Int(timegm(&tm)))
    }

    /// Whether the wait depends on the current wall-clock time.
    public var isDate: Bool {
        if case .date = self { return true } else { return false }
    }

    /// The wait from `now` (wall-clock ms since the epoch, used for a date only): a date in
    /// the past means no wait.
    public func milliseconds(wallClockNow now: Int) -> Int {
        switch self {
        case .delay(let ms): return ms
        case .date(let seconds): return max(0, seconds * 1000 - now)
        }
    }

    private static func trimmed(_ s: String) -> Substring {
        var s = Substring(s)
        while let c = s.first, c == " " || c == "\t" { s = s.dropFirst() }
        while let c = s.last, c == " " || c == "\t" { s = s.dropLast() }
        return s
    }
}
