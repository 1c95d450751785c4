/// Sizes and durations with units, as written in Sluice's YAML.
public enum Units {
    /// `1048576`, `512B`, `8KiB`, `10MiB`, `1GiB` (binary) or `8KB`, `10MB`, `1GB` (decimal).
    public static func bytes(_ text: String) -> Int64? {
        let units: [(String, Int64)] = [
            ("KiB", 1 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30), ("TiB", 1 << 40),
            ("KB", 1000), ("MB", 1_000_000), ("GB", 1_000_000_000), ("B", 1),
        ]
        return scaled(text, units: units)
    }

    /// `500ms`, `30s`, `5m`, `1h`, as milliseconds.
    public static func milliseconds(_ text: String) -> Int? {
        let units: [(String, Int64)] = [("ms", 1), ("s", 1000), ("m", 60_000), ("h", 3_600_000)]
        guard text.last.map({ !$0.isNumber }) ?? false, let v = scaled(text, units: units), v <= Int64(Int32.max) else {
            return nil
        }
        return Int(v)
    }

    private static func scaled(_ text: String, units: [(String, Int64)]) -> Int64? {
        var number = Substring(text.trimmingWhitespace())
        var factor: Int64 = 1
        for (suffix, f) in units where number.hasSuffix(suffix) {
            number = number.dropLast(suffix.count)
            factor = f
            break
        }
        number = Substring(String(number).trimmingWhitespace())
        guard !number.isEmpty, number.utf8.allSatisfy({ $0 >= 48 && $0 <= 57 }), let n = Int64(number) else { return nil }
        let (product, overflow) = n.multipliedReportingOverflow(by: factor)
        return overflow ? nil : product
    }
}

/// Suggestions for misspelt keys: the known key within a small edit distance.
public enum DidYouMean {
    public static func closest(to word: String, among candidates: [String]) -> String? {
        var best: (String, Int)?
        for candidate in candidates {
            let d = distance(word.lowercased(), candidate)
            if d <= max(2, candidate.count / 3), d < (best?.1 ?? Int.max) { best = (candidate, d) }
        }
        return best?.0
    }

    /// Levenshtein distance.
    static func distance(_ a: String, _ b: String) -> Int {
        let a = Array(a.utf8)
        let b = Array(b.utf8)
        if a.isEmpty { return b.count }
        if b.isEmpty { return a.count }
        var previous = Array(0...b.count)
        var current = [Int](repeating: 0, count: b.count + 1)
        for i in 1...a.count {
            current[0] = i
            for j in 1...b.count {
                current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1))
            }
            swap(&previous, &current)
        }
        return previous[b.count]
    }
}
