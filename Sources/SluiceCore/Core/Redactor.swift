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
    /// The longest value's UTF-8 length: how far past a cut a secret can reach.
    public let longestSecretBytes: Int
    public var queryParameters: Set<String>
    public var headers: Set<String>
    /// `secretValues` as UTF-8, one after another, made once here: the search of every log
    /// line touches no `String` (bridging each value cost a retain and a release per line).
    private let secretBytes: [UInt8]
    /// Where each value lies in `secretBytes`, and which of its bytes the search looks for.
    private let needles: [Needle]

    /// A secret value's place in `secretBytes` and the offset of its byte the search looks
    /// for first (memchr) before it compares the rest: the byte least common in a typical
    /// access-log line (`typicalLine`), so that the search stops at few places.
    private struct Needle: Sendable {
        var start: Int
        var count: Int
        var probe: Int
    }

    public init(
        secretValues: [String] = [], queryParameters: Set<String> = [],
        headers: Set<String> = Redactor.defaultHeaders
    ) {
        // Very short values would redact innocent text; a secret is at least 4 bytes long here.
        // A value configured twice (a token two policies share) is searched for once.
        var seen: Set<String> = []
        self.secretValues = secretValues.filter { $0.utf8.count >= 4 }.sorted { $0.count > $1.count }
            .filter { seen.insert($0).inserted }
        var bytes: [UInt8] = []
        let counts = Self.typicalLineByteCounts
        needles = self.secretValues.map { value in
            let utf8 = Array(value.utf8)
            let probe = utf8.indices.min { counts[Int(utf8[$0])] < counts[Int(utf8[$1])] } ?? 0
            defer { bytes += utf8 }
            return Needle(start: bytes.count, count: utf8.count, probe: probe)
        }
        secretBytes = bytes
        longestSecretBytes = needles.map(\.count).max() ?? 0
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
        let redactsQuery = !queryParameters.isEmpty
        // One pass over the bytes (memchr), not the generic `contains` of the UTF-8 view; none
        // for a query when no parameter is redacted.
        let (hasAt, hasQuery) = url.withUTF8 { bytes -> (Bool, Bool) in
            guard let base = bytes.baseAddress else { return (false, false) }
            return (memchr(base, 0x40, bytes.count) != nil, redactsQuery && memchr(base, 0x3F, bytes.count) != nil)
        }
        if hasAt {
            let parts = URLParts(url)
            if let at = parts.authority.firstIndex(of: "@") {
                let userinfo = parts.authority[..<at]
                if let range = result.firstRange(of: userinfo + "@") { result.removeSubrange(range) }
            }
        }
        if hasQuery {
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

    /// The first `limit` bytes of `bytes` as text (with "…" when cut), its secrets redacted:
    /// the cut is placed in `bytes` itself, moved past any secret it would split, and what
    /// lies before it is redacted — so no secret shows in part, however many others the text
    /// holds (each `<redacted>` is not as long as its secret: a cut made in the redacted text
    /// would let the bytes after it slide in). The text is then cut at `limit` bytes (at a
    /// character's start): a cut in a `<redacted>` shows nothing.
    public func redactedPrefix(_ bytes: UnsafeRawBufferPointer, _ limit: Int) -> String {
        var cut = min(bytes.count, limit)
        if cut < bytes.count, !needles.isEmpty {
            // Secrets that start before the cut and end past it push it to their end, until
            // none does (a secret is found within `longestSecretBytes` of the cut).
            secretBytes.withUnsafeBufferPointer { values in
                var moved = true
                while moved && cut < bytes.count {
                    moved = false
                    let from = max(0, cut - longestSecretBytes + 1)
                    for needle in needles {
                        let value = UnsafeRawBufferPointer(
                            rebasing: UnsafeRawBufferPointer(values)[needle.start..<needle.start + needle.count])
                        var s = from
                        while s < cut, s + needle.count <= bytes.count {
                            if s + needle.count > cut, memcmp(bytes.baseAddress! + s, value.baseAddress!, needle.count) == 0 {
                                cut = s + needle.count
                                moved = true
                                break
                            }
                            s += 1
                        }
                    }
                }
            }
        }
        while cut > 0, cut < bytes.count, bytes[cut] & 0xC0 == 0x80 { cut -= 1 }  // at a character's start
        let text = scrub(String(decoding: UnsafeRawBufferPointer(rebasing: bytes[0..<cut]), as: UTF8.self))
        guard cut < bytes.count || text.utf8.count > limit else { return text }
        let utf8 = Array(text.utf8)
        var end = min(limit, utf8.count)
        while end > 0, end < utf8.count, utf8[end] & 0xC0 == 0x80 { end -= 1 }  // a character's start
        return String(decoding: utf8[0..<end], as: UTF8.self) + "…"
    }

    /// Whether any configured secret value occurs in `line` (false at once without secrets).
    public func occursSecret(in line: UnsafeBufferPointer<UInt8>) -> Bool {
        guard !needles.isEmpty else { return false }
        return secretBytes.withUnsafeBufferPointer { values in
            needles.contains { needle in
                let value = UnsafeBufferPointer(rebasing: values[needle.start..<needle.start + needle.count])
                return Self.occurs(value, probe: needle.probe, in: line)
            }
        }
    }

    /// An access-log line as most requests write it, for `Needle.probe`: the bytes it is
    /// made of most (digits, the keys' letters, JSON's punctuation) are the last a secret is
    /// searched by.
    private static let typicalLine =
        #"{"time":"2026-11-28T12:47:11.885Z","id":281474976728093,"client":"127.0.0.1:47036","user":null,"#
        + #""request_id":"32565c38-100000000441d","method":"GET","url":"http://127.0.0.1:31080/1k","#
        + #""policy":"default","status":200,"bytes_in":0,"bytes_out":1024,"attempts":1,"redirects":0,"#
        + #""timings":{"dns":0.000,"connect":0.001,"tls":0.000,"first_byte":0.187,"total":0.188},"#
        + #""upstream_protocol":"HTTP/1.1","upstream_connection":"reused","upstream_engine":"native","#
        + #""retries":[],"retry_stopped":null,"validation":null,"outcome":"ok","error":null}"#

    /// How often each byte occurs in `typicalLine`.
    private static let typicalLineByteCounts: [Int] = typicalLine.utf8.reduce(into: Array(repeating: 0, count: 256)) {
        $0[Int($1)] += 1
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

    /// Whether `n` occurs in `h`: memchr for its byte at offset `probe`, then its first and
    /// last bytes, then memcmp for the whole (memmem is a GNU extension Swift's Glibc module
    /// does not show).
    static func occurs(_ n: UnsafeBufferPointer<UInt8>, probe: Int = 0, in h: UnsafeBufferPointer<UInt8>) -> Bool {
        guard !n.isEmpty else { return true }
        guard n.count <= h.count, let hb = h.baseAddress, let nb = n.baseAddress else { return false }
        let last = h.count - n.count  // the last place a match may start
        let probeByte = Int32(nb[probe])
        var start = 0
        while start <= last {
            guard let hit = memchr(hb + start + probe, probeByte, last - start + 1) else { return false }
            let at = UnsafeRawPointer(hit) - UnsafeRawPointer(hb + probe)
            if hb[at] == nb[0] && hb[at + n.count - 1] == nb[n.count - 1] && memcmp(hb + at, nb, n.count) == 0 {
                return true
            }
            start = at + 1
        }
        return false
    }
}
