/// A response as the cache keeps it, without its body (RFC 9111 §3): the status, the
/// end-to-end header fields, when it was requested and received (the wall clock, in seconds:
/// what the Age calculation of §4.2.3 needs), and the request fields its `Vary` names (its
/// secondary key, §4.1). `encode()` and `init?(bytes:)` make it the metadata a disk tier
/// stores next to the body.
///
/// Threading: a value type; any thread.
public struct CacheStoredResponse: Sendable, Equatable {
    public typealias Field = CacheFields.Field

    /// The request field a `Vary` names, lower-cased, and the value the stored request had
    /// (all its lines combined; nil when it had none).
    public struct VaryField: Sendable, Equatable {
        public var name: String
        public var value: String?
        public init(name: String, value: String?) {
            self.name = name
            self.value = value
        }
    }

    /// What the freshness rules read of the fields, parsed once when the fields are set
    /// (a hit then parses no date and no directive).
    public struct Parsed: Sendable {
        public var cacheControl = CacheControl()
        /// `Date`, `Age`, `Last-Modified` as numbers (nil: absent or invalid).
        public var date: Int64?
        public var age: Int64?
        public var lastModified: Int64?
        /// `Expires`: absent (nil), or its time (`.some(nil)` when invalid — not an HTTP-date,
        /// or more than one field line — which means already expired, RFC 9111 §5.3, §4.2.1).
        public var expires: Int64??

        init(_ fields: [Field]) {
            cacheControl = CacheControl(CacheFields.values("cache-control", in: fields))
            date = CacheFields.value("date", in: fields).flatMap(HTTPDate.parse)
            age = CacheFields.value("age", in: fields).flatMap { CacheControl.seconds($0) }
            lastModified = CacheFields.value("last-modified", in: fields).flatMap(HTTPDate.parse)
            // Combined, two field lines are two dates with a comma between: not a date.
            expires = CacheFields.combined("expires", in: fields).map { HTTPDate.parse($0) }
        }
    }

    public var status: Int
    public var fields: [Field] {
        didSet { parsed = Parsed(fields) }
    }
    public private(set) var parsed: Parsed
    /// When the request that got this response was sent, and when the response arrived
    /// (seconds since the epoch; `request_time` and `response_time` of RFC 9111 §4.2.3).
    public var requestTime: Int64
    public var responseTime: Int64
    /// The secondary key; `nil` when the response has `Vary: *` (never matches).
    public var vary: [VaryField]?
    /// The body's length in bytes, once known.
    public var bodyLength: Int64

    public init(
        status: Int, fields: [Field], requestTime: Int64, responseTime: Int64,
        vary: [VaryField]? = [], bodyLength: Int64 = 0
    ) {
        self.status = status
        self.fields = fields
        parsed = Parsed(fields)
        self.requestTime = requestTime
        self.responseTime = responseTime
        self.vary = vary
        self.bodyLength = bodyLength
    }

    /// Builds the entry for `fields` received for a request with `requestFields`: its
    /// secondary key is taken from the request now: the fields its `Vary` names, plus the
    /// policy's `key_request_headers` (`extraKeyFields`, lower-cased).
    public init(
        status: Int, fields: [Field], requestFields: [Field], requestTime: Int64, responseTime: Int64,
        extraKeyFields: [String] = []
    ) {
        var names = CacheFields.listElements(CacheFields.values("vary", in: fields)).map { $0.lowercased() }
        for extra in extraKeyFields where !names.contains(extra) { names.append(extra) }
        let vary: [VaryField]? =
            names.contains("*")
            ? nil
            : names.map { VaryField(name: $0, value: CacheFields.combined($0, in: requestFields)) }
        self.init(status: status, fields: fields, requestTime: requestTime, responseTime: responseTime, vary: vary)
    }

    public func value(_ name: String) -> String? { CacheFields.value(name, in: fields) }
    public var cacheControl: CacheControl { parsed.cacheControl }
    public var etag: String? { value("etag") }
    public var lastModified: String? { value("last-modified") }

    /// Whether this response's secondary key matches `requestFields` (§4.1): every field its
    /// `Vary` names has the same combined value, whitespace after commas normalized, field
    /// name case ignored; `Vary: *` never matches.
    public func varyMatches(_ requestFields: [Field]) -> Bool {
        guard let vary else { return false }
        for field in vary
        where Self.normalized(CacheFields.combined(field.name, in: requestFields)) != Self.normalized(field.value) {
            return false
        }
        return true
    }

    /// The secondary key as one string, the disk tier's variant: each field its `Vary` names
    /// as `name=value` (the value normalized as `varyMatches` compares it; `name` alone when
    /// the request had none), one per line; `""` without `Vary`, `"*"` for `Vary: *`. Two
    /// requests `varyMatches` treats alike give the same string.
    public var varyKey: String {
        guard let vary else { return "*" }
        return vary.map { field in
            Self.normalized(field.value).map { field.name.lowercased() + "=" + $0 } ?? field.name.lowercased()
        }.joined(separator: "\n")
    }

    private static func normalized(_ value: String?) -> String? {
        value.map { CacheFields.listElements([$0]).joined(separator: ",") }
    }

    /// The entry after a `304 Not Modified` that validated it (§3.2, §4.3.4): the 304's
    /// fields replace the stored ones of the same name, except the framing ones (a 304 has
    /// no body, its `Content-Length` says nothing about the stored one); the times become the
    /// revalidation's.
    public func updated(with notModified: [Field], requestTime: Int64, responseTime: Int64) -> CacheStoredResponse {
        let kept = Set(["content-length", "transfer-encoding", "content-encoding", "content-range"])
        let replacing = Set(notModified.map { $0.name.lowercased() }).subtracting(kept)
        var out = self
        out.fields =
            fields.filter { !replacing.contains($0.name.lowercased()) }
            + notModified.filter { replacing.contains($0.name.lowercased()) }
        out.requestTime = requestTime
        out.responseTime = responseTime
        return out
    }

    // MARK: encoding

    /// Format version; `init?(bytes:)` refuses any other.
    static let encodingVersion: UInt8 = 1

    /// `[version][status u16][requestTime i64][responseTime i64][bodyLength i64]
    /// [field count u32] {name, value}… [vary flag u8: 0 = '*', 1 = list][vary count u32]
    /// {name, present u8, value}…`, integers little-endian, strings as u32 length + UTF-8.
    public func encode() -> [UInt8] {
        var out: [UInt8] = [Self.encodingVersion]
        func int(_ v: UInt64, _ bytes: Int) { for i in 0..<bytes { out.append(UInt8(truncatingIfNeeded: v >> (8 * UInt64(i)))) } }
        func string(_ s: String) {
            int(UInt64(s.utf8.count), 4)
            out.append(contentsOf: s.utf8)
        }
        int(UInt64(status), 2)
        int(UInt64(bitPattern: requestTime), 8)
        int(UInt64(bitPattern: responseTime), 8)
        int(UInt64(bitPattern: bodyLength), 8)
        int(UInt64(fields.count), 4)
        for f in fields {
            string(f.name)
            string(f.value)
        }
        out.append(vary == nil ? 0 : 1)
        int(UInt64(vary?.count ?? 0), 4)
        for v in vary ?? [] {
            string(v.name)
            out.append(v.value == nil ? 0 : 1)
            string(v.value ?? "")
        }
        return out
    }

    /// nil for bytes that are not a whole entry of this version.
    public init?(bytes: [UInt8]) {
        var i = 0
        func int(_ n: Int) -> UInt64? {
            guard i + n <= bytes.count else { return nil }
            var v: UInt64 = 0
            for k in 0..<n { v |= UInt64(bytes[i + k]) << (8 * UInt64(k)) }
            i += n
            return v
        }
        func string() -> String? {
            guard let n = int(4), n <= UInt64(bytes.count - i) else { return nil }
            defer { i += Int(n) }
            return String(decoding: bytes[i..<(i + Int(n))], as: UTF8.self)
        }
        guard let version = int(1), version == UInt64(Self.encodingVersion),
            let status = int(2), let rq = int(8), let rs = int(8), let length = int(8),
            let count = int(4), count <= UInt64(bytes.count)
        else { return nil }
        var fields: [Field] = []
        for _ in 0..<count {
            guard let name = string(), let value = string() else { return nil }
            fields.append((name, value))
        }
        guard let flag = int(1), let varyCount = int(4), varyCount <= UInt64(bytes.count) else { return nil }
        var vary: [VaryField] = []
        for _ in 0..<varyCount {
            guard let name = string(), let present = int(1), let value = string() else { return nil }
            vary.append(VaryField(name: name, value: present == 1 ? value : nil))
        }
        guard i == bytes.count else { return nil }
        self.init(
            status: Int(status), fields: fields, requestTime: Int64(bitPattern: rq), responseTime: Int64(bitPattern: rs),
            vary: flag == 0 ? nil : vary, bodyLength: Int64(bitPattern: length))
    }

    public static func == (a: CacheStoredResponse, b: CacheStoredResponse) -> Bool {
        a.status == b.status && a.requestTime == b.requestTime && a.responseTime == b.responseTime
            && a.bodyLength == b.bodyLength && a.vary == b.vary && a.fields.count == b.fields.count
            && zip(a.fields, b.fields).allSatisfy { $0.name == $1.name && $0.value == $1.value }
    }
}
