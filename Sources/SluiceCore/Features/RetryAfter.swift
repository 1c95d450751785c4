/// A `Retry-After` value (RFC 9110 §10.2.3): delay-seconds or an HTTP-date (`HTTPDate`).
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
        // An HTTP-date in any of its three forms (IMF-fixdate, RFC 850, asctime).
        guard let seconds = HTTPDate.parse(String(value)) else { return nil }
        self = .date(epochSeconds: Int(seconds))
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
