/// `resume:` — resumable downloads (docs/configuration.md, "Resumable downloads"). When the
/// origin's connection breaks in the middle of a `200` to a `GET`, the client already has the
/// head and `offset` bytes of the body; if the response carried a strong validator, Sluice
/// asks the origin for the rest (`Range: bytes=offset-` with `If-Range: validator`) and
/// streams it on, so the client receives one complete, byte-exact body. Only a `206` whose
/// `Content-Range` starts at `offset` (and ends where the body ends), carrying the same
/// validator, continues the body; anything else — a `200` (the representation changed), a
/// range elsewhere, another validator — ends the client's response incomplete, as a break
/// did before: two representations are never spliced.
///
/// On by default (`resume: false` in a policy turns it off), also for policies without a
/// `retry` section: up to `defaultLimit` (3) resumes per response with `RetryPolicy`'s
/// default backoff (0.5 s, 1 s, 2 s), or the policy's `retry.limit` and backoff.
///
/// `DownloadResumption` is the state of one response: events in (`broke(at:)`, `answered`),
/// decisions out; no clock (the caller waits the delay it is given), no sockets.
///
/// Threading: value types, owned by one exchange.
public enum Resume {
    /// Resumes per response without a `retry` section (3).
    public static let defaultLimit = 3

    /// The `If-Range` validator a response may be resumed with (RFC 9110 §13.1.5): its
    /// `ETag` when strong; else its `Last-Modified` when that is a strong validator (the
    /// response's `Date` at least one second later, §8.8.2.2) and there is no `ETag` at all, as
    /// the origin sent it; else nil (no resume: a weak validator cannot tell one
    /// representation's bytes from another's).
    public static func validator(etag: String?, lastModified: String?, date: String?) -> String? {
        if let etag = etag.map(CacheFields.trim) {
            // A strong tag; a weak one rules the date out too (the client "has an entity tag").
            return etag.hasPrefix("\"") && etag.count >= 2 && etag.hasSuffix("\"") ? etag : nil
        }
        guard let lastModified = lastModified.map(CacheFields.trim),
            let modified = HTTPDate.parse(lastModified), let date = date.flatMap(HTTPDate.parse),
            date - modified >= 1
        else { return nil }
        return lastModified
    }

    /// `Content-Range: bytes FIRST-LAST/TOTAL` (TOTAL may be `*`): nil when malformed.
    public static func parseContentRange(_ value: String) -> (first: Int64, last: Int64, total: Int64?)? {
        let v = CacheFields.trim(value)
        guard v.lowercased().hasPrefix("bytes ") else { return nil }
        let spec = CacheFields.trim(String(v.dropFirst(6)))
        guard let dash = spec.firstIndex(of: "-"), let slash = spec.firstIndex(of: "/"), dash < slash else { return nil }
        func number(_ s: Substring) -> Int64? {
            guard !s.isEmpty, s.utf8.count <= 18, s.utf8.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }) else { return nil }
            return Int64(s)
        }
        guard let first = number(spec[..<dash]), let last = number(spec[spec.index(after: dash)..<slash]), last >= first
        else { return nil }
        let totalText = spec[spec.index(after: slash)...]
        if totalText == "*" { return (first, last, nil) }
        guard let total = number(totalText), last < total else { return nil }
        return (first, last, total)
    }
}

/// One response's resumption (see `Resume`): created when a `200` to a `GET` with a strong
/// validator starts streaming to its client; told each break and each continuation's answer.
public struct DownloadResumption: Sendable, Equatable {
    public enum Decision: Sendable, Equatable {
        /// Wait `delay` ms, then ask for the rest with these fields (`Range`, `If-Range`).
        case resume(delay: Int, fields: [(name: String, value: String)])
        /// The response ends incomplete: why (for the access log).
        case giveUp(String)

        public static func == (a: Decision, b: Decision) -> Bool {
            switch (a, b) {
            case (.resume(let d1, let f1), .resume(let d2, let f2)):
                return d1 == d2 && f1.map { "\($0.name): \($0.value)" } == f2.map { "\($0.name): \($0.value)" }
            case (.giveUp(let r1), .giveUp(let r2)): return r1 == r2
            default: return false
            }
        }
    }

    /// The `If-Range` value.
    public let validator: String
    /// The body's whole length when the first response announced it.
    public let total: Int64?
    public let limit: Int
    /// The backoff: the `retry` policy's, or the default one.
    public let backoff: RetryPolicy
    /// The body offsets at which the body was resumed (one per resume asked for).
    public private(set) var offsets: [Int64] = []
    /// The offsets of the resumes whose answer carried the body on.
    public private(set) var acceptedOffsets: [Int64] = []

    /// A resumption for a response with `validator`, whose body is `total` bytes when known,
    /// under the host's `retry` policy (nil: `Resume.defaultLimit` with the default backoff).
    public init(validator: String, total: Int64?, retry: RetryPolicy?) {
        self.validator = validator
        self.total = total
        limit = retry?.limit ?? Resume.defaultLimit
        backoff = retry ?? RetryPolicy()
    }

    /// The upstream broke after `offset` body bytes reached the client.
    public mutating func broke(at offset: Int64) -> Decision {
        guard offsets.count < limit else { return .giveUp("resume limit (\(limit)) reached") }
        if let total, offset >= total { return .giveUp("the body was complete") }
        let delay = backoff.backoff(attempt: offsets.count)
        offsets.append(offset)
        return .resume(delay: delay, fields: [("Range", "bytes=\(offset)-"), ("If-Range", validator)])
    }

    /// Judges a continuation's head: nil when it carries the body on from the last offset
    /// (a `206` for the rest of the same representation), else why it cannot.
    /// `contentLength` is the 206's `Content-Length` (nil when it has none, or is chunked): it
    /// must announce exactly the range, so that the body can neither run past the client's
    /// length nor end short of it unnoticed.
    public mutating func answered(
        status: Int, contentRange: String?, contentLength: String?, etag: String?, lastModified: String?
    ) -> String? {
        guard let offset = offsets.last else { return "no resume was asked for" }
        guard status == 206 else {
            return status == 200
                ? "the origin sent the whole body again (200): the representation changed"
                : "the origin answered \(status) to the resume"
        }
        guard let range = contentRange.flatMap(Resume.parseContentRange) else {
            return "the resume's 206 has no valid Content-Range"
        }
        guard range.first == offset else { return "the resume's 206 starts at \(range.first), not \(offset)" }
        guard contentLength.flatMap({ Int64(CacheFields.trim($0)) }) == range.last - range.first + 1 else {
            return "the resume's 206 does not announce the range's length"
        }
        if let total {
            guard range.total == total, range.last == total - 1 else {
                return "the resume's 206 is not the rest of the \(total)-byte body"
            }
        } else if let whole = range.total, range.last != whole - 1 {
            return "the resume's 206 is not the rest of the body"
        }
        // The same representation: the validator the If-Range named, when the 206 repeats it.
        let sent = validator.hasPrefix("\"") ? etag.map(CacheFields.trim) : lastModified.map(CacheFields.trim)
        if let sent, sent != validator { return "the resume's 206 carries another validator (\(sent))" }
        acceptedOffsets.append(offset)
        return nil
    }
}
