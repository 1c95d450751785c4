/// The directives of `Cache-Control` field lines (RFC 9111 §5.2), request or response, as a
/// value. Parsing is lenient where RFC 9111 asks it to be and conservative where a wrong
/// guess would serve something the origin did not allow:
///
/// - directive names are case-insensitive; unknown directives are ignored (§5.2.3);
/// - the first occurrence of a duplicated directive wins (§4.2.1);
/// - a delta-seconds value that is not digits makes `max-age`/`s-maxage` 0 (the response is
///   stale at once) and is ignored elsewhere; values over 2^31 are capped to 2^31 (§1.2.2);
/// - the qualified forms `no-cache="field"` and `private="field"` are treated as their
///   unqualified forms (revalidate every time; do not store), which RFC 9111 allows.
///
/// Threading: a value type; any thread.
public struct CacheControl: Sendable, Equatable {
    /// `max-age`, `s-maxage` and friends never exceed this (RFC 9111 §1.2.2: 2^31).
    public static let maxDeltaSeconds: Int64 = 2_147_483_648

    public var noStore = false
    public var noCache = false
    public var isPrivate = false
    public var isPublic = false
    public var maxAge: Int64?
    public var sMaxAge: Int64?
    public var mustRevalidate = false
    public var proxyRevalidate = false
    /// `max-stale` on a request; a bare `max-stale` (any staleness) is `maxDeltaSeconds`.
    public var maxStale: Int64?
    public var minFresh: Int64?
    public var onlyIfCached = false
    public var staleWhileRevalidate: Int64?
    public var staleIfError: Int64?
    public var noTransform = false

    public init() {}

    /// Parses every `Cache-Control` field line's value, in order.
    public init(_ values: [String]) {
        var seen: Set<String> = []
        for value in values {
            for (name, argument) in Self.directives(value) where seen.insert(name).inserted {
                apply(name, argument)
            }
        }
    }

    public init(_ value: String?) { self.init(value.map { [$0] } ?? []) }

    private mutating func apply(_ name: String, _ argument: String?) {
        switch name {
        case "no-store": noStore = true
        case "no-cache": noCache = true
        case "private": isPrivate = true
        case "public": isPublic = true
        case "must-revalidate": mustRevalidate = true
        case "proxy-revalidate": proxyRevalidate = true
        case "only-if-cached": onlyIfCached = true
        case "no-transform": noTransform = true
        case "max-age": maxAge = Self.seconds(argument) ?? 0
        case "s-maxage": sMaxAge = Self.seconds(argument) ?? 0
        case "max-stale": maxStale = argument == nil ? Self.maxDeltaSeconds : Self.seconds(argument)
        case "min-fresh": minFresh = Self.seconds(argument)
        case "stale-while-revalidate": staleWhileRevalidate = Self.seconds(argument)
        case "stale-if-error": staleIfError = Self.seconds(argument)
        default: break
        }
    }

    /// delta-seconds (RFC 9111 §1.2.2): digits only, capped at 2^31.
    static func seconds(_ text: String?) -> Int64? {
        guard let text, !text.isEmpty, text.utf8.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }) else { return nil }
        guard text.utf8.count <= 10, let n = Int64(text) else { return maxDeltaSeconds }
        return min(n, maxDeltaSeconds)
    }

    /// The comma-separated `name[=token|quoted-string]` elements of one field value, names
    /// lower-cased, quotes removed. Commas inside a quoted string do not split.
    static func directives(_ value: String) -> [(String, String?)] {
        var out: [(String, String?)] = []
        var element: [UInt8] = []
        var quoted = false
        var escaped = false
        func flush() {
            let text = String(decoding: element, as: UTF8.self)
            element.removeAll(keepingCapacity: true)
            let trimmed = CacheFields.trim(text)
            guard !trimmed.isEmpty else { return }
            if let eq = trimmed.firstIndex(of: "=") {
                let name = CacheFields.trim(String(trimmed[..<eq])).lowercased()
                var argument = CacheFields.trim(String(trimmed[trimmed.index(after: eq)...]))
                if argument.count >= 2, argument.hasPrefix("\""), argument.hasSuffix("\"") {
                    argument = String(argument.dropFirst().dropLast()).replacingEscapes()
                }
                out.append((name, argument))
            } else {
                out.append((trimmed.lowercased(), nil))
            }
        }
        for b in value.utf8 {
            if quoted {
                if escaped { escaped = false } else if b == 0x5C { escaped = true } else if b == 0x22 { quoted = false }
                element.append(b)
            } else if b == 0x22 {
                quoted = true
                element.append(b)
            } else if b == 0x2C {
                flush()
            } else {
                element.append(b)
            }
        }
        flush()
        return out
    }
}

extension String {
    /// A quoted-string's content with its quoted-pairs (`\x`) resolved.
    fileprivate func replacingEscapes() -> String {
        guard contains("\\") else { return self }
        var out = ""
        var escaped = false
        for c in self {
            if escaped {
                out.append(c)
                escaped = false
            } else if c == "\\" {
                escaped = true
            } else {
                out.append(c)
            }
        }
        return out
    }
}

/// Field helpers the cache rules share: a field list as `(name, value)` pairs (names as
/// received; compared case-insensitively), comma-list splitting, trimming.
///
/// Threading: stateless; any thread.
public enum CacheFields {
    public typealias Field = (name: String, value: String)

    /// Every value of the fields named `name` (case-insensitive), in order.
    public static func values(_ name: String, in fields: [Field]) -> [String] {
        fields.compactMap { $0.name.caseInsensitiveEquals(name) ? $0.value : nil }
    }

    /// The first value named `name`, trimmed.
    public static func value(_ name: String, in fields: [Field]) -> String? {
        fields.first { $0.name.caseInsensitiveEquals(name) }.map { trim($0.value) }
    }

    /// Every field value named `name` joined as one comma list (RFC 9110 §5.3), nil if absent.
    public static func combined(_ name: String, in fields: [Field]) -> String? {
        let all = values(name, in: fields)
        return all.isEmpty ? nil : all.map(trim).joined(separator: ", ")
    }

    /// The elements of comma lists, trimmed, empty ones dropped.
    public static func listElements(_ values: [String]) -> [String] {
        values.flatMap { $0.split(separator: ",").map { trim(String($0)) } }.filter { !$0.isEmpty }
    }

    static func trim(_ s: String) -> String {
        var s = Substring(s)
        while let c = s.first, c == " " || c == "\t" { s = s.dropFirst() }
        while let c = s.last, c == " " || c == "\t" { s = s.dropLast() }
        return String(s)
    }
}

extension String {
    /// ASCII case-insensitive equality (field names).
    func caseInsensitiveEquals(_ other: String) -> Bool {
        guard utf8.count == other.utf8.count else { return false }
        for (a, b) in zip(utf8, other.utf8) {
            let la = a >= 0x41 && a <= 0x5A ? a | 0x20 : a
            let lb = b >= 0x41 && b <= 0x5A ? b | 0x20 : b
            if la != lb { return false }
        }
        return true
    }
}
