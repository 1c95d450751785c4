/// How long a stored response is fresh and how old it is (RFC 9111 §4.2), for a shared
/// cache, with the policy's `modify` overrides applied. The clock is an argument (`now`,
/// wall-clock seconds), so the rules are tested without waiting.
///
/// Threading: stateless; any thread.
public enum CacheFreshness {
    /// Heuristic freshness is this fraction of the time since `Last-Modified` (10 %, the
    /// figure RFC 9111 §4.2.2 mentions) ...
    public static let heuristicPercent: Int64 = 10
    /// ... and never more than a day (`86400` s), so an old file is not kept for months on a guess.
    public static let heuristicCapSeconds: Int64 = 86_400
    /// Statuses whose responses may be given heuristic freshness (RFC 9110 §15.1).
    public static let heuristicallyCacheable: Set<Int> = [200, 203, 204, 206, 300, 301, 308, 404, 405, 410, 414, 501]

    /// The freshness lifetime (§4.2.1), first of: the policy's `freshness` override,
    /// `s-maxage`, `max-age`, `Expires` − `Date`, the heuristic (only for a heuristically
    /// cacheable status without explicit freshness); then capped by `max_freshness`.
    public static func lifetime(of response: CacheStoredResponse, modification: CacheModification? = nil) -> Int64 {
        let lifetime = explicitOrHeuristic(response, modification: modification)
        if let cap = modification?.maxFreshness { return min(lifetime, cap) }
        return lifetime
    }

    private static func explicitOrHeuristic(_ response: CacheStoredResponse, modification: CacheModification?) -> Int64 {
        if let forced = modification?.freshness { return forced }
        let cc = response.cacheControl
        if let s = cc.sMaxAge { return s }
        if let m = cc.maxAge { return m }
        let date = dateValue(response)
        if let expires = response.parsed.expires {
            // An invalid Expires (e.g. "0") means already expired (§5.3).
            guard let e = expires else { return 0 }
            return max(0, e - date)
        }
        guard heuristicallyCacheable.contains(response.status),
            let lm = response.parsed.lastModified, lm < date
        else { return 0 }
        return min((date - lm) * heuristicPercent / 100, heuristicCapSeconds)
    }

    /// Whether the lifetime came from the heuristic (no explicit freshness).
    public static func isHeuristic(_ response: CacheStoredResponse, modification: CacheModification? = nil) -> Bool {
        let cc = response.cacheControl
        return modification?.freshness == nil && cc.sMaxAge == nil && cc.maxAge == nil && response.parsed.expires == nil
    }

    /// `Date`, or the time the response arrived when it has none (RFC 9110 §6.6.1).
    static func dateValue(_ response: CacheStoredResponse) -> Int64 {
        response.parsed.date ?? response.responseTime
    }

    /// `current_age` (§4.2.3):
    /// `apparent_age = max(0, response_time − date_value)`,
    /// `corrected_age_value = age_value + (response_time − request_time)`,
    /// `corrected_initial_age = max(apparent_age, corrected_age_value)`,
    /// `current_age = corrected_initial_age + (now − response_time)`.
    public static func currentAge(of response: CacheStoredResponse, now: Int64) -> Int64 {
        let apparent = max(0, response.responseTime - dateValue(response))
        let ageValue = response.parsed.age ?? 0
        let corrected = ageValue + max(0, response.responseTime - response.requestTime)
        return max(apparent, corrected) + max(0, now - response.responseTime)
    }
}
