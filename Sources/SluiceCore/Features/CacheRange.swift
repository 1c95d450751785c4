/// A `Range` request answered from a complete stored response (RFC 9110 §14): one byte range
/// (`bytes=0-99`, `bytes=100-`, `bytes=-100`) is served `206` with `Content-Range`; a range
/// that starts past the end is `416` with `Content-Range: bytes */LENGTH`. A syntactically
/// invalid `Range`, another unit, or several ranges are ignored (the whole response is
/// served `200`, which RFC 9110 allows). Applies only to a stored `200`. With `If-Range`
/// (§13.1.5) the range is served only when the validator matches the stored response
/// (`ifRangeHolds`); otherwise the whole response is (the client's copy is another one).
///
/// Threading: stateless; any thread.
public enum CacheRange: Sendable, Equatable {
    /// Serve the whole response.
    case full
    /// Serve these bytes (inclusive) with `206`.
    case partial(first: Int64, last: Int64)
    /// `416 Range Not Satisfiable`.
    case unsatisfiable

    public static func evaluate(_ value: String?, length: Int64) -> CacheRange {
        guard let value else { return .full }
        let trimmed = CacheFields.trim(value)
        guard trimmed.lowercased().hasPrefix("bytes=") else { return .full }
        let spec = CacheFields.trim(String(trimmed.dropFirst(6)))
        guard !spec.contains(","), let dash = spec.firstIndex(of: "-") else { return .full }
        let firstText = CacheFields.trim(String(spec[..<dash]))
        let lastText = CacheFields.trim(String(spec[spec.index(after: dash)...]))
        func number(_ s: String) -> Int64? {
            guard !s.isEmpty, s.utf8.count <= 18, s.utf8.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }) else { return nil }
            return Int64(s)
        }
        if firstText.isEmpty {
            // suffix-range: the last N bytes.
            guard let suffix = number(lastText) else { return .full }
            guard suffix > 0, length > 0 else { return .unsatisfiable }
            return .partial(first: max(0, length - suffix), last: length - 1)
        }
        guard let first = number(firstText) else { return .full }
        var last = length - 1
        if !lastText.isEmpty {
            guard let l = number(lastText), l >= first else { return .full }  // invalid: ignored
            last = min(l, length - 1)
        }
        guard first < length else { return .unsatisfiable }
        return .partial(first: first, last: last)
    }

    /// Whether `If-Range: value` matches the stored response (RFC 9110 §13.1.5): an entity
    /// tag by strong comparison (a weak tag never matches), or an HTTP-date equal to its
    /// `Last-Modified` when that is a strong validator — its `Date` at least a second later
    /// (§8.8.2.2). Anything else, an unparsable value included, does not match.
    public static func ifRangeHolds(_ value: String, etag: String?, lastModified: Int64?, date: Int64?) -> Bool {
        let v = CacheFields.trim(value)
        if v.hasPrefix("\"") {
            guard let etag = etag.map(CacheFields.trim), etag.hasPrefix("\"") else { return false }
            return etag == v
        }
        if v.hasPrefix("W/") { return false }
        guard let when = HTTPDate.parse(v), let lastModified, let date else { return false }
        return when == lastModified && date - lastModified >= 1
    }
}
