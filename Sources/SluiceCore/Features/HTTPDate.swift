#if canImport(Glibc)
    import Glibc
#endif

/// HTTP-dates (RFC 9110 §5.6.7) as seconds since the Unix epoch: the preferred IMF-fixdate
/// (`Sun, 06 Nov 1994 08:49:37 GMT`) and, as a recipient must, the obsolete RFC 850
/// (`Sunday, 06-Nov-94 08:49:37 GMT`) and asctime (`Sun Nov  6 08:49:37 1994`) forms.
/// Anything else is nil: the caller treats it as RFC 9111 says (an invalid `Expires` is in
/// the past).
///
/// Threading: stateless; any thread.
public enum HTTPDate {
    private static let months = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
    private static let monthNames = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
    private static let dayNames = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"]

    public static func parse(_ text: String) -> Int64? {
        let parts = text.split(whereSeparator: { $0 == " " || $0 == "\t" }).map(String.init)
        var day: Int?
        var month: Int?
        var year: Int?
        var clock: [Int] = []
        switch parts.count {
        case 6 where parts[5] == "GMT":  // IMF-fixdate
            day = Int(parts[1])
            month = months.firstIndex(of: parts[2].lowercased())
            year = Int(parts[3])
            clock = parts[4].split(separator: ":").compactMap { Int($0) }
        case 4 where parts[3] == "GMT":  // RFC 850
            let dmy = parts[1].split(separator: "-").map(String.init)
            guard dmy.count == 3, let y = Int(dmy[2]) else { return nil }
            day = Int(dmy[0])
            month = months.firstIndex(of: dmy[1].lowercased())
            year = y < 100 ? (y < 70 ? 2000 + y : 1900 + y) : y
            clock = parts[2].split(separator: ":").compactMap { Int($0) }
        case 5:  // asctime
            month = months.firstIndex(of: parts[1].lowercased())
            day = Int(parts[2])
            year = Int(parts[4])
            clock = parts[3].split(separator: ":").compactMap { Int($0) }
        default:
            return nil
        }
        guard let day, let month, let year, (1...31).contains(day), year >= 1970, year < 10000, clock.count == 3,
            (0...23).contains(clock[0]), (0...59).contains(clock[1]), (0...60).contains(clock[2])
        else { return nil }
        var tm = Glibc.tm()
        tm.tm_year = Int32(year - 1900)
        tm.tm_mon = Int32(month)
        tm.tm_mday = Int32(day)
        tm.tm_hour = Int32(clock[0])
        tm.tm_min = Int32(clock[1])
        tm.tm_sec = Int32(clock[2])
        return Int64(timegm(&tm))
    }

    /// IMF-fixdate.
    public static func format(_ seconds: Int64) -> String {
        var t = time_t(seconds)
        var tm = Glibc.tm()
        gmtime_r(&t, &tm)
        func two(_ n: Int32) -> String { n < 10 ? "0\(n)" : "\(n)" }
        let weekday = dayNames[Int((seconds / 86_400 % 7 + 7) % 7)]
        return "\(weekday), \(two(tm.tm_mday)) \(monthNames[Int(tm.tm_mon)]) \(tm.tm_year + 1900) "
            + "\(two(tm.tm_hour)):\(two(tm.tm_min)):\(two(tm.tm_sec)) GMT"
    }
}
