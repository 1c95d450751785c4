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
    private static let monthBytes: [(UInt8, UInt8, UInt8)] = months.map {
        let m = Array($0.utf8)
        return (m[0], m[1], m[2])
    }
    private static let monthNames = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
    private static let dayNames = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"]

    public static func parse(_ text: String) -> Int64? {
        if let fixdate = parseFixdate(text) { return fixdate }
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
        guard let day, let month, let year, clock.count == 3 else { return nil }
        return seconds(year: year, month: month, day: day, clock[0], clock[1], clock[2])
    }

    /// The IMF-fixdate form alone, in place (no allocation): the form every current server
    /// sends, parsed at each disk-cache hit (`Date`, `Last-Modified`, `Expires` of the stored
    /// head). Nil for anything not laid out exactly as `Sun, 06 Nov 1994 08:49:37 GMT`, which
    /// `parse` then reads the general way (with the same result for what both accept).
    static func parseFixdate(_ text: String) -> Int64? {
        var text = text
        return text.withUTF8 { b -> Int64? in
            guard b.count == 29, b[3] == UInt8(ascii: ","), b[4] == 32, b[7] == 32, b[11] == 32, b[16] == 32,
                b[19] == UInt8(ascii: ":"), b[22] == UInt8(ascii: ":"), b[25] == 32, b[26] == UInt8(ascii: "G"),
                b[27] == UInt8(ascii: "M"), b[28] == UInt8(ascii: "T"), !b[0..<3].contains(where: { $0 == 32 || $0 == 9 })
            else { return nil }
            func number(_ range: Range<Int>) -> Int? {
                var n = 0
                for i in range {
                    guard b[i] >= 48, b[i] <= 57 else { return nil }
                    n = n * 10 + Int(b[i] - 48)
                }
                return n
            }
            let name = (b[8] | 0x20, b[9] | 0x20, b[10] | 0x20)
            guard let day = number(5..<7), let year = number(12..<16), let hour = number(17..<19),
                let minute = number(20..<22), let second = number(23..<25),
                let month = monthBytes.firstIndex(where: { $0 == name })
            else { return nil }
            return seconds(year: year, month: month, day: day, hour, minute, second)
        }
    }

    /// The validated fields as seconds since the epoch (`timegm`), or nil out of range.
    private static func seconds(year: Int, month: Int, day: Int, _ hour: Int, _ minute: Int, _ second: Int) -> Int64? {
        guard (1...31).contains(day), year >= 1970, year < 10000, (0...23).contains(hour), (0...59).contains(minute),
            (0...60).contains(second)
        else { return nil }
        var tm = Glibc.tm()
        tm.tm_year = Int32(year - 1900)
        tm.tm_mon = Int32(month)
        tm.tm_mday = Int32(day)
        tm.tm_hour = Int32(hour)
        tm.tm_min = Int32(minute)
        tm.tm_sec = Int32(second)
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
