#if canImport(Glibc)
    import Glibc
#endif

/// Removes secrets from anything Sluice writes: URLs (userinfo, secret query parameters),
/// header values of credential fields, and — last line of defence — any occurrence of a
/// configured secret value in a finished log line.
public struct Redactor: Sendable {
    public static let replacement = "<redacted>"
    /// Fields whose values are never written (lower-case).
    public static let defaultHeaders: Set<String> = ["authorization", "proxy-authorization", "cookie", "set-cookie"]

    /// The secret values, longest first, each once.
    public let secretValues: [String]
    public var queryParameters: Set<String>
    public var headers: Set<String>
    /// `secretValues` as UTF-8, one after another, made once here: the search of every log
    /// line touches no `String` (bridging each value cost a retain and a release per line).
    /// Value `i` ends at `secretEnds[i]`.
    private let secretBytes: [UInt8]
    private let secretEnds: [Int]

    public init(
        secretValues: [String] = [], queryParameters: Set<String> = [],
        headers: Set<String> = Redactor.defaultHeaders
    ) {
        // Very short values would redact innocent text; a secret is at least 4 bytes long here.
        // A value configured twice (a token two policies share) is searched for once.
        var seen: Set<String> = []
        self.secretValues = secretValues.filter { $0.utf8.count >= 4 }.sorted { $0.count > $1.count }
            .filter { seen.insert($0).inserted }
        secretBytes = self.secretValues.flatMap(\.utf8)
        var end = 0
        secretEnds = self.secretValues.map {
            end += $0.utf8.count
            return end
        }
        self.queryParameters = queryParameters
        self.headers = headers
    }

    public func url(_ url: String) -> String {
        scrub(urlWithoutScrub(url))
    }

    /// Userinfo and secret query parameters removed; for text that is scrubbed as a whole later.
    public func urlWithoutScrub(_ url: String) -> String {
        var result = url
        var url = url
        // One pass over the bytes (memchr), not the generic `contains` of the UTF-8 view.
        let (hasAt, hasQuery) = url.withUTF8 { bytes -> (Bool, Bool) in
            guard let base = bytes.baseAddress else { return (false, false) }
            return (memchr(base, 0x40, bytes.count) != nil, memchr(base, 0x3F, bytes.count) != nil)
        }
        if hasAt {
            let parts = URLParts(url)
            if let at = parts.authority.firstIndex(of: "@") {
                let userinfo = parts.authority[..<at]
                if let range = result.firstRange(of: userinfo + "@") { result.removeSubrange(range) }
            }
        }
        if !queryParameters.isEmpty && hasQuery {
            result = QueryString.redacting(queryParameters, in: result, replacement: Self.replacement)
        }
        return result
    }

    public func headerValue(name: String, value: String) -> String {
        headers.contains(name.lowercased()) ? Self.replacement : scrub(value)
    }

    /// `text` with every configured secret value replaced. A byte search (`memmem`), since
    /// it runs over every log line.
    public func scrub(_ text: String) -> String {
        guard !secretValues.isEmpty else { return text }
        var out = text
        for secret in secretValues where Self.occurs(secret, in: out) {
            out = out.replacing(secret, with: Self.replacement)
        }
        return out
    }

    /// Whether any configured secret value occurs in `line` (false at once without secrets).
    public func occursSecret(in line: UnsafeBufferPointer<UInt8>) -> Bool {
        guard !secretEnds.isEmpty else { return false }
        return secretBytes.withUnsafeBufferPointer { values in
            var start = 0
            for end in secretEnds {
                if Self.occurs(UnsafeBufferPointer(rebasing: values[start..<end]), in: line) { return true }
                start = end
            }
            return false
        }
    }

    /// `line` (UTF-8) with every configured secret value replaced; the bytes as they are,
    /// without a copy, when none occurs (the common case).
    public func scrub(bytes line: [UInt8]) -> [UInt8] {
        let hit = line.withUnsafeBufferPointer { occursSecret(in: $0) }
        return hit ? Array(scrub(String(decoding: line, as: UTF8.self)).utf8) : line
    }

    static func occurs(_ needle: String, in haystack: String) -> Bool {
        var haystack = haystack
        var needle = needle
        return haystack.withUTF8 { h in
            needle.withUTF8 { n in occurs(n, in: h) }
        }
    }

    /// Whether `n` occurs in `h`: memchr for the first byte, memcmp for the rest (memmem is a
    /// GNU extension Swift's Glibc module does not show).
    static func occurs(_ n: UnsafeBufferPointer<UInt8>, in h: UnsafeBufferPointer<UInt8>) -> Bool {
        guard !n.isEmpty else { return true }
        guard n.count <= h.count, let hb = h.baseAddress, let nb = n.baseAddress else { return false }
        var i = 0
        let last = h.count - n.count
        let lastByte = nb[n.count - 1]
        while i <= last {
            guard let hit = memchr(hb + i, Int32(nb[0]), last - i + 1) else { return false }
            let at = UnsafeRawPointer(hit) - UnsafeRawPointer(hb)
            // The last byte first: most candidates fail there, without a call.
            if hb[at + n.count - 1] == lastByte && memcmp(hb + at, nb, n.count) == 0 { return true }
            i = at + 1
        }
        return false
    }
}
