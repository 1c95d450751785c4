/// What the cache does with a request, given what it holds for its URL (RFC 9111 §4):
/// events in (the request's method and fields, the stored variants, the time), a decision
/// out. Performed by the exchange; unit-tested without sockets.
///
/// In order: a method other than `GET`/`HEAD`, or a request the cache does not answer in this
/// version (`If-Match`, `If-Unmodified-Since`), is forwarded (`bypass`);
/// `no-store` in the request is forwarded (`request`); no stored response for the URL is a
/// `uri-miss`, none whose `Vary` matches a `vary-miss` (both `504` with `only-if-cached`);
/// the selected response (the most recent matching one, §4.1) is served when fresh and
/// nothing asks for validation (response `no-cache`, request `no-cache`, `max-age`,
/// `min-fresh`); a stale one is served when the request's `max-stale` allows it and the
/// response has no `must-revalidate`, `proxy-revalidate` or `s-maxage` (§4.2.4, §5.2.2.2);
/// a stale one within the response's `stale-while-revalidate` window (RFC 5861 §3) is
/// served at once while one background revalidation runs (`serveStale`), under the same
/// conditions and unless the request's own `max-stale` is smaller than its staleness;
/// otherwise it is revalidated with its validators (§4.3.1), or `504` with `only-if-cached`.
/// A selected response in `outdated` (an `https` entry stored under trust settings a reload
/// replaced) is never served without validation: it is revalidated (reason `stale`).
/// A response served from the cache answers the client's own `If-None-Match` or
/// `If-Modified-Since` with `304` when it matches (§4.3.2, RFC 9110 §13.2.2).
///
/// Threading: stateless; any thread.
public enum CacheLookup {
    /// RFC 9211 `fwd` reasons.
    public enum ForwardReason: String, Sendable, Equatable {
        case bypass, method, uriMiss = "uri-miss", varyMiss = "vary-miss", request, stale
    }

    public struct Hit: Sendable, Equatable {
        /// The index of the selected variant in the candidates.
        public var variant: Int
        /// The `Age` to send (§4.2.3).
        public var age: Int64
        /// Freshness left, in seconds (negative when served stale); RFC 9211 `ttl`.
        public var ttl: Int64
        /// The client's conditional request matched: answer `304`.
        public var notModified: Bool
    }

    public enum Decision: Sendable, Equatable {
        case serve(Hit)
        /// Serve `hit` (stale, `ttl` negative) now, and revalidate it in the background with
        /// `conditional` (RFC 5861 `stale-while-revalidate`).
        case serveStale(Hit, conditional: [Validator])
        /// Validate `variant` with the origin, sending `conditional` (empty: no validator,
        /// so an unconditional request that replaces it).
        case revalidate(variant: Int, conditional: [Validator], reason: ForwardReason)
        case forward(ForwardReason)
        /// `only-if-cached` and nothing usable: `504` (`ProxyError.onlyIfCachedMiss`).
        case onlyIfCachedMiss

        /// Nothing stored answers or is validated: a URL or `Vary` miss, or `only-if-cached`'s
        /// `504` (a tier holding only some of the store may then look at the next one).
        public var missesTheStore: Bool {
            switch self {
            case .forward(let reason): return reason == .uriMiss || reason == .varyMiss
            case .onlyIfCachedMiss: return true
            default: return false
            }
        }

        /// The candidate served or validated, if any.
        public var variant: Int? {
            switch self {
            case .serve(let hit), .serveStale(let hit, _): return hit.variant
            case .revalidate(let variant, _, _): return variant
            case .forward, .onlyIfCachedMiss: return nil
            }
        }
    }

    public enum Validator: Sendable, Equatable {
        case ifNoneMatch(String)
        case ifModifiedSince(String)
        public var name: String {
            switch self {
            case .ifNoneMatch: return "If-None-Match"
            case .ifModifiedSince: return "If-Modified-Since"
            }
        }
        public var value: String {
            switch self {
            case .ifNoneMatch(let v), .ifModifiedSince(let v): return v
            }
        }
    }

    /// Request fields that make a request one the cache does not answer in this version
    /// (`Range` is answered by `CacheRange`, with its `If-Range`).
    public static let bypassingFields = ["if-match", "if-unmodified-since"]

    public static func decide(
        method: String, requestFields: [CacheFields.Field], candidates: [CacheStoredResponse],
        now: Int64, modification: CacheModification? = nil,
        outdated: Set<Int> = []
    ) -> Decision {
        guard method == "GET" || method == "HEAD" else { return .forward(.method) }
        if bypassingFields.contains(where: { CacheFields.value($0, in: requestFields) != nil }) { return .forward(.bypass) }
        let request = CacheRequestDirectives(requestFields).cacheControl
        if request.noStore { return .forward(.request) }
        guard !candidates.isEmpty else { return request.onlyIfCached ? .onlyIfCachedMiss : .forward(.uriMiss) }
        guard let index = select(candidates, requestFields) else {
            return request.onlyIfCached ? .onlyIfCachedMiss : .forward(.varyMiss)
        }
        let stored = candidates[index]
        let lifetime = CacheFreshness.lifetime(of: stored, modification: modification)
        let age = CacheFreshness.currentAge(of: stored, now: now)
        let fresh = lifetime > age
        let response = stored.cacheControl
        let ignored = modification?.ignoredDirectives ?? []

        var validate: ForwardReason?
        if response.noCache, !ignored.contains(.noCache) {
            validate = fresh ? .request : .stale
        }
        if request.noCache { validate = .request }
        if outdated.contains(index) { validate = .stale }
        if let maxAge = request.maxAge, age > maxAge { validate = .request }
        if let minFresh = request.minFresh, lifetime - age < minFresh { validate = .request }
        if validate == nil, !fresh {
            let mayServeStale = !(response.mustRevalidate || response.proxyRevalidate || response.sMaxAge != nil)
            let staleness = age - lifetime
            if mayServeStale, let maxStale = request.maxStale, staleness <= maxStale {
                validate = nil
            } else if mayServeStale, request.maxStale == nil, let window = response.staleWhileRevalidate, staleness <= window {
                return .serveStale(
                    Hit(
                        variant: index, age: age, ttl: lifetime - age,
                        notModified: CacheConditional.notModified(requestFields, stored: stored)),
                    conditional: validators(of: stored))
            } else {
                validate = .stale
            }
        }
        if let reason = validate {
            if request.onlyIfCached { return .onlyIfCachedMiss }
            return .revalidate(variant: index, conditional: validators(of: stored), reason: reason)
        }
        return .serve(
            Hit(
                variant: index, age: age, ttl: lifetime - age,
                notModified: CacheConditional.notModified(requestFields, stored: stored)))
    }

    /// The most recent (by `Date`, then arrival) stored response whose secondary key matches.
    static func select(_ candidates: [CacheStoredResponse], _ requestFields: [CacheFields.Field]) -> Int? {
        var best: Int?
        for (i, c) in candidates.enumerated() where c.varyMatches(requestFields) {
            if let b = best {
                let cb = candidates[b]
                let newer = (CacheFreshness.dateValue(c), c.responseTime) > (CacheFreshness.dateValue(cb), cb.responseTime)
                if newer { best = i }
            } else {
                best = i
            }
        }
        return best
    }

    /// `If-None-Match` with the stored `ETag`, `If-Modified-Since` with its `Last-Modified` (§4.3.1).
    public static func validators(of stored: CacheStoredResponse) -> [Validator] {
        var out: [Validator] = []
        if let etag = stored.etag { out.append(.ifNoneMatch(etag)) }
        if let lm = stored.lastModified { out.append(.ifModifiedSince(lm)) }
        return out
    }
}

extension CacheLookup {
    /// Whether `stored`, which the origin was asked to validate, may answer although the
    /// origin failed (a `500`, `502`, `503` or `504`, or no response): `stale-if-error`
    /// (RFC 5861 §4) in the request, else in the response, covers its staleness, and nothing
    /// forbids serving it stale (`must-revalidate`, `proxy-revalidate`, `s-maxage`, or an
    /// honoured `no-cache`; RFC 9111 §4.2.4).
    public static func mayServeStaleOnError(
        _ stored: CacheStoredResponse, requestFields: [CacheFields.Field], now: Int64,
        modification: CacheModification? = nil
    ) -> Bool {
        let response = stored.cacheControl
        if response.mustRevalidate || response.proxyRevalidate || response.sMaxAge != nil { return false }
        if response.noCache, !(modification?.ignoredDirectives.contains(.noCache) ?? false) { return false }
        let request = CacheRequestDirectives(requestFields).cacheControl
        guard let window = request.staleIfError ?? response.staleIfError else { return false }
        let staleness =
            CacheFreshness.currentAge(of: stored, now: now) - CacheFreshness.lifetime(of: stored, modification: modification)
        return staleness <= window
    }

    /// Whether `stored` may answer a request whose origin cannot be reached at all — its
    /// circuit is open (`health:`): RFC 9111 §4.2.4 lets a disconnected cache serve stale
    /// unless the response forbids it (`must-revalidate`, `proxy-revalidate`, `s-maxage`, an
    /// honoured `no-cache`) or the request asked for validation (`no-cache`, a `max-age` the
    /// response's age exceeds, `min-fresh` it does not meet) or bounds staleness (`max-stale`).
    public static func mayServeWhileDisconnected(
        _ stored: CacheStoredResponse, requestFields: [CacheFields.Field],
        now: Int64, modification: CacheModification? = nil
    ) -> Bool {
        let response = stored.cacheControl
        if response.mustRevalidate || response.proxyRevalidate || response.sMaxAge != nil { return false }
        if response.noCache, !(modification?.ignoredDirectives.contains(.noCache) ?? false) { return false }
        let request = CacheRequestDirectives(requestFields).cacheControl
        if request.noCache { return false }
        let age = CacheFreshness.currentAge(of: stored, now: now)
        let lifetime = CacheFreshness.lifetime(of: stored, modification: modification)
        if let maxAge = request.maxAge, age > maxAge { return false }
        if let minFresh = request.minFresh, lifetime - age < minFresh { return false }
        if let maxStale = request.maxStale, age - lifetime > maxStale { return false }
        return true
    }

    /// The statuses `stale-if-error` covers.
    public static let errorStatuses: Set<Int> = [500, 502, 503, 504]
}

/// A client's conditional `GET`/`HEAD` evaluated against a stored response (RFC 9110 §13.2.2,
/// RFC 9111 §4.3.2): `If-None-Match` (weak comparison; `*` matches any stored response)
/// decides when present; otherwise `If-Modified-Since` matches when the stored response's
/// `Last-Modified` (or, without one, its `Date`) is not later than the date given. A stored
/// response whose status is not 2xx never matches (RFC 9110 §13.2.1): it is sent as it is.
///
/// Threading: stateless; any thread.
public enum CacheConditional {
    public static func notModified(_ requestFields: [CacheFields.Field], stored: CacheStoredResponse) -> Bool {
        // RFC 9110 §13.2.1: preconditions are evaluated only when the stored status is 2xx.
        guard (200...299).contains(stored.status) else { return false }
        if let inm = CacheFields.combined("if-none-match", in: requestFields) {
            if CacheFields.trim(inm) == "*" { return true }
            guard let etag = stored.etag else { return false }
            return entityTags(inm).contains { weakEqual($0, etag) }
        }
        if let ims = CacheFields.value("if-modified-since", in: requestFields).flatMap(HTTPDate.parse) {
            guard let modified = stored.parsed.lastModified ?? stored.parsed.date else { return false }
            return modified <= ims
        }
        return false
    }

    /// Weak comparison (RFC 9110 §8.8.3.2): equal opaque-tags, `W/` ignored on either side.
    public static func weakEqual(_ a: String, _ b: String) -> Bool {
        func opaque(_ s: String) -> Substring {
            let t = Substring(CacheFields.trim(s))
            return t.hasPrefix("W/") ? t.dropFirst(2) : t
        }
        return opaque(a) == opaque(b)
    }

    /// The entity-tags of an `If-None-Match` list (commas inside quotes do not split).
    static func entityTags(_ value: String) -> [String] {
        var out: [String] = []
        var current = ""
        var quoted = false
        for c in value {
            if c == "\"" { quoted.toggle() }
            if c == ",", !quoted {
                out.append(CacheFields.trim(current))
                current = ""
            } else {
                current.append(c)
            }
        }
        out.append(CacheFields.trim(current))
        return out.filter { !$0.isEmpty }
    }
}
