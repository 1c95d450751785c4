/// Which stored responses an unsafe request invalidates (RFC 9111 §4.4): after a method other
/// than `GET`, `HEAD`, `OPTIONS` or `TRACE` gets a non-error (2xx or 3xx) response, the
/// target URI, and the URIs in `Location` and `Content-Location` when they have the same
/// origin (a relative reference is resolved against the target first).
///
/// Threading: stateless; any thread.
public enum CacheInvalidation {
    public static let safeMethods: Set<String> = ["GET", "HEAD", "OPTIONS", "TRACE"]

    /// The URLs (cache keys) to drop; empty when nothing is invalidated.
    public static func targets(
        method: String, status: Int, url: String, location: String?,
        contentLocation: String?
    ) -> [String] {
        guard !safeMethods.contains(method), (200...399).contains(status) else { return [] }
        var out = [url]
        let origin = Self.origin(of: url)
        for reference in [location, contentLocation].compactMap({ $0 }) {
            if let resolved = resolve(reference, against: url), let origin, Self.origin(of: resolved) == origin,
                !out.contains(resolved)
            {
                out.append(resolved)
            }
        }
        return out
    }

    /// `scheme://authority`, lower-cased, of an absolute http(s) URL.
    static func origin(of url: String) -> String? {
        guard let schemeEnd = url.firstRange(of: "://") else { return nil }
        let rest = url[schemeEnd.upperBound...]
        let authority = rest.prefix { $0 != "/" && $0 != "?" && $0 != "#" }
        return (url[..<schemeEnd.lowerBound] + "://" + authority).lowercased()
    }

    /// A reference resolved against `base` (RFC 3986 §5.2, for the forms a Location takes:
    /// absolute, network-path, absolute-path, relative-path); fragments dropped.
    static func resolve(_ reference: String, against base: String) -> String? {
        let ref = String(CacheFields.trim(reference).prefix { $0 != "#" })
        guard !ref.isEmpty, let origin = origin(of: base) else { return nil }
        let lower = ref.lowercased()
        if lower.hasPrefix("http://") || lower.hasPrefix("https://") { return ref }
        if ref.hasPrefix("//") { return String(base.prefix { $0 != ":" }) + ":" + ref }
        if ref.hasPrefix("/") { return origin + ref }
        let basePath = String(base.dropFirst(origin.count).prefix { $0 != "?" })
        let directory = basePath.lastIndex(of: "/").map { String(basePath[...$0]) } ?? "/"
        return origin + directory + ref
    }
}
